"""The supervisor's one-token probe runs on a thread of its own (issue 40 item 4): a probe into a
stopped rank blocked each look for the probe's timeout, so looks came every ~17 s on the testbed
and the stall verdict came 49.6 s after a SIGSTOP against a 20 s bound. Here a probe that blocks
holds no look back; the stall rule then fires within stall_s and one interval of the last movement;
an answer counts only for the start it was sent to; an exception in the probe is a failure and the
next probe still starts; an engine is ready at the look that takes a successful answer; and the
staleness bound `status` and the gateway judge the state file by no longer counts the probe.

Time is the test's own (explicit `now`s, the supervisor's clock monkeypatched); the only real
waits are on events the probe's thread sets, bounded."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from sparkcluster.node import contract, lifecycle, supervisor
from sparkcluster.node.journal import Journal
from sparkcluster.node.verdict import Watch, verdict

# the testbed profile's bounds (tests/testbed/profiles/testbed.toml)
POLICY = contract.Policy(interval_s=2.0, probe_interval_s=5.0, probe_timeout_s=15.0, stall_s=20.0, max_restarts=2)
DESIRED = {"generation": "g1", "argv": ["vllm", "serve"], "model": "m", "port": 8000, "policy": POLICY.doc()}
ASKED = contract.Desired.of(DESIRED)  # desired.json as the supervisor reads it
WAIT_S = 10.0  # the most a test waits on the probe's thread (it answers in microseconds)


class Alive:
    pid = 4242

    def poll(self):
        return None


class Engine:
    """What the engine answers: /health 200, /metrics from `figures` (running, generated, served)."""

    def __init__(self):
        self.running, self.generated, self.served = 0.0, 0.0, 0.0

    def metrics(self) -> str:
        return (
            f"vllm:num_requests_running {self.running}\nvllm:num_requests_waiting 0\n"
            f"vllm:generation_tokens_total {self.generated}\nvllm:request_success_total {self.served}\n"
        )


class Probes:
    """The one-token probe's stand-in: each call takes the next answer (a string, or an exception
    to raise), after waiting for its gate (an Event the test sets) when it has one."""

    def __init__(self, *answers, gates=()):
        self.answers, self.gates = list(answers), list(gates)
        self.calls = 0
        self.entered = threading.Semaphore(0)

    def __call__(self, base, model, key, timeout):
        i = self.calls
        self.calls += 1
        self.entered.release()
        if i < len(self.gates) and self.gates[i] is not None:
            self.gates[i].wait(30)  # a look that waited on this would take 30 s
        answer = self.answers[i] if i < len(self.answers) else ""
        if isinstance(answer, BaseException):
            raise answer
        return answer


class _Read:
    def __init__(self, text: str):
        self.text = text

    def read(self):
        return self.text.encode()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.fixture
def rig(tmp_path, monkeypatch):
    """A serving supervisor over a stand-in engine, its clock the test's (`clock.now`)."""
    for name in ("SERVE_LOG", "RECORD_PATH", "STATE_PATH", "SECRETS_PATH", "DESIRED_PATH"):
        monkeypatch.setattr(supervisor, name, str(tmp_path / name.lower()))
    Path(supervisor.DESIRED_PATH).write_text(json.dumps(DESIRED))
    clock = SimpleNamespace(now=100.0)
    monkeypatch.setattr(supervisor, "time", SimpleNamespace(time=lambda: clock.now, monotonic=time.monotonic))
    engine = Engine()
    monkeypatch.setattr(supervisor, "http_status", lambda url, timeout: 200)
    monkeypatch.setattr(supervisor.urllib.request, "urlopen", lambda url, timeout=None: _Read(engine.metrics()))
    sup = supervisor.Supervisor({"node": "spark-head", "nodes": [], "peers": []}, Journal(str(tmp_path / "journal")))
    monkeypatch.setattr(sup, "low_memory", lambda policy: {})
    stopped: list[str] = []

    def stop(why, verdict=False):
        stopped.append(why)
        sup.proc = None

    monkeypatch.setattr(sup, "stop", stop)
    sup.generation, sup.first_start, sup.state = "g1", False, contract.SERVING
    sup.proc, sup.watch = Alive(), Watch(started=0.0, ready=True, progressed_at=clock.now)
    sup.policy(ASKED)
    return SimpleNamespace(sup=sup, clock=clock, engine=engine, stopped=stopped, tmp=tmp_path)


