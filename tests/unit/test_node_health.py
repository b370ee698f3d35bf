"""Node health beyond the GPU (issue 75), at the supervisor: energy per 1,000 tokens from every node's
GPU power, "busy but low power" as wedge evidence (never a verdict alone), and a verdict's cause naming
a fresh Xid or OOM kill the kernel reported on any node (captured lines: tests/captured/kernel/)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sparkcluster.node import energy, kernel_log, metrics
from sparkcluster.node.energy import LOW_POWER_SAMPLES, Energy, joules_per_1k, power_report
from tests.unit.test_supervisor_probe import POLICY, _journal, _probes, rig  # noqa: F401 - the fixture

KERNEL = Path(__file__).resolve().parents[1] / "captured" / "kernel"


def test_energy_per_1k_tokens_integrates_power_over_the_tokens():
    # 60 W for 10 s (600 J) over 300 tokens: 2,000 J per 1,000 tokens
    assert joules_per_1k([(0.0, 0.0, 60.0), (5.0, 100.0, 60.0), (10.0, 300.0, 60.0)]) == 2000.0
    assert joules_per_1k([(0.0, 5.0, 60.0), (2.0, 5.0, 60.0)]) is None  # no token: no figure
    assert joules_per_1k([(0.0, 5.0, 60.0)]) is None


def test_power_of_part_of_the_deployment_is_no_figure():
    e = Energy()
    e.update(0.0, {"head": 40.0, "worker": None}, 0.0, busy=True)
    e.update(2.0, {"head": 40.0, "worker": None}, 100.0, busy=True)
    assert e.power_w is None and e.joules_per_1k is None and e.low_samples == 0
    e.update(4.0, {"head": 40.0, "worker": 35.0}, 200.0, busy=True)
    e.update(6.0, {"head": 40.0, "worker": 35.0}, 300.0, busy=True)
    assert e.power_w == 75.0 and e.joules_per_1k == 1500.0
    assert power_report([{"gpu": "0", "power_w": 4.5}, {"gpu": "1"}]) == {"gpu_power_w": 4.5}
    assert power_report([{"gpu": "0"}]) == {}  # absent, never zero


def test_busy_but_low_power_begins_after_its_samples_and_idle_low_power_is_nothing():
    e = Energy()
    for i in range(LOW_POWER_SAMPLES - 1):
        assert e.update(i, {"head": 4.5, "worker": 5.0}, float(i), busy=True) is False
    assert e.update(9, {"head": 4.5, "worker": 5.0}, 9.0, busy=True) is True and e.low
    assert "under 15 W" in e.signal()
    e.update(10, {"head": 4.5, "worker": 5.0}, 9.0, busy=False)  # idle at low power: an idle GPU
    assert not e.low and e.signal() == ""
    e.update(11, {"head": 4.5, "worker": 31.0}, 9.0, busy=True)  # one GPU working: not all low
    assert e.low_samples == 0


class Gpus:
    def __init__(self, watts):
        self.watts = watts

    def readings(self):
        return [{"gpu": "0", "power_w": self.watts}]


def _kernel_on_worker(name: str, ts: float) -> dict:
    p = kernel_log.Parser()
    evs = [e for e in (p.feed(x) for x in (KERNEL / name).read_text().splitlines()) if e]
    for e in evs:
        e["ts"] = ts
    return {"kernel": {"source": kernel_log.KMSG_PATH, "error": "", "counts": [], "recent": evs}}


def test_a_wedge_verdict_names_the_workers_fresh_xid_and_the_low_power(rig, monkeypatch):  # noqa: F811
    _probes(monkeypatch)
    sup, clock, engine = rig.sup, rig.clock, rig.engine
    sup.cfg["peers"] = [{"name": "spark-worker", "ip": "10.0.0.2"}]
    sup.nvml = Gpus(4.5)  # a wedged GB10 idles
    engine.running = 2.0
    worker = {"gpu_power_w": 5.0, **_kernel_on_worker("xid79-ogkm-1151.journal", clock.now + 10)}
    monkeypatch.setattr(sup, "low_memory", lambda policy: sup.reports.update({"spark-worker": worker}) or {})
    while not rig.stopped and clock.now < 200:
        sup.tick()
        clock.now += 2.0
    (wedged,) = [e for e in _journal(rig.tmp) if e["event"] == "verdict"]
    assert wedged["kind"] == "wedged"
    assert "busy but low power: every GPU under 15 W" in wedged["cause"]
    assert wedged["cause"].endswith("the kernel reported spark-worker: Xid 79 (the GPU has fallen off the bus)")
    assert any(e["event"] == "busy but low power" for e in _journal(rig.tmp))
    state = json.loads(Path(rig.tmp / "state_path").read_text())
    assert "Xid 79" in state["causes"][-1]["cause"]


def test_low_power_while_tokens_move_is_no_verdict_and_an_old_oom_kill_is_not_named(rig, monkeypatch):  # noqa: F811
    _probes(monkeypatch)
    sup, clock, engine = rig.sup, rig.clock, rig.engine
    sup.nvml = Gpus(4.5)
    engine.running = 2.0
    for _ in range(20):
        engine.generated += 40
        sup.tick()
        clock.now += 2.0
    assert rig.stopped == [] and sup.energy.low  # the signal stands; alone it restarts nothing
    assert sup.energy.joules_per_1k == round(4.5 * 2 / 40 * 1000, 3)
    samples = metrics.supervisor_samples(sup, clock.now)
    text = metrics.render(samples)
    got = {f.name: f.samples for f in text_string_to_metric_families(text)}
    assert got["sparkcluster_engine_busy_low_power"][0].value == 1
    assert got["sparkcluster_energy_joules_per_1k_tokens"][0].value == 225.0
    # an OOM kill older than this start is history, not this verdict's evidence
    sup.reports["spark-worker"] = _kernel_on_worker("oom-kill-install-docker-14.dmesg", -50.0)
    assert sup.with_evidence("dead", "the vllm serve process exited", clock.now) == "the vllm serve process exited"
    sup.reports["spark-worker"] = _kernel_on_worker("oom-kill-install-docker-14.dmesg", clock.now - 1)
    assert sup.with_evidence("dead", "gone", clock.now) == (
        "gone; the kernel reported spark-worker: an OOM kill of java (pid 7134) in container 00748bf4e957"
    )


def test_the_kernel_counters_and_readability_are_exported():
    rep = {"error": "", "counts": [{"kind": "xid", "code": "79", "count": 2}], "recent": []}
    text = metrics.render(metrics.node_samples({}, "MemTotal: 1 kB\n", False, [], None, {}, None, rep))
    got = {f.name: f.samples for f in text_string_to_metric_families(text)}
    (xid,) = got["sparkcluster_kernel_events"]  # the parser strips _total from a counter family
    assert xid.labels == {"kind": "xid", "code": "79"} and xid.value == 2
    assert got["sparkcluster_kernel_log_readable"][0].value == 1
    unread = metrics.render(metrics.node_samples({}, "", False, [], None, {}, None, {"error": "x", "counts": []}))
    assert "sparkcluster_kernel_log_readable 0" in unread


def test_nvidia_smi_readings_as_nvml_gives_them():
    got = metrics.smi_readings("0, 4.56, 208, 41\n1, [N/A], 2418, 50\n")
    assert got == [
        {"gpu": "0", "power_w": 4.56, "sm_clock_mhz": 208.0, "temperature_c": 41.0},
        {"gpu": "1", "sm_clock_mhz": 2418.0, "temperature_c": 50.0},
    ]
    assert energy.LOW_POWER_W == 15.0


def test_a_bench_levels_energy_per_1k_output_tokens_from_the_power_read_while_it_ran():
    from sparkcluster.bench.power import level_energy

    # the stand-in's power varied during the level: 40 W then 60 W, 25 output tokens per second
    assert level_energy([40.0, 60.0, 50.0], 25.0) == {"power_w": 50.0, "j_per_1k_out": 2000.0}
    assert level_energy([], 25.0) == {"power_w": None, "j_per_1k_out": None}  # no reading: no figure
    assert level_energy([50.0], 0.0) == {"power_w": 50.0, "j_per_1k_out": None}


def test_a_peers_kernel_events_are_journalled_on_the_head_once_each(rig, monkeypatch):  # noqa: F811
    _probes(monkeypatch)
    sup, clock = rig.sup, rig.clock
    sup.cfg["peers"] = [{"name": "spark-worker", "ip": "10.0.0.2"}]
    worker = {"kernel": {"recent": []}}
    monkeypatch.setattr(sup, "low_memory", lambda policy: sup.reports.update({"spark-worker": worker}) or {})
    sup.tick()  # its first report: nothing yet
    worker.update(_kernel_on_worker("xid79-ogkm-1151.journal", clock.now + 1))
    for _ in range(3):
        clock.now += 2.0
        sup.tick()
    (ev,) = [e for e in _journal(rig.tmp) if e["event"] == "kernel event"]
    assert ev["node"] == "spark-worker" and ev["code"] == "79" and ev["at"] == 101.0
    assert ev["meaning"] == "the GPU has fallen off the bus"


@pytest.mark.parametrize("watts", [4.5, 33.5])
def test_busy_but_low_power_never_moves_a_verdict(rig, monkeypatch, watts):  # noqa: F811
    """The same engine at a GPU's rest power and at its working power: tokens move for four stall
    windows and nothing is stopped either way; once they freeze, the wedge verdict comes when the
    progress counters alone call it (stall_s after the last token), and low power only adds its
    evidence to the cause. The signal is never a verdict, and never hastens one."""
    _probes(monkeypatch)
    sup, clock, engine = rig.sup, rig.clock, rig.engine
    sup.nvml = Gpus(watts)
    engine.running = 2.0
    stall_s = POLICY.stall_s
    start = clock.now
    while clock.now < start + 4 * stall_s:
        engine.generated += 40
        sup.tick()
        clock.now += 2.0
    assert rig.stopped == [] and sup.energy.low == (watts < energy.LOW_POWER_W)
    frozen = clock.now - 2.0  # the last look that saw a token
    while not rig.stopped and clock.now < frozen + 10 * stall_s:
        sup.tick()
        clock.now += 2.0
    (verdict,) = [e for e in _journal(rig.tmp) if e["event"] == "verdict"]
    assert verdict["kind"] == "wedged"
    stopped_at = clock.now - 2.0  # the look that judged
    assert stall_s <= stopped_at - frozen <= stall_s + 2 * 2.0  # the stall bound, within a look
    assert ("busy but low power" in verdict["cause"]) == (watts < energy.LOW_POWER_W)
