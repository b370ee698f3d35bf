"""The fabric watched while serving (issue 75): each node's ports, GID, speed and AER judged
(node/fabric_watch, over a sysfs tree shaped as the mlx5 driver's: Documentation/ABI/stable/
sysfs-class-infiniband, the values the testbed's fake HCAs hold), the head's hold (out of rotation,
engine left running) and its end after healthy looks or `fabric resume`, and the one availability
judgement the gateway and `status` share."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import make_inventory

from sparkcluster.cli import main as cli_main
from sparkcluster.deployment import fabric_resume
from sparkcluster.errors import InputError
from sparkcluster.node import contract, supervisor
from sparkcluster.node.fabric_watch import AER_STORM, FabricWatch, judge, rate_gbps
from sparkcluster.status import status as status_mod
from sparkcluster.steps import walk
from tests.unit.test_supervisor_probe import _journal, _probes, rig  # noqa: F401 - the fixture

GID = "0000:0000:0000:0000:0000:ffff:c0a8:6414"  # a RoCE v2 IPv4-mapped GID (testbed/cabling.mapped_gid's shape)
ZERO = "0000:0000:0000:0000:0000:0000:0000:0000"


def hca(root: Path, name: str, state="4: ACTIVE", rate="200 Gb/sec (2X NDR)", gid=GID) -> None:
    port = root / name / "ports" / "1"
    (port / "gids").mkdir(parents=True, exist_ok=True)
    (port / "state").write_text(state + "\n")
    (port / "rate").write_text(rate + "\n")
    (port / "gids" / "3").write_text(gid + "\n")


def aer(fatal=0, correctable=0) -> dict:
    return {"/sys/x": {"hca": "rocep1s0f1", "role": "function", "pci": "0000:01:00.1", "fatal": fatal, "nonfatal": 0,
                       "correctable": correctable}}  # fmt: skip


def test_port_down_gid_lost_speed_dropped_and_aer_storm_are_each_named(tmp_path):
    counters = {"now": aer()}
    hca(tmp_path, "rocep1s0f1")
    w = FabricWatch(["rocep1s0f1"], 3, root=str(tmp_path), aer_read=lambda: counters["now"])
    assert w.look() == {"ok": True, "problems": [], "ports": w.last["ports"]}
    hca(tmp_path, "rocep1s0f1", state="1: DOWN")
    assert w.look()["problems"] == ["rocep1s0f1: port 1 is 1: DOWN"]
    hca(tmp_path, "rocep1s0f1", gid=ZERO)
    assert w.look()["problems"] == ["rocep1s0f1: GID index 3 is empty (its address is gone)"]
    hca(tmp_path, "rocep1s0f1", rate="100 Gb/sec (2X HDR)")
    assert w.look()["problems"] == ["rocep1s0f1: speed dropped from 200 to 100 Gb/s"]
    hca(tmp_path, "rocep1s0f1")
    counters["now"] = aer(correctable=AER_STORM)
    assert w.look()["problems"] == [f"AER storm: {AER_STORM} correctable PCIe errors since the last read"]
    counters["now"] = aer(fatal=1, correctable=AER_STORM + 1)
    assert w.look()["problems"] == ["AER: fatal PCIe error(s) on rocep1s0f1 (function 0000:01:00.1)"]
    assert w.look()["ok"] is True  # the same counts again: healthy
    assert judge({"gone": {"state": None}}, {}, None, {}) == ["gone: port 1 is gone (no state in sysfs)"]
    assert rate_gbps("200 Gb/sec (2X NDR)") == 200.0 and rate_gbps(None) is None


def with_policy(**bounds) -> None:
    """The desired state `up` wrote, with these bounds over the testbed profile's."""
    doc = json.loads(Path(supervisor.DESIRED_PATH).read_text())
    doc["policy"] = {**doc["policy"], **bounds}
    Path(supervisor.DESIRED_PATH).write_text(json.dumps(doc))