def _probes(monkeypatch, *answers, gates=()) -> Probes:
    """The stand-in, with `runs`: every probe the supervisor sent, in order (counted as it is sent,
    not when its thread gets to run)."""
    p = Probes(*answers, gates=gates)
    p.runs = []

    class Recorded(supervisor.ProbeRun):
        def __init__(self, *a):
            super().__init__(*a)
            p.runs.append(self)

    monkeypatch.setattr(supervisor, "one_token", p)
    monkeypatch.setattr(supervisor, "ProbeRun", Recorded)
    return p


def _returned(sup) -> None:
    """Waits (bounded) until the probe in flight has its answer."""
    assert sup.probe_run is not None and sup.probe_run.done.wait(WAIT_S)


def _journal(tmp) -> list[dict]:
    return [json.loads(x) for x in (tmp / "journal").read_text().splitlines()]


def test_a_probe_that_blocks_holds_no_look_back_and_its_answer_is_taken_after_it_returns(rig, monkeypatch):
    gate = threading.Event()
    probes = _probes(monkeypatch, "", gates=[gate])
    sup, clock = rig.sup, rig.clock
    try:
        t0 = time.monotonic()
        look = sup.look(ASKED, POLICY)  # due: the probe is sent and left running
        assert look.probe is None and probes.entered.acquire(timeout=WAIT_S)
        for _ in range(5):  # looks go on, each 2 s later, while it blocks; none sends another
            clock.now += 2.0
            assert sup.look(ASKED, POLICY).probe is None
        assert time.monotonic() - t0 < 5.0  # a look waiting on the probe would take its 30 s
        assert len(probes.runs) == 1 and sup.counts == {} and sup.last_probe_s is None
    finally:
        gate.set()
    _returned(sup)
    clock.now += 2.0
    look = sup.look(ASKED, POLICY)  # the first look after it returned takes its answer
    assert look.probe == "" and sup.last_probe_ok is True and sup.counts == {"probe:ok": 1}
    assert sup.probe_run is None or sup.probe_run.watch is sup.watch  # the next one, sent when due


def test_with_progress_frozen_and_requests_running_the_stall_rule_fires_within_stall_s_and_one_interval(
    rig, monkeypatch
):
    """The measured case: a rank stopped under load. Every probe into it blocks (its answer never
    comes); looks go on every interval_s and the stall rule judges."""
    gate = threading.Event()
    probes = _probes(monkeypatch, gates=[gate])
    sup, clock, engine = rig.sup, rig.clock, rig.engine
    engine.running = 4.0
    updated = []
    try:
        for _ in range(6):  # serving: tokens move at every look
            engine.generated += 50
            sup.tick()
            updated.append(json.loads(Path(supervisor.STATE_PATH).read_text())["updated"])
            clock.now += 2.0
        last_movement = clock.now - 1.0  # the rank stopped between two looks, its last tokens with it
        engine.generated += 10
        verdict_at = None
        while verdict_at is None and clock.now < last_movement + 60:
            sup.tick()
            updated.append(json.loads(Path(supervisor.STATE_PATH).read_text())["updated"])
            if rig.stopped:
                verdict_at = clock.now
            clock.now += 2.0
    finally:
        gate.set()
    wedged = [e for e in _journal(rig.tmp) if (e["event"], e.get("kind")) == ("verdict", "wedged")]
    assert verdict_at is not None and len(wedged) == 1, _journal(rig.tmp)
    assert "no progress of any kind" in wedged[0]["cause"] and "for 20s" in wedged[0]["cause"]
    assert verdict_at - last_movement <= POLICY.stall_s + POLICY.interval_s
    assert len(probes.runs) == 1  # one probe in flight the whole time, none piled up behind it
    # every look rewrote the state file, 2 s apart: never stale while the probe blocks
    assert all(b - a == 2.0 for a, b in zip(updated, updated[1:]))
    assert sup.state == contract.RESTARTING


