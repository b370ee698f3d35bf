"""Executor "ray": the Ray nodes that carry the running engine's ranks, and whether one is gone.

vLLM's Ray executor places one rank on each GPU of the deployment's nodes (the world is every GPU of
them: lint's `tp-pp-gpus`) and checks no rank's health: when a worker's container is killed and
replaced, or its Ray node dies, an idle engine does not know until a request reaches that rank. Ray
itself knows: its node table (the state API, `/api/v0/nodes`, read from the dashboard on the head's
loopback) marks the node DEAD (a replaced container's new node_id at the same IP is named beside it).

So at each start the supervisor records, for every node, the node_id of the one live Ray node at its
control IP (`engine_nodes`; the start waits while an IP has two, `two_at_one_ip`), and while the
engine runs it compares Ray's table with that record (`node_lost`). A rank cannot rejoin a running
engine: the verdict is "dead", restarted by the supervisor's one restart path within its bounds.

Measured against Ray 2.60.0 (tests/captured/ray-2.60/README.md): a worker whose processes are all
killed is DEAD about 13 s later ("health check failed due to missing too many heartbeats"); one that
is stopped (SIGTERM to `ray start`) is DEAD within a second ("Node received SIGTERM"); a new node
registering at the same IP does not retire the old one, which stays ALIVE until its health check
fails. Standard library only.
"""

from __future__ import annotations

ALIVE, DEAD = "ALIVE", "DEAD"


def _short(node_id: str | None) -> str:
    return f"{node_id[:8]}…" if node_id else "?"


def _live_at(rows: list[dict], ip: str) -> list[dict]:
    return [r for r in rows if r.get("state") == ALIVE and r.get("node_ip") == ip]


def two_at_one_ip(rows: list[dict], nodes: list[dict]) -> str | None:
    """Before a start: what is ambiguous about Ray's table, else None. Two live Ray nodes at one
    node's IP (a replaced container whose old node Ray has not declared dead yet) leave unknown which
    of them the engine's rank would land on; Ray retires the old one within its health check."""
    for want in nodes:
        live = _live_at(rows, want["ip"])
        if len(live) > 1:
            ids = ", ".join(_short(r.get("node_id")) for r in live)
            return (
                f"{want['name']} has {len(live)} live Ray nodes at {want['ip']} ({ids}): "
                "a replaced node Ray has not declared dead yet, or a stray raylet joined the head's Ray "
                "(`docker ps` on that node; `sparkcluster down --purge-gcs` clears a stale head)"
            )
    return None


def engine_nodes(rows: list[dict], nodes: list[dict]) -> dict[str, dict]:
    """At a start: {node name: {"ip", "node_id"}}, the one live Ray node at each node's IP (what the
    engine's ranks run on). A node with none is left out (the start waits for it first)."""
    out = {}
    for want in nodes:
        live = _live_at(rows, want["ip"])
        if live and live[0].get("node_id"):
            out[want["name"]] = {"ip": want["ip"], "node_id": live[0]["node_id"]}
    return out


def node_lost(rows: list[dict], complete: bool, started: dict[str, dict]) -> dict:
    """While the engine runs: the first node whose Ray node from the start is gone, as the verdict's
    evidence {"cause", "node", "ip", "old_node_id", "new_node_id", "ray_state", "ray_says"}, else {}.
    Gone: DEAD in Ray's table, or absent from a table Ray returned whole (`complete`: no row left out
    by the request's limit). A new node_id live at its IP while the recorded one is still ALIVE is not
    gone: a replaced container's old node turns DEAD within Ray's health check (about 13 s), while a
    stray raylet (an orphan container, a manual `ray start`) would otherwise stop a healthy engine.
    No rows (no answer) judges nothing."""
    if not rows:
        return {}
    by_id = {r.get("node_id"): r for r in rows}
    for name, rec in sorted(started.items()):
        old, ip = rec["node_id"], rec["ip"]
        row = by_id.get(old)
        newer = [r.get("node_id") for r in _live_at(rows, ip) if r.get("node_id") != old]
        new = newer[0] if newer else None
        where = f"{name} ({ip})"
        then = f"; a new Ray node {_short(new)} is live at that IP" if new else ""
        tail = ": the engine's rank there is gone and cannot rejoin it"
        if row is None:
            if not complete:
                continue  # left out by the limit: unknown, not gone
            state, says = "absent", None
            cause = f"{where}: Ray no longer lists the node {_short(old)} that carried a rank{then}{tail}"
        elif row.get("state") == DEAD:
            state, says = DEAD, row.get("state_message")
            cause = (
                f"{where}: Ray marks the node {_short(old)} that carried a rank DEAD"
                + (f" ({says})" if says else "")
                + f"{then}{tail}"
            )
        else:  # ALIVE: a second live node at its IP may be a stray raylet, not a replacement
            continue
        return {
            "cause": cause,
            "node": name,
            "ip": ip,
            "old_node_id": old,
            "new_node_id": new,
            "ray_state": state,
            "ray_says": says,
        }
    return {}