def held(rig, monkeypatch, problems_by_look):  # noqa: F811
    """Looks of a serving supervisor whose worker reports each of `problems_by_look` in turn."""
    _probes(monkeypatch)
    sup, clock, engine = rig.sup, rig.clock, rig.engine
    sup.cfg["peers"] = [{"name": "spark-worker", "ip": "10.0.0.2"}]
    worker: dict = {}
    monkeypatch.setattr(sup, "low_memory", lambda policy: sup.reports.update({"spark-worker": worker}) or {})
    states = []
    for problems in problems_by_look:
        worker["fabric_health"] = {"ok": not problems, "problems": problems}
        engine.generated += 10
        sup.tick()
        doc = json.loads(Path(rig.tmp / "state_path").read_text())
        states.append(contract.Supervised.of(doc).availability(0.0))
        clock.now += 2.0
    return states


def test_a_port_down_while_serving_holds_it_out_at_that_look_and_healthy_looks_bring_it_back(rig, monkeypatch):  # noqa: F811
    down = ["rocep1s0f1: port 1 is 1: DOWN"]
    got = held(rig, monkeypatch, [[], down, down, [], [], []])
    assert [a.why for a in got] == ["serving", "fabric hold", "fabric hold", "fabric hold", "fabric hold", "serving"]
    out = got[1]
    assert out.up is False and out.retry_after == 30
    assert out.reason == (
        "held: the fabric is unhealthy (spark-worker: rocep1s0f1: port 1 is 1: DOWN); "
        "back after 3 healthy looks or on sparkcluster fabric resume"
    )
    assert rig.stopped == [] and rig.sup.proc is not None  # the engine was left running throughout
    events = [e["event"] for e in _journal(rig.tmp)]
    assert events.count("fabric hold") == 1 and events.count("fabric resumed") == 1


def test_fabric_resume_ends_a_hold_whose_profile_waits_for_the_operator(rig, monkeypatch):  # noqa: F811
    monkeypatch.setattr(supervisor, "FABRIC_RESUME_PATH", str(rig.tmp / "fabric-resume"))
    with_policy(fabric_auto_resume=False)
    down = ["rocep1s0f1: port 1 is 1: DOWN"]
    got = held(rig, monkeypatch, [down, [], [], [], []])
    assert all(a.why == "fabric hold" for a in got)
    assert got[-1].reason.endswith("back on sparkcluster fabric resume")
    mark = rig.tmp / "fabric-resume"
    mark.write_text("1\n")
    os.utime(mark, (rig.clock.now, rig.clock.now))
    (after,) = held(rig, monkeypatch, [[]])
    assert after.why == "serving"
    resumed = [e for e in _journal(rig.tmp) if e["event"] == "fabric resumed"]
    assert resumed[0]["by"] == "sparkcluster fabric resume"


def test_a_profile_without_the_hold_journals_and_keeps_serving(rig, monkeypatch):  # noqa: F811
    with_policy(fabric_hold=False)
    got = held(rig, monkeypatch, [["x: port 1 is 1: DOWN"]])
    assert got[0].why == "serving"
    assert any(e["event"].startswith("fabric unhealthy") for e in _journal(rig.tmp))


def test_status_and_the_gateway_read_the_same_hold():
    hold = {"since": 1.0, "why": "w: x", "nodes": ["w"], "healthy_polls": 0, "polls": 3, "auto": True}
    doc = {"state": "serving", "since": 1.0, "updated": 2.0, "fabric_hold": hold, "power_w": 75.5,
           "joules_per_1k_tokens": 1234.0}  # fmt: skip
    judged = contract.availability(contract.Supervised.of(doc), 1.0)
    assert judged.why == contract.FABRIC_HOLD and not judged.up and not judged.final
    assert status_mod.supervisor_shown(doc) == "held: fabric unhealthy (engine serving)"
    assert status_mod.supervisor_problem(doc) == f"supervisor: {judged.reason}"
    assert status_mod.energy_shown(doc) == "GPU power 75.5 W, 1,234 J per 1,000 tokens"
    assert status_mod.energy_shown({"state": "serving"}) == ""


class MarkApi:
    """The head's Docker engine as run_in asks it: each exec recorded, every one exits 0."""

    host = "spark-a"

    def __init__(self):
        self.calls = []

    def exec_create(self, container, argv, environment=None):
        self.calls.append((container, argv))
        return {"Id": "1"}

    def exec_start(self, i):
        return b""

    def exec_inspect(self, i):
        return {"ExitCode": 0}