def test_an_answer_from_an_earlier_start_never_counts_nor_blocks_the_new_engines_probe(rig, monkeypatch):
    old_gate, new_gate = threading.Event(), threading.Event()
    probes = _probes(monkeypatch, "", "", gates=[old_gate, new_gate])
    sup, clock = rig.sup, rig.clock
    try:
        sup.look(ASKED, POLICY)  # the first engine's probe, in flight
        old = sup.probe_run
        assert probes.entered.acquire(timeout=WAIT_S)
        sup.watch = Watch(started=clock.now + 1)  # stopped and started again: a new engine, not ready
        clock.now += 1.25
        assert sup.look(ASKED, POLICY).probe is None
        assert len(probes.runs) == 2 and sup.probe_run is probes.runs[1]  # sent despite the old one
        assert sup.probe_run.watch is sup.watch and old.watch is not sup.watch
        old_gate.set()
        assert old.done.wait(WAIT_S) and old.answer == ""
        clock.now += 0.25
        look = sup.look(ASKED, POLICY)
        assert look.probe is None and sup.counts == {}  # the old engine's success is not this one's
        assert verdict(sup.watch, look, POLICY) is None and not sup.watch.ready
    finally:
        old_gate.set()
        new_gate.set()
    _returned(sup)
    clock.now += 0.25
    look = sup.look(ASKED, POLICY)
    assert look.probe == "" and sup.counts == {"probe:ok": 1}
    assert verdict(sup.watch, look, POLICY) is None and sup.watch.ready


def test_an_exception_in_the_probe_is_a_failure_and_the_next_probe_still_starts(rig, monkeypatch):
    probes = _probes(monkeypatch, RuntimeError("connection pool broke"), "")
    sup, clock, engine = rig.sup, rig.clock, rig.engine
    engine.running = 1.0
    verdict(sup.watch, sup.look(ASKED, POLICY), POLICY)  # sent
    _returned(sup)
    clock.now += 2.0
    look = sup.look(ASKED, POLICY)
    assert look.probe == "the one-token probe failed: RuntimeError: connection pool broke"
    assert sup.last_probe_ok is False and sup.counts == {"probe:failed": 1}
    assert verdict(sup.watch, look, POLICY) is None and sup.watch.probe_failures == 1  # counted
    clock.now += 4.0  # probe_interval_s since the first: the next one is sent
    sup.look(ASKED, POLICY)
    assert len(probes.runs) == 2
    _returned(sup)
    clock.now += 2.0
    look = sup.look(ASKED, POLICY)
    assert look.probe == "" and sup.counts == {"probe:failed": 1, "probe:ok": 1}
    assert verdict(sup.watch, look, POLICY) is None and sup.watch.probe_failures == 0


def test_a_starting_engine_is_serving_at_the_look_that_takes_a_successful_answer(rig, monkeypatch):
    probes = _probes(monkeypatch, "a one-token completion answered HTTP 503", "")
    sup, clock = rig.sup, rig.clock
    sup.state, sup.watch = contract.STARTING, Watch(started=clock.now)
    sup.tick()  # /health 200: the first probe is sent
    assert sup.state == contract.STARTING and len(probes.runs) == 1
    _returned(sup)
    clock.now += 0.25  # the agent looks every BUSY_LOOK_S while a server starts
    sup.tick()  # a failure taken; not ready yet, so the next probe goes at once
    assert sup.state == contract.STARTING and len(probes.runs) == 2
    _returned(sup)
    clock.now += 0.25
    sup.tick()
    assert sup.state == contract.SERVING and sup.watch.ready and sup.counts == {"probe:failed": 1, "probe:ok": 1}


def test_the_state_file_is_stale_after_three_looks_and_the_reads_bounds_not_the_probes():
    testbed = {"policy": {"interval_s": 2.0, "probe_timeout_s": 15.0}, "state": contract.SERVING, "since": 50.0}
    assert contract.Supervised.of(testbed).stale_after_s() == 15.0  # 3 x 2 s + 7 s of reads, floored at 15 s
    slow = {**testbed, "policy": {"interval_s": 5.0, "probe_timeout_s": 60.0}}
    assert contract.Supervised.of(slow).stale_after_s() == 3 * 5.0 + contract.LOOK_BLOCKS_S
    # peers whose report did not answer cost a look a second each
    blind = {**slow, "memory_unknown": {"a": "timed out", "b": "timed out"}}
    assert contract.Supervised.of(blind).stale_after_s() == 3 * 5.0 + contract.LOOK_BLOCKS_S + 2 * contract.PEER_READ_S
    # a verdict published before the stop: the stop's grace and kill wait are the supervisor acting
    stopping = {**testbed, "causes": [{"ts": 60.0, "kind": "wedged", "cause": "no progress"}]}
    grace = contract.Policy().stop_grace_s + contract.STOP_KILL_WAIT_S
    assert contract.Supervised.of(stopping).stale_after_s() == 3 * 2.0 + contract.LOOK_BLOCKS_S + grace
    # a cause older than the state (the restart that followed it) adds nothing
    assert contract.Supervised.of({**stopping, "since": 70.0}).stale_after_s() == 15.0
    assert contract.Supervised.of({**stopping, "state": contract.RESTARTING}).stale_after_s() == 15.0
    # any stop the supervisor publishes before it blocks (down, on demand's idle TTL, up replacing
    # the server: no new cause) adds the grace it stops with
    orderly = {**testbed, "stopping": {"why": "idle for 900s", "grace_s": 30.0}}
    assert (
        contract.Supervised.of(orderly).stale_after_s()
        == 3 * 2.0 + contract.LOOK_BLOCKS_S + 30.0 + contract.STOP_KILL_WAIT_S
    )


