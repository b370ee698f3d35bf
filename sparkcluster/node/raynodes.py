"""Executor "ray": the Ray nodes that carry the running engine's ranks, and whether one is gone.

vLLM's Ray executor places one rank on each GPU of the deployment's nodes (the world is every GPU of
them: lint's `tp-pp-gpus`) and checks no rank's health: when a worker's container is killed and
replaced, or its Ray node dies, an idle engine does not know until a request reaches that rank. Ray
itself knows: its node table (the state API, `/api/v0/nodes`, read from the dashboard on the head's
loopback) marks the node DEAD.

So at each start the supervisor records, for every node, the node_id of the one live Ray node at its
control IP (`engine_nodes`). The start waits while an IP has two (`two_at_one_ip`: a replaced
container whose old node Ray has not declared dead yet, or a stray raylet, `waiting_on_two`) and
while the one there started before the node's agent did (`older_than_agent`: the previous
container's raylet, which Ray counts alive until its health check fails, while the new one has not
registered yet). While the engine runs the supervisor compares Ray's table with that record
(`node_lost`): a recorded node that Ray marks DEAD, or that is absent from a table Ray returned
whole, is gone, and a rank cannot rejoin a running engine: the verdict is "dead", restarted by the
supervisor's one restart path within its bounds. A second node live at a recorded node's IP while
the recorded one is still ALIVE is no verdict (`others_at_ip`): the supervisor journals it once and
leaves the engine alone. Were the node's container replaced, Ray declares the old node DEAD within
its health check; a stray raylet (an orphan worker container of a renamed cluster, a manual
`ray start` joining the head's GCS) takes nothing from the engine.

Measured against Ray 2.60.0 (tests/captured/ray-2.60/README.md): a worker whose processes are all
killed is DEAD about 13 s later ("health check failed due to missing too many heartbeats"); one that
is stopped (SIGTERM to `ray start`) is DEAD within a second ("Node received SIGTERM"); a new node
registering at the same IP does not retire the old one, which stays ALIVE until its health check
fails. Standard library only.
"""

from __future__ import annotations

import time

from .readings import live_at

ALIVE, DEAD = "ALIVE", "DEAD"
# Ray declares a replaced node DEAD within its health check (13-30 s measured); two live nodes at one
# IP for longer than this are no replacement in progress
STRAY_AFTER_S = 60.0
STRAY_FIX = (
    "find the other raylet with `docker ps` on {node} (an orphan worker container of a renamed "
    "cluster, a manual `ray start`) and stop it; `sparkcluster down --purge-gcs` removes a stale "
    "head's GCS"
)


def _short(node_id: str | None) -> str:
    return f"{node_id[:8]}…" if node_id else "?"


def _started(row: dict) -> float | None:
    """When Ray says the node's raylet started (NodeState's start_time_ms, read with `detail`), in
    seconds since the epoch by that node's clock; None where the row does not say."""
    ms = row.get("start_time_ms")
    return ms / 1000.0 if isinstance(ms, (int, float)) and not isinstance(ms, bool) and ms > 0 else None


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def two_at_one_ip(rows: list[dict], nodes: list[dict]) -> tuple[dict, list[dict]] | None:
    """Before a start: the first node with more than one live Ray node at its IP, and those rows;
    else None. Which of them an engine's rank would land on is unknown, so the start waits."""
    for want in nodes:
        live = live_at(rows, want["ip"])
        if len(live) > 1:
            return want, live
    return None


def waiting_on_two(want: dict, live: list[dict], waited_s: float, agents: dict[str, float]) -> str:
    """The start's wait while `live` (two_at_one_ip) are live at `want`'s IP, `waited_s` so far. At
    first a replaced node Ray has not declared dead yet is the likely cause; past STRAY_AFTER_S it is
    a stray raylet beside the node's own (a raylet Ray still counts alive after that long is
    heartbeating from somewhere): the cause names the node_ids, their starts where Ray gives them
    (and which started before the node's agent, `agents`: node -> its agent's start), and the fix."""
    head = f"{want['name']} has {len(live)} live Ray nodes at {want['ip']}"
    if waited_s < STRAY_AFTER_S:
        ids = ", ".join(_short(r.get("node_id")) for r in live)
        return f"{head} ({ids}): waiting for Ray to declare a replaced one dead (its health check)"
    since = agents.get(want["name"])
    named = []
    for r in live:
        t = _started(r)
        when = f"started {_when(t)}" if t is not None else "start unknown"
        if t is not None and since is not None and t < since:
            when += ", before the node's agent did"
        named.append(f"{r.get('node_id')} ({when})")
    return (
        f"{head} for {waited_s:.0f}s, longer than Ray takes to declare a replaced node dead: one of them is "
        f"a stray raylet beside the node's own: {' and '.join(named)}; " + STRAY_FIX.format(node=want["name"])
    )


