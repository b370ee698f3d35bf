"""Taking a cluster down: stop `vllm serve` by its PID, then remove sparkcluster's containers
(found by label, never by a broad name), workers before the head. Shared by `down`, by `up`'s
steps that remove one container, and by `up`'s rollback after a failure or Ctrl-C.

What happened on each node is a value (`NodeTeardown`, `ServerStop`), never a string to compare.
"""

from __future__ import annotations

import enum
import shlex
import time
from dataclasses import dataclass, field

import docker.errors

from sparkcluster import log
from sparkcluster.deployment import compile_caches, server
from sparkcluster.errors import SparkError
from sparkcluster.facts.parsers import container_inspect
from sparkcluster.labels import CLUSTER_LABEL, ROLE_LABEL, SERVER_ROLE, SERVICE_ROLE, is_gateway
from sparkcluster.node import readings
from sparkcluster.remote.dockerapi import run_in
from sparkcluster.remote.fanout import ConnectedHosts
from sparkcluster.remote.ssh import Host

_log = log.get(__name__)
STOP_GRACE_S = 30.0  # vLLM drains in-flight requests on SIGTERM; model teardown takes seconds


class Stop(enum.Enum):
    NO_CONTAINER = "no container"
    CONTAINER_NOT_RUNNING = "container not running"
    NO_RECORD = "no server recorded"
    NOT_RUNNING = "server not running"
    STOPPED = "stopped"


@dataclass(frozen=True)
class ServerStop:
    """What became of `vllm serve`: only STOPPED means a running server was ended by this call."""

    how: Stop
    pid: int | None = None
    detail: str = ""  # "stopped" or "killed", as the kill command reported it

    @property
    def stopped(self) -> bool:
        return self.how is Stop.STOPPED

    def __str__(self) -> str:
        return f"vllm serve (pid {self.pid}) {self.detail}" if self.stopped else self.how.value


@dataclass
class NodeTeardown:
    node: str
    removed: list[str] = field(default_factory=list)
    server: ServerStop | None = None  # on the head only
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors


def ours(host: Host, cluster: str) -> list[dict]:
    api = host.docker().api
    return api.containers(all=True, filters={"label": f"{CLUSTER_LABEL}={cluster}"})


def kill_command(pid: int, grace: float) -> str:
    """TERM, wait up to `grace` seconds, then KILL (run inside the container: the PID is its own)."""
    p = int(pid)
    return (
        f"kill -TERM {p} 2>/dev/null || exit 0; i=0; while kill -0 {p} 2>/dev/null; do "
        f"i=$((i+1)); [ $i -gt {int(grace * 10)} ] && {{ kill -KILL {p}; echo killed; exit 0; }}; "
        "sleep 0.1; done; echo stopped"
    )


def stop_server(host: Host, container: str, grace: float = STOP_GRACE_S) -> ServerStop:
    """Tell the supervisor no server is wanted (so nothing brings it back), let it stop the
    recorded server, and stop it by PID ourselves when it has not within the grace."""
    api = host.docker().api
    try:
        info = container_inspect(api.inspect_container(container))
    except docker.errors.NotFound:  # gone already
        return ServerStop(Stop.NO_CONTAINER)
    if not info.running:
        return ServerStop(Stop.CONTAINER_NOT_RUNNING)
    rec = server.read_record(api, container)
    server.disable(api, container)
    if rec is None or not rec.pid:
        return ServerStop(Stop.NO_RECORD)
    if not server.running(api, rec):
        return ServerStop(Stop.NOT_RUNNING, rec.pid)
    deadline = time.monotonic() + grace + 5  # the supervisor looks every few seconds, then TERM
    while time.monotonic() < deadline and server.running(api, rec):
        time.sleep(0.5)
    how = "stopped"
    if server.running(api, rec):
        how = run_in(api, container, ["sh", "-c", kill_command(rec.pid, 5.0)]).stdout.strip() or "killed"
    _log.info("vllm serve stopped", host=host.name, pid=rec.pid, how=how)
    return ServerStop(Stop.STOPPED, rec.pid, how)


def remove_container(host: Host, cid: str) -> bool:
    """Remove one container by ID (force: it may run). False when it was already gone."""
    try:
        host.docker().api.remove_container(cid, force=True)
    except docker.errors.NotFound:
        return False
    return True


def remove_containers(host: Host, cluster: str, only: set[str] | None = None, gateway: bool = False) -> list[str]:
    """Our containers on the host (or those of `only`); the gateway's only when `gateway`: taking one
    deployment down leaves the gateway routing the others."""
    removed = []
    for c in ours(host, cluster):
        if only is not None and c["Id"] not in only:
            continue
        if not gateway and is_gateway(c.get("Labels")):
            continue
        if remove_container(host, c["Id"]):
            removed.append(c["Names"][0].lstrip("/"))
    return removed


# vLLM's processes create multiprocessing shared-memory segments (24-240 MB each) in /dev/shm; the
# containers run with --ipc host, so what a stopped engine leaves there outlives its container and
# holds memory until the host reboots. Only the names our own containers' processes map or hold
# open are ever removed: another program's segments on the host are not ours to judge.
SHM_SEGMENTS = (
    "cat /proc/[0-9]*/maps 2>/dev/null | grep -o '/dev/shm/psm_[0-9a-zA-Z_]*'; "
    "ls -l /proc/[0-9]*/fd 2>/dev/null | grep -o '/dev/shm/psm_[0-9a-zA-Z_]*'; true"
)
_SHM_NAME = readings.SHM_SEGMENT