def test_the_state_file_is_rewritten_during_a_restarts_backoff(rig):
    sup, clock = rig.sup, rig.clock
    sup.proc, sup.state, sup.next_start = None, contract.RESTARTING, clock.now + 20.0
    for _ in range(3):
        clock.now += 2.0
        sup.tick()
        doc = json.loads(Path(supervisor.STATE_PATH).read_text())
        assert doc["state"] == contract.RESTARTING and doc["updated"] == clock.now
    assert sup.proc is None


def _deaf(tmp) -> subprocess.Popen:
    """A process group that ignores SIGTERM, as vLLM's server does while its requests never end."""
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(120)"
    )
    p = subprocess.Popen([sys.executable, "-c", code], start_new_session=True, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "up"  # its handler is in place
    return p


@pytest.mark.parametrize("after_verdict", [True, False])
def test_a_stop_after_a_verdict_kills_after_its_short_grace_and_the_state_file_says_it_is_stopping(
    rig, monkeypatch, after_verdict
):
    """A wedged engine's SIGTERM waits on requests that never end: the stop after a verdict gives it
    verdict_grace_s, an orderly stop stop_grace_s. While it blocks, the state file says so."""
    sup = rig.sup
    policy = dataclasses.replace(POLICY, verdict_grace_s=0.3, stop_grace_s=1.5)
    monkeypatch.setattr(sup, "policy", lambda desired=None: policy)
    seen = []
    real_stop_group = lifecycle.stop_group

    def watched(proc, grace):
        seen.append((grace, json.loads(Path(supervisor.STATE_PATH).read_text()).get("stopping")))
        return real_stop_group(proc, grace)

    monkeypatch.setattr(lifecycle, "stop_group", watched)
    sup.proc = _deaf(rig.tmp)
    t0 = time.monotonic()
    supervisor.Supervisor.stop(sup, "no progress", verdict=after_verdict)
    took = time.monotonic() - t0
    grace = 0.3 if after_verdict else 1.5
    assert seen == [(grace, {"why": "no progress", "grace_s": grace})]
    assert grace <= took < grace + 5.0  # SIGKILL once the grace is spent
    assert sup.proc is None and sup.stopping is None
    stopped = [e for e in _journal(rig.tmp) if e["event"] == "vllm serve stopped"]
    assert stopped[-1]["exit"] == -9 and stopped[-1]["grace_s"] == grace


@pytest.mark.parametrize("served", [True, False])
def test_the_restarts_backoff_counts_from_the_verdict_and_doubles_only_for_an_engine_that_never_served(
    rig, monkeypatch, served
):
    sup, clock, engine = rig.sup, rig.clock, rig.engine
    _probes(monkeypatch)
    engine.running = 2.0

    def slow_stop(why, verdict=False):  # the stop takes 4 s of the supervisor's clock
        assert verdict
        clock.now += 4.0
        sup.proc = None

    monkeypatch.setattr(sup, "stop", slow_stop)
    sup.restarts = [clock.now - 100.0]  # one restart earlier in the window
    sup.watch = Watch(started=0.0, ready=served, progressed_at=clock.now - 100.0)
    sup.state = contract.SERVING if served else contract.STARTING
    if not served:
        monkeypatch.setattr(supervisor, "verdict", lambda w, look, policy: ("dead", "the vllm serve process exited"))
    else:
        monkeypatch.setattr(supervisor, "verdict", lambda w, look, policy: ("wedged", "no progress"))
    judged = clock.now
    sup.tick()
    assert sup.state == contract.RESTARTING and sup.proc is None
    wait = POLICY.backoff_s if served else POLICY.backoff_s * 2
    assert sup.next_start == judged + wait  # the 4 s of the stop are part of it
