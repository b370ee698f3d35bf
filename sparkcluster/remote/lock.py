"""The cluster lock: one `up` or `down` at a time per cluster.

Held by a `flock` on each node whose child waits on its stdin, which is our SSH channel: when this
process ends, or its connection drops, the channel closes and the lock is released. No stale lock
survives a killed controller; a second run fails at once and names the holder.

Where: a directory in /tmp/sparkcluster, because the SSH user is an ordinary account (on a Spark,
never root) and two different accounts of the same cluster must still exclude each other. /tmp is
the one directory every account may create in on every Linux, and it is per host. The lock is a
directory, not a file: flock(1) opens its target with O_CREAT, which `fs.protected_regular` (on by
default under systemd, so on DGX OS) refuses for another account's regular file in a sticky
world-writable directory; a directory is opened read-only, by anyone. /tmp/sparkcluster is made
sticky and world-writable (mode 1777) by whoever comes first; each account writes its own holder
file (`NAME.holder.UID`: no account may replace another's there), and the newest one names the holder.
Not Docker (a named container as the lock, which every member of `docker` would see): it needs an
image on the node before `up` has built or pulled one, and a container outlives a killed client.
A local account outside `docker` could hold the lock too: it can make a run wait, nothing more.
"""

from __future__ import annotations

import getpass
import os
import re
import shlex
import socket
import time

from sparkcluster.errors import LockHeld, SparkError
from sparkcluster.remote.ssh import Host, RemoteProcess

LOCK_DIR = "/tmp/sparkcluster"
BUSY = 75


def lock_path(cluster: str) -> str:
    return f"{LOCK_DIR}/{cluster}.lock"


def holder_text(command: str) -> str:
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return f"{getpass.getuser()}@{socket.gethostname()} pid {os.getpid()} since {when} ({command})"


def lock_command(cluster: str, holder: str) -> str:
    d, lock = shlex.quote(LOCK_DIR), shlex.quote(lock_path(cluster))
    who = shlex.quote(f"{LOCK_DIR}/{cluster}.holder.")
    # the holder file is best effort (a directory another tool made unwritable still locks)
    inner = (
        f'w={who}$(id -u); {{ printf \'%s\\n\' "$1" > "$w.part" && mv -f "$w.part" "$w"; }} 2>/dev/null; '
        "echo '@@locked' >&2; exec cat >/dev/null"
    )
    newest = f"$(cat \"$(ls -t {who}* 2>/dev/null | grep -v '[.]part$' | head -1)\" 2>/dev/null)"
    return (
        f"{{ [ -d {d} ] || {{ mkdir -m 1777 {d} 2>/dev/null || [ -d {d} ]; }}; }} "
        f"&& {{ [ -d {lock} ] || mkdir {lock} 2>/dev/null || [ -d {lock} ]; }} "
        f"&& flock -n -E {BUSY} {lock} sh -c {shlex.quote(inner)} sh {shlex.quote(holder)}"
        f' || {{ rc=$?; [ $rc -eq {BUSY} ] && echo "@@held {newest}" >&2; exit $rc; }}'
    )


def held_fix(holder: str, host: str) -> str:
    """What to do about a held lock. A holder that ran here and has ended (its pid gone) left an SSH
    session open on the node: after a cable is pulled, the node's sshd keeps it until the controller's
    close reaches it once the link is back (TCP retransmits), so waiting is still the fix, said so."""
    m = re.match(r"(\S+)@(\S+) pid (\d+) ", holder)
    if m and m[1] == getpass.getuser() and m[2] == socket.gethostname() and not _alive(int(m[3])):
        return (
            f"that run has ended (pid {m[3]} is gone here) but its SSH session on {host} is still open; "
            f"it closes once {host} hears the connection end (after a cable is back, within minutes): "
            "run the command again then"
        )
    return "wait for that run to finish (the lock goes with its SSH connection)"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ClusterLock:
    def __init__(self, head: Host, cluster: str, command: str):
        self.head, self.cluster, self.command = head, cluster, command
        self._proc: RemoteProcess | None = None

    def __enter__(self) -> ClusterLock:
        proc = self.head.start(lock_command(self.cluster, holder_text(self.command)), timeout=7 * 24 * 3600)
        for line in proc.stderr_lines():
            if line.startswith("@@locked"):
                self._proc = proc
                return self
            if line.startswith("@@held"):
                proc.close()
                holder = line[len("@@held ") :].strip()
                raise LockHeld(
                    f"cluster '{self.cluster}' is locked by {holder or 'another run'} (on {self.head.name})",
                    held_fix(holder, self.head.name),
                )
        res = proc.wait()
        raise SparkError(
            f"{self.head.name}: could not take the cluster lock: {res.tail(3) or f'exit {res.exit_code}'}",
            f"check that flock exists and {LOCK_DIR} is writable on {self.head.name}",
        )

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

    def __enter__(self) -> NodeLocks:
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
