"""Taking a cluster down: stop `vllm serve` by its PID, then remove sparkcluster's containers
(found by label, never by a broad name), workers before the head. Shared by `down` and by `up`'s
rollback after a failure or Ctrl-C.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from . import log, serve
from .fanout import Cluster
from .labels import CLUSTER_LABEL, ROLE_LABEL
from .ssh import Host

_log = log.get(__name__)
STOP_GRACE_S = 30.0  # vLLM drains in-flight requests on SIGTERM; model teardown takes seconds


@dataclass
class NodeOutcome:
    node: str
    removed: list[str] = field(default_factory=list)
    server: str = ""  # what happened to vllm serve, on the head
    error: str = ""


def ours(host: Host, cluster: str) -> list[dict]:
    api = host.docker().api
    return api.containers(all=True, filters={"label": f"{CLUSTER_LABEL}={cluster}"})


def kill_command(pid: int, grace: float) -> str:
    """TERM, wait up to `grace` seconds, then KILL. `docker exec` forwards no signals, so the PID."""
    p = int(pid)
    return (f"kill -TERM {p} 2>/dev/null || exit 0; i=0; while kill -0 {p} 2>/dev/null; do "
            f"i=$((i+1)); [ $i -gt {int(grace * 10)} ] && {{ kill -KILL {p}; echo killed; exit 0; }}; sleep 0.1; done; echo stopped")


def stop_server(host: Host, container: str, grace: float = STOP_GRACE_S) -> str:
    api = host.docker().api
    try:
        info = api.inspect_container(container)
    except Exception:  # gone already
        return "no container"
    if not info.get("State", {}).get("Running"):
        return "container not running"
    rec = serve.read_record(api, container)
    if rec is None or not rec.pid:
        return "no server recorded"
    if not serve.running(api, rec):
        return "server not running"
    res = host.run(kill_command(rec.pid, grace), timeout=grace + 15)
    what = res.stdout.strip() or res.tail(1)
    _log.info("vllm serve stopped", host=host.name, pid=rec.pid, how=what)
    return f"vllm serve (pid {rec.pid}) {what}"


def remove_containers(host: Host, cluster: str, only: set[str] | None = None) -> list[str]:
    api = host.docker().api
    removed = []
    for c in ours(host, cluster):
        if only is not None and c["Id"] not in only:
            continue
        api.remove_container(c["Id"], force=True)
        removed.append(c["Names"][0].lstrip("/"))
    return removed


def purge_gcs_command(ray_port: int) -> str:
    """Ray session dirs left on the host, then who (if anyone) still holds the GCS port."""
    return ("rm -rf /tmp/ray/session_* /tmp/ray/session_latest 2>/dev/null; "
            f"ss -Htlnp {shlex.quote(f'( sport = :{int(ray_port)} )')}")


def down(cluster: Cluster, only_ids: dict[str, set[str]] | None = None, purge_gcs: bool = False) -> dict[str, NodeOutcome]:
    """Stop the server, then remove containers on every reachable node: workers first, then head."""
    inv = cluster.inventory
    name = inv.cluster.name
    out = {h: NodeOutcome(h) for h in cluster.hosts}
    head = cluster.hosts.get(inv.head.name)
    if head is not None:
        try:
            heads = [c for c in ours(head, name) if c.get("Labels", {}).get(ROLE_LABEL) == "head"]
            if heads and (only_ids is None or heads[0]["Id"] in only_ids.get(head.name, set())):
                out[head.name].server = stop_server(head, heads[0]["Id"])
        except Exception as e:  # keep going: the containers still have to go
            out[head.name].error = f"stopping vllm serve: {e}"

    def remove(host: Host) -> list[str]:
        return remove_containers(host, name, None if only_ids is None else only_ids.get(host.name, set()))

    for group in (cluster.workers, [head] if head is not None else []):
        for node, o in cluster.each(remove, group).items():
            if o.ok:
                out[node].removed = o.value
            else:
                out[node].error = (out[node].error + "; " if out[node].error else "") + str(o.error)
    if purge_gcs:
        for node, o in cluster.each(lambda h: h.run(purge_gcs_command(inv.cluster.ray_port), timeout=20)).items():
            if not o.ok:
                out[node].error = str(o.error)
            elif o.value.stdout.strip():
                out[node].error = f"port {inv.cluster.ray_port} is still held: {o.value.stdout.strip()}"
    return out
