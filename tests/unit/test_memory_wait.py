"""Memory-safe restarts (issue 35 item 6): before any restart the supervisor waits, within a bound,
until every node's MemAvailable covers the engine again (doctor's `mem.headroom` arithmetic, one
function), journals "waiting for memory to come back" with what it saw, and gives up in a state of
its own when the bound is spent."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sparkcluster.checks import host
from sparkcluster.config import bounds
from sparkcluster.node import contract, memory_fit, readings, supervisor
from sparkcluster.node.journal import Journal
from sparkcluster.node.verdict import memory_for_restart, memory_wait

GiB = 2**30
CAPTURED = Path(__file__).parents[1] / "captured"
# the testbed profile's gpu_memory_utilization; a Spark's 121 GiB pool (MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark#259)
P = contract.Policy(memory_need_fraction=0.2, memory_wait_s=60.0)
TOTAL = 121 * GiB


def test_the_wait_and_doctor_share_one_reading():
    assert host.headroom is memory_fit.headroom  # mem.headroom's arithmetic, not a second copy
    text = (CAPTURED / "host-meminfo.txt").read_text()
    total, avail = readings.mem_total(text), readings.mem_available(text)
    need, left = memory_fit.headroom(total, avail, 0.5)
    assert need == int(0.5 * total) and left == avail - need
    assert memory_fit.headroom(total, avail, 0.5, running=True) == (0, avail)


def test_a_node_short_of_the_engine_plus_the_floor_is_not_covered_and_named():
    need = int(0.2 * TOTAL)  # 24.2 GiB
    covered, seen = memory_for_restart({"a": (TOTAL, need + 7 * GiB), "b": (TOTAL, need + 2 * GiB)}, P)
    assert not covered
    assert seen["a"].endswith("covered") and "4.0 GiB short" in seen["b"] and "MemAvailable 26.2 GiB" in seen["b"]
    covered, _ = memory_for_restart({"a": (TOTAL, need + 7 * GiB), "b": (TOTAL, need + 6 * GiB)}, P)
    assert covered


def test_unknown_memory_is_never_enough():
    covered, seen = memory_for_restart({"a": (TOTAL, 100 * GiB), "b": (None, None)}, P)
    assert not covered and seen["b"] == "memory unknown (no report)"


def test_the_wait_goes_on_within_its_bound_then_gives_up():
    assert memory_wait(None, 100.0, False, P) == "wait"
    assert memory_wait(100.0, 150.0, False, P) == "wait"
    assert memory_wait(100.0, 161.0, False, P) == "give-up"
    assert memory_wait(100.0, 161.0, True, P) == "go"


def test_the_profile_sets_the_bound_and_the_need():
    pol = bounds.policy(bounds.SupervisorSettings(memory_wait_s=90), 300, 0.75)
    assert (pol["memory_wait_s"], pol["memory_need_fraction"]) == (90, 0.75)


def _restarting(tmp_path, monkeypatch, memory):
    for name in ("SERVE_LOG", "RECORD_PATH", "STATE_PATH", "SECRETS_PATH", "DESIRED_PATH"):
        monkeypatch.setattr(supervisor, name, str(tmp_path / name.lower()))
    monkeypatch.chdir(tmp_path)
    desired = {
        "generation": "g1",
        "argv": [sys.executable, "-c", "import time; time.sleep(60)"],
        "model": "m",
        "port": 1,
        "policy": {"memory_need_fraction": 0.2, "memory_wait_s": 3600.0},
    }
    Path(supervisor.DESIRED_PATH).write_text(json.dumps(desired))
    sup = supervisor.Supervisor({"node": "spark-head", "nodes": [], "peers": []}, Journal(str(tmp_path / "journal")))
    sup.adopt(contract.Desired.of(desired))
    sup.generation, sup.first_start = "g1", False  # the engine was killed after serving: a restart
    if memory is not None:  # None: the real node_memory, which reads the peers' reports
        monkeypatch.setattr(sup, "node_memory", lambda: dict(memory))
    return sup, desired


def _events(tmp_path) -> list[dict]:
    return [json.loads(x) for x in (tmp_path / "journal").read_text().splitlines()]


def test_a_restart_waits_for_memory_and_starts_once_it_is_back(tmp_path, monkeypatch):
    need = int(0.2 * TOTAL)
    memory = {"spark-head": (TOTAL, need + 20 * GiB), "spark-worker": (TOTAL, need + 1 * GiB)}
    sup, _ = _restarting(tmp_path, monkeypatch, memory)
    try:
        sup.tick()
        sup.tick()
        assert sup.proc is None and sup.state == contract.MEMORY_WAIT
        waiting = [e for e in _events(tmp_path) if e["event"] == "waiting for memory to come back"]
        assert len(waiting) == 1  # journalled when the wait starts, not every look
        assert "5.0 GiB short" in waiting[0]["seen"]["spark-worker"] and waiting[0]["bound_s"] == 3600.0
        memory["spark-worker"] = (TOTAL, need + 8 * GiB)
        sup.tick()
        assert sup.proc is not None and sup.state == contract.STARTING
        names = [e["event"] for e in _events(tmp_path)]
        assert names.index("memory came back") < names.index("vllm serve started")
    finally:
        sup.stop("test")


def test_memory_that_never_comes_back_gives_up_with_a_clear_state(tmp_path, monkeypatch):
    need = int(0.2 * TOTAL)
    sup, desired = _restarting(tmp_path, monkeypatch, {"spark-head": (TOTAL, need)})
    desired["policy"]["memory_wait_s"] = 0.0
    Path(supervisor.DESIRED_PATH).write_text(json.dumps(desired))
    sup.tick()  # the wait starts
    sup.tick()  # the bound (0 s) is spent
    assert sup.proc is None and sup.state == contract.NO_MEMORY
    state = json.loads(Path(supervisor.STATE_PATH).read_text())
    assert state["state"] == "stopped: memory did not come back"
    assert state["causes"][-1]["cause"].startswith("memory did not come back within 0s: spark-head: MemAvailable")
    sup.tick()  # final: nothing is started again until `up`
    assert sup.proc is None and sup.state == contract.NO_MEMORY
    from sparkcluster.status import status

    said = status._state_problem(contract.Supervised.of(state))
    assert (
        said.startswith("supervisor: vllm serve not restarted: memory did not come back") and "sparkcluster up" in said
    )


def test_the_first_start_up_asked_for_does_not_wait(tmp_path, monkeypatch):
    sup, _ = _restarting(tmp_path, monkeypatch, {"spark-head": (TOTAL, 0)})
    sup.first_start = True  # `up`'s own start: preflight's mem.headroom judged it already
    try:
        sup.tick()
        assert sup.proc is not None
    finally:
        sup.stop("test")


def test_each_nodes_report_carries_the_pool_size_the_wait_needs(monkeypatch):
    from sparkcluster.node import memreport

    class Ray:
        def poll(self):
            return None

    text = (CAPTURED / "host-meminfo.txt").read_text()
    real_open = open
    monkeypatch.setattr(
        "builtins.open",
        lambda path, *a, **kw: (
            __import__("io").StringIO(text) if path == "/proc/meminfo" else real_open(path, *a, **kw)
        ),
    )
    got = memreport.node_report("spark-worker", Ray(), 1795769600.5)
    assert got["mem_total"] == readings.mem_total(text) and got["mem_available"] == readings.mem_available(text)
    assert got["agent_started"] == 1795769600.5  # a Ray node at its IP older than this is not its container's


def test_up_and_the_serve_stage_read_the_servers_bounds_in_one_place():
    """`up` tells "already serving" by comparing the running server's policy with the profile's;
    the serve stage writes it. Both read bounds.profile_policy (the memory wait's fraction once
    left `up`'s copy out, so every `up` on a serving cluster restarted the engine)."""
    import pathlib

    from sparkcluster.config import bounds

    root = pathlib.Path(bounds.__file__).parent.parent
    callers = [p for p in root.rglob("*.py") if "bounds.policy(" in p.read_text()]
    assert callers == []
    used = [p.name for p in root.rglob("*.py") if "bounds.profile_policy(" in p.read_text()]
    assert sorted(used) == ["bringup.py", "serve.py"]


def test_a_restart_tick_reads_each_peer_once(tmp_path, monkeypatch):
    """The memory wait and the start's readiness both need a peer's report: one read per tick, so a
    peer that does not answer costs its timeout once per look, not once per reader."""
    sup, _ = _restarting(tmp_path, monkeypatch, None)
    sup.cfg.update(executor="mp", report_port=8297, peers=[{"name": "spark-worker", "ip": "198.19.2.2"}])
    sup.mp = True
    reads = []

    def peer_memory(ip, port, timeout=1.0, seen=None):
        reads.append(ip)
        seen["report"] = {"mem_total": TOTAL, "rank": {"generation": "an earlier one"}}
        return TOTAL, ""

    monkeypatch.setattr(supervisor, "peer_memory", peer_memory)
    monkeypatch.setattr(supervisor, "memory_for_restart", lambda memory, policy: (True, {}))
    sup.tick()
    assert sup.state == contract.WAITING and reads == ["198.19.2.2"]
    sup.tick()
    assert reads == ["198.19.2.2"] * 2
    assert sup.low_memory(P) == {} and len(reads) == 3  # outside a tick: read each time it is asked