def older_than_agent(rows: list[dict], nodes: list[dict], agents: dict[str, float]) -> str | None:
    """Before a start: the first node whose one live Ray node started before the node's agent did,
    as the start's wait; else None. Docker restarted that node's container, and its old raylet stays
    ALIVE in Ray's table until its health check fails (13-30 s) while the new one registers 5-24 s
    after the container's start: a start now would record the dead one and place a rank on it.
    `agents`: node -> when its agent started (memreport.node_report's `agent_started`), by the same
    node's clock as Ray's start_time_ms; a node whose agent or row does not say is not waited for."""
    for want in nodes:
        since = agents.get(want["name"])
        live = live_at(rows, want["ip"])
        t = _started(live[0]) if len(live) == 1 else None
        if since is not None and t is not None and t < since:
            return (
                f"{want['name']}'s live Ray node {_short(live[0].get('node_id'))} at {want['ip']} started at "
                f"{_when(t)}, {since - t:.1f}s before the node's agent did: the previous container's raylet, "
                "which Ray counts alive until its health check fails; waiting for the new one"
            )
    return None


def engine_nodes(rows: list[dict], nodes: list[dict]) -> dict[str, dict]:
    """At a start: {node name: {"ip", "node_id"}}, the one live Ray node at each node's IP (what the
    engine's ranks run on). A node with none is left out (the start waits for it first)."""
    out = {}
    for want in nodes:
        live = live_at(rows, want["ip"])
        if live and live[0].get("node_id"):
            out[want["name"]] = {"ip": want["ip"], "node_id": live[0]["node_id"]}
    return out


def node_lost(rows: list[dict], complete: bool, started: dict[str, dict]) -> dict:
    """While the engine runs: the first node whose Ray node from the start is gone, as the verdict's
    evidence {"cause", "node", "ip", "old_node_id", "new_node_id", "ray_state", "ray_says"}, else {}.
    Gone: DEAD in Ray's table, or absent from a table Ray returned whole (`complete`: its limit cut
    no row; read with the supervisor's filter it holds every live node, so a node absent from it is
    not ALIVE). A recorded node Ray lists ALIVE is not gone, whatever else is live at its IP
    (`others_at_ip`). `new_node_id`: a node live at its IP now (a replacement). No rows (no answer)
    judges nothing."""
    if not rows:
        return {}
    by_id = {r.get("node_id"): r for r in rows}
    for name, rec in sorted(started.items()):
        old, ip = rec["node_id"], rec["ip"]
        row = by_id.get(old)
        newer = [r.get("node_id") for r in live_at(rows, ip) if r.get("node_id") != old]
        new = newer[0] if newer else None
        where = f"{name} ({ip})"
        then = f"; a new Ray node {_short(new)} is live at that IP" if new else ""
        tail = ": the engine's rank there is gone and cannot rejoin it"
        if row is None:
            if not complete:
                continue  # left out by the limit: unknown, not gone
            state, says = "absent", None
            cause = f"{where}: Ray no longer lists the node {_short(old)} that carried a rank as alive{then}{tail}"
        elif row.get("state") == DEAD:
            state, says = DEAD, row.get("state_message")
            cause = (
                f"{where}: Ray marks the node {_short(old)} that carried a rank DEAD"
                + (f" ({says})" if says else "")
                + f"{then}{tail}"
            )
        else:
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


def others_at_ip(rows: list[dict], started: dict[str, dict]) -> list[dict]:
    """While the engine runs: every other Ray node live at a recorded node's IP while Ray lists the
    recorded one ALIVE, as {"node", "ip", "node_id", "other_node_id", "why", "fix"}: no verdict (the
    supervisor journals each once). A replacement's old node is declared DEAD by Ray within its
    health check (node_lost's verdict then); anything else is a stray raylet, which takes nothing
    from the engine."""
    out = []
    for name, rec in sorted(started.items()):
        old, ip = rec["node_id"], rec["ip"]
        live = live_at(rows, ip)
        if not any(r.get("node_id") == old for r in live):
            continue
        for r in live:
            other = r.get("node_id")
            if other and other != old:
                t = _started(r)
                out.append(
                    {
                        "node": name,
                        "ip": ip,
                        "node_id": old,
                        "other_node_id": other,
                        "why": (
                            f"{name} ({ip}): a second Ray node {_short(other)}"
                            + (f" (started {_when(t)})" if t is not None else "")
                            + f" is live at that IP beside {_short(old)}, which carries the engine's rank and "
                            "is ALIVE: the engine is left alone (were the node's container replaced, Ray "
                            f"would declare {_short(old)} DEAD within its health check)"
                        ),
                        "fix": STRAY_FIX.format(node=name),
                    }
                )
    return out