def shm_segments(host: Host, cid: str) -> list[str]:
    """The shared-memory segments the processes of one of our containers use now."""
    out = run_in(host.docker().api, cid, ["sh", "-c", SHM_SEGMENTS]).stdout
    return sorted({line.strip() for line in out.splitlines() if _SHM_NAME.fullmatch(line.strip())})


def remove_shm_command(names: list[str]) -> list[str]:
    """argv removing the given segments (names checked: only /dev/shm/psm_* ever)."""
    bad = [n for n in names if not _SHM_NAME.fullmatch(n)]
    if bad:
        raise ValueError(f"not a shared-memory segment of ours: {bad[0]!r}")
    return ["rm", "-f", "--", *names]


def remove_shm(host: Host, cid: str, names: list[str]) -> None:
    if names:
        run_in(host.docker().api, cid, remove_shm_command(names))


def purge_gcs_command(ray_port: int) -> str:
    """Ray session dirs left on the host, then who (if anyone) still holds the GCS port."""
    return (
        "rm -rf /tmp/ray/session_* /tmp/ray/session_latest 2>/dev/null; "
        f"ss -Htlnp {shlex.quote(f'( sport = :{int(ray_port)} )')}"
    )


def _segments_in_use(
    cluster: ConnectedHosts, name: str, only_ids: dict[str, set[str]] | None
) -> dict[str, dict[str, list[str]]]:
    """node -> container ID -> the /dev/shm segments its processes use, read before the server stops."""

    def read(host: Host) -> dict[str, list[str]]:
        out = {}
        for c in ours(host, name):
            if c.get("Labels", {}).get(ROLE_LABEL) in (SERVICE_ROLE, SERVER_ROLE):
                continue  # no rank's segments there; a service's image may have no shell to ask with
            if c.get("State") == "running" and (only_ids is None or c["Id"] in only_ids.get(host.name, set())):
                out[c["Id"]] = shm_segments(host, c["Id"])
        return out

    return {node: o.value for node, o in cluster.each(read).items() if o.ok}


def down(
    cluster: ConnectedHosts, only_ids: dict[str, set[str]] | None = None, purge_gcs: bool = False, gateway: bool = False
) -> dict[str, NodeTeardown]:
    """Stop the server, then remove containers on every reachable node: workers first, then head;
    the gateway's too when `gateway` (`down` of everything)."""
    inv = cluster.inventory
    name = inv.cluster.name
    out = {h: NodeTeardown(h) for h in cluster.hosts}
    head = cluster.hosts.get(inv.head.name)
    segments = _segments_in_use(cluster, name, only_ids)
    if head is not None:
        try:
            # the deployment's own head: several deployments may share the node (issue 60)
            heads = [
                c
                for c in ours(head, name)
                if c.get("Labels", {}).get(ROLE_LABEL) == "head"
                and (only_ids is None or c["Id"] in only_ids.get(head.name, set()))
            ]
            if heads:
                out[head.name].server = stop_server(head, heads[0]["Id"])
        except (SparkError, docker.errors.APIError) as e:  # keep going: the containers still have to go
            out[head.name].errors.append(f"stopping vllm serve: {e}")

    def remove(host: Host) -> list[str]:
        for cid, names in segments.get(host.name, {}).items():
            try:  # the engine is stopped: what it left in /dev/shm goes while its container still runs
                remove_shm(host, cid, names)
            except (docker.errors.APIError, SparkError) as e:
                _log.warning("could not remove shared-memory segments", host=host.name, error=str(e))
        return remove_containers(host, name, None if only_ids is None else only_ids.get(host.name, set()), gateway)

    for group in (cluster.workers, [head] if head is not None else []):
        for node, o in cluster.each(remove, group).items():
            if o.ok:
                out[node].removed = o.value
            else:
                out[node].errors.append(str(o.error))
    if purge_gcs:
        # the port check is the command's output, not its status: read it whatever the exit
        for node, o in cluster.each(
            lambda h: h.run(purge_gcs_command(inv.cluster.ray_port), timeout=20, warn=True)
        ).items():
            if not o.ok:
                out[node].errors = [str(o.error)]
            elif o.value.stdout.strip():
                out[node].errors = [f"port {inv.cluster.ray_port} is still held: {o.value.stdout.strip()}"]
    return out


def purge_caches(cluster: ConnectedHosts) -> dict[str, tuple[list[str], list[str]]]:
    """`down --purge-caches`: every compile cache on each node (config/compile_cache), removed as
    the SSH user once the containers are gone (the SSH user's home learnt first: the caches' `~`).
    node -> (what went, what could not)."""
    inv = cluster.inventory
    out: dict[str, tuple[list[str], list[str]]] = {}
    for node, o in cluster.each(
        lambda h: h.run(compile_caches.purge_command(inv.compile_cache(h.name)), timeout=600, warn=True)
    ).items():
        if not o.ok:
            out[node] = ([], [f"purging the compile caches: {o.error}"])
            continue
        try:
            got = compile_caches.parse_result(o.value.stdout)
        except (ValueError, IndexError, KeyError):
            out[node] = ([], [f"purging the compile caches: {o.value.tail(1) or f'exit {o.value.exit_code}'}"])
            continue
        removed = [f"compile cache {r['key']} ({r['bytes'] / 2**30:.2f} GiB)" for r in got["removed"]]
        errors = [f"compile cache not removed: {e} (files of another user: sudo rm -rf it)" for e in got["errors"]]
        out[node] = (removed, errors)
    return out
