"""The cluster lock: one `up` or `down` at a time per cluster.

Held by a `flock` on the head whose child waits on its stdin, which is our SSH channel: when this
process ends, or its connection drops, the channel closes and the lock is released. No stale lock
survives a killed controller; a second run fails at once and names the holder.
"""

from __future__ import annotations

import getpass
import os
import shlex
import socket
import time

from sparkcluster.errors import LockHeld, SparkError
from sparkcluster.remote.ssh import Host, RemoteProcess

LOCK_DIR = "/run/sparkcluster"
BUSY = 75


def holder_text(command: str) -> str:
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return f"{getpass.getuser()}@{socket.gethostname()} pid {os.getpid()} since {when} ({command})"


def lock_command(cluster: str, holder: str) -> str:
    lock = f"{LOCK_DIR}/{cluster}.lock"
    who = f"{LOCK_DIR}/{cluster}.holder"
    inner = f"printf '%s\\n' \"$1\" > {shlex.quote(who)}; echo '@@locked' >&2; exec cat >/dev/null"
    return (f"mkdir -p {LOCK_DIR} && flock -n -E {BUSY} {shlex.quote(lock)} sh -c {shlex.quote(inner)} sh {shlex.quote(holder)}"
            f" || {{ rc=$?; [ $rc -eq {BUSY} ] && echo \"@@held $(cat {shlex.quote(who)} 2>/dev/null)\" >&2; exit $rc; }}")


class ClusterLock:
    def __init__(self, head: Host, cluster: str, command: str):
        self.head, self.cluster, self.command = head, cluster, command
        self._proc: RemoteProcess | None = None

    def __enter__(self) -> "ClusterLock":
        proc = self.head.start(lock_command(self.cluster, holder_text(self.command)), timeout=7 * 24 * 3600)
        for line in proc.stderr_lines():
            if line.startswith("@@locked"):
                self._proc = proc
                return self
            if line.startswith("@@held"):
                proc.close()
                raise LockHeld(f"cluster '{self.cluster}' is locked by {line[len('@@held '):].strip() or 'another run'} "
                               f"(on {self.head.name})",
                               "wait for that run to finish (the lock goes with its SSH connection)")
        res = proc.wait()
        raise SparkError(f"{self.head.name}: could not take the cluster lock: {res.tail(3) or f'exit {res.exit_code}'}",
                         f"check that flock exists and {LOCK_DIR} is writable on {self.head.name}")

    def __exit__(self, *exc) -> None:
        if self._proc is not None:
            self._proc.close()
            self._proc = None


class NodeLocks:
    """The lock on every node a run touches, taken in inventory order (so two runs never wait on
    each other in a circle; a held one fails at once): two single-node deployments on different
    nodes can be brought up at the same time, and nothing else runs on a node while one is."""

    def __init__(self, cluster, inv, command: str):
        self.locks = [ClusterLock(cluster.hosts[n.name], inv.cluster.name, command) for n in inv.nodes]
        self._taken: list[ClusterLock] = []

    def __enter__(self) -> "NodeLocks":
        try:
            for lock in self.locks:
                self._taken.append(lock.__enter__())
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        while self._taken:
            self._taken.pop().__exit__()