def test_fabric_resume_plans_one_mark_per_deployment_headed_there():
    api = MarkApi()
    steps = fabric_resume.resume_steps(api, "spark-a", [("sc-pair-head-spark-a", "qwen3-30b"), ("sc-pair-b-head", "")])
    assert [s.id for s in steps] == [
        "fabric resume/spark-a/mark-qwen3-30b",
        "fabric resume/spark-a/mark-sc-pair-b-head",
    ]
    assert steps[0].detail == (f"docker exec sc-pair-head-spark-a sh -c 'date +%s > {contract.FABRIC_RESUME_PATH}'")
    done = walk.walk(walk.CommandRun(stage=fabric_resume.STAGE), steps)
    assert len(done) == 2 and api.calls[0] == ("sc-pair-head-spark-a", fabric_resume.MARK_ARGV)


def test_fabric_resume_walks_exactly_what_its_dry_run_printed(monkeypatch, capsys):
    """The command composes the plan (deployment/fabric_resume) and prints or walks its steps: the ids
    its `--dry-run --json` printed are the ones walked, and `--json` names what was marked."""
    inv = make_inventory()
    api = MarkApi()
    host = SimpleNamespace(name=inv.head.name, docker=lambda: SimpleNamespace(api=api), close=lambda: None)
    monkeypatch.setattr(cli_main.Invocation, "inventory", lambda self: inv)
    monkeypatch.setattr(
        fabric_resume.ConnectedHosts, "connect", classmethod(lambda cls, i, nodes=None: cls(i, {inv.head.name: host}))
    )
    monkeypatch.setattr(fabric_resume, "journals", lambda *a: [("sc-head", "qwen3-30b"), ("sc-b-head", "other")])
    walked = []
    monkeypatch.setattr(walk, "event", lambda step, outcome, seconds=None: walked.append(step.id))

    def sparkcluster(*argv):
        capsys.readouterr()
        rc = cli_main.main(list(argv))
        return rc, capsys.readouterr().out

    rc, out = sparkcluster("fabric", "resume", "--dry-run", "--json")
    assert rc == 0 and api.calls == [] and walked == []
    printed = [s["id"] for s in json.loads(out)]
    rc, out = sparkcluster("fabric", "resume", "--json")
    assert rc == 0 and walked == printed and len(api.calls) == 2
    assert json.loads(out) == {"ok": True, "marked": ["qwen3-30b", "other"]}


def test_fabric_resume_with_no_deployment_headed_there_says_what_to_run(monkeypatch):
    inv = make_inventory()
    host = SimpleNamespace(name=inv.head.name, docker=lambda: SimpleNamespace(api=MarkApi()), close=lambda: None)
    monkeypatch.setattr(
        fabric_resume.ConnectedHosts, "connect", classmethod(lambda cls, i, nodes=None: cls(i, {inv.head.name: host}))
    )
    monkeypatch.setattr(fabric_resume, "journals", lambda *a: [])
    with pytest.raises(InputError, match=f"no deployment of profile 'x' is headed on {inv.head.name}") as e:
        fabric_resume.resume(inv, None, "x")
    assert e.value.fix == "sparkcluster status"


def test_a_profile_that_chooses_stop_stops_the_engine_and_starts_it_when_the_hold_ends(rig, monkeypatch):  # noqa: F811
    with_policy(fabric_stop=True)
    started = []
    monkeypatch.setattr(rig.sup, "start", lambda desired: started.append(desired.generation))
    monkeypatch.setattr(rig.sup, "nodes_ready", lambda: None)
    monkeypatch.setattr(rig.sup, "memory_before_restart", lambda policy: False)
    monkeypatch.setattr(rig.sup, "read_reports", lambda: rig.sup.low_memory(None))  # the worker's, as held() reads it
    down = ["rocep1s0f1: port 1 is 1: DOWN"]
    got = held(rig, monkeypatch, [down, down, [], [], []])
    assert rig.stopped == ["the fabric is unhealthy: spark-worker: rocep1s0f1: port 1 is 1: DOWN"]
    assert [a.why for a in got[:4]] == ["fabric hold"] * 4  # stopped, out of rotation, until 3 healthy looks
    hold = [e for e in _journal(rig.tmp) if e["event"] == "fabric hold"]
    assert hold[0]["engine"] == "stopped"
    assert started == ["g1"]  # three healthy looks: the hold ended and the engine starts again
    assert any(e["event"] == "fabric resumed" for e in _journal(rig.tmp))
