"""The node agent's supervisor (sparkcluster/node): its verdicts over looks, its restart bound and backoff,
its readers over captured text, and a start/stop of a real process with hostile arguments."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path

import pytest

from sparkcluster.node import contract, readings, shm, supervisor
from sparkcluster.node.journal import Journal
from sparkcluster.node.verdict import Look, Watch, backoff, restarts_left, verdict

CAPTURED = Path(__file__).parents[1] / "captured"
P = contract.Policy(stall_s=30.0, ready_timeout_s=100.0)
HOSTILE_ARGS = ["a;b", "$(touch pwned)", "`id`", 'it\'s "quoted"', "  spaced  ", "*", "", "back\\slash", "ünï"]


def ready_watch() -> Watch:
    w = Watch(started=0.0)
    assert verdict(w, Look(now=1.0, alive=True, health=200, probe=""), P) is None
    assert w.ready
    return w


def test_a_starting_engine_is_left_alone_until_its_ready_bound():
    w = Watch(started=0.0)
    assert verdict(w, Look(now=50.0, alive=True, health=None), P) is None
    assert verdict(w, Look(now=99.0, alive=True, health=200, probe="timed out"), P) is None
    assert verdict(w, Look(now=101.0, alive=True, health=None), P)[0] == "not-ready"


def test_dead_when_the_process_exits_whatever_its_status():
    assert verdict(ready_watch(), Look(now=5.0, alive=False), P) == ("dead", "the vllm serve process exited")


def test_dead_after_consecutive_health_failures_only():
    w = ready_watch()
    assert verdict(w, Look(now=2.0, alive=True, health=None), P) is None
    assert verdict(w, Look(now=3.0, alive=True, health=200), P) is None  # one good look resets
    for t in (4.0, 5.0):
        assert verdict(w, Look(now=t, alive=True, health=503), P) is None
    kind, cause = verdict(w, Look(now=6.0, alive=True, health=503), P)
    assert kind == "dead" and "3 times" in cause


def figures(running=0.0, waiting=0.0, generated=500.0, prompt=9000.0, kv=0.02) -> dict[str, float]:
    """The progress series as vLLM 0.32 names them (tests/captured/vllm-0.32-metrics.txt)."""
    return {
        "vllm:num_requests_running": running,
        "vllm:num_requests_waiting": waiting,
        "vllm:generation_tokens_total": generated,
        "vllm:prompt_tokens_total": prompt,
        "vllm:kv_cache_usage_perc": kv,
        "vllm:request_success_total": 40.0,
    }


def look(now, probe=None, **fig) -> Look:
    f = figures(**fig)
    return Look(
        now=now,
        alive=True,
        health=200,
        running=f["vllm:num_requests_running"],
        generated=f["vllm:generation_tokens_total"],
        progress=f,
        probe=probe,
    )


TIMEOUT = "a one-token completion did not return within 20s"


def test_a_single_probe_timeout_restarts_nothing_only_consecutive_ones_without_progress():
    w = ready_watch()
    assert verdict(w, look(5.0, running=1), P) is None
    assert verdict(w, look(10.0, probe=TIMEOUT, running=1), P) is None  # one: never enough
    kind, cause = verdict(w, look(15.0, probe=TIMEOUT, running=1), P)
    assert kind == "wedged" and cause.startswith("/health is 200 but a one-token completion") and "2 times" in cause


def test_a_probe_that_answers_resets_the_count():
    w = ready_watch()
    assert verdict(w, look(5.0, probe=TIMEOUT, running=1), P) is None
    assert verdict(w, look(10.0, probe="", running=1), P) is None
    assert verdict(w, look(15.0, probe=TIMEOUT, running=1), P) is None


def test_wedged_when_work_runs_and_nothing_progresses_for_the_window():
    w = ready_watch()
    assert verdict(w, look(10.0, running=2), P) is None
    assert verdict(w, look(30.0, running=2), P) is None
    kind, cause = verdict(w, look(40.0, running=2), P)
    assert (
        kind == "wedged" and "2 request(s) running" in cause and "no progress of any kind" in cause and "30s" in cause
    )


def test_a_long_prefill_is_progress_not_a_wedge_and_is_named_prefilling():
    """Issue 25: in vLLM's V1 engine a chunked prefill produces no output until the whole prompt
    is in, so the token counters stand still for minutes; the KV cache grows with every chunk. The
    probe waits behind the prefill and times out meanwhile: neither is a wedge."""
    w = ready_watch()
    assert verdict(w, look(2.0, running=1, kv=0.02), P) is None
    for i in range(1, 60):  # ten times stall_s (30 s), each look a 5 s step, each probe timing out
        assert (
            verdict(w, look(2.0 + 5 * i, probe=TIMEOUT if i % 3 == 0 else None, running=1, kv=0.02 + i * 0.01), P)
            is None
        ), i
    assert w.activity.startswith("prefilling: 1 request(s) running, no token generated yet")
    assert "kv_cache_usage_perc" in w.activity and "KV cache 61.0%" in w.activity
    # the prompt is in: tokens flow, the activity ends
    assert verdict(w, look(400.0, running=1, kv=0.62, generated=501.0, prompt=39000.0), P) is None
    assert w.activity == ""


def test_a_wedge_in_the_middle_of_a_long_prefill_is_still_caught_within_its_bound():
    w = ready_watch()
    for i in range(10):  # progressing
        assert verdict(w, look(2.0 + 5 * i, running=1, kv=0.02 + i * 0.01), P) is None
    t = 2.0 + 5 * 9
    found = None
    for j in range(1, 20):  # a rank stopped: nothing moves any more
        found = verdict(w, look(t + 5 * j, probe=TIMEOUT if j % 3 == 0 else None, running=1, kv=0.11), P)
        if found:
            break
    assert found is not None and found[0] == "wedged" and 5 * j <= P.stall_s + 5


def test_idle_engine_with_a_still_counter_is_not_wedged():
    w = ready_watch()
    for t in (10.0, 100.0, 1000.0):
        assert verdict(w, look(t, running=0), P) is None


def test_memory_floor_needs_consecutive_samples_and_wins_over_everything():
    w = ready_watch()
    low = {"spark-worker": 5 * 2**30}
    assert verdict(w, Look(now=2.0, alive=True, health=200, low_memory=low), P) is None
    assert verdict(w, Look(now=3.0, alive=True, health=200), P) is None  # recovered: count restarts
    assert verdict(w, Look(now=4.0, alive=True, health=200, low_memory=low), P) is None
    assert verdict(w, Look(now=5.0, alive=True, health=200, low_memory=low), P) is None
    kind, cause = verdict(w, Look(now=6.0, alive=False, low_memory=low), P)
    assert kind == "memory" and "spark-worker 5.0 GiB" in cause and "6 GiB" in cause


def test_restart_bound_and_backoff_follow_the_window():
    now = 10_000.0
    assert restarts_left([], now, P) == 3
    assert restarts_left([now - 10, now - 20, now - 4000], now, P) == 1  # one fell out of the hour
    # an engine that never served: a crash loop, doubled per restart in the window
    assert backoff([now], now, P, served=False) == 5.0
    assert backoff([now - 2, now - 1, now], now, P, served=False) == 20.0
    assert backoff([now - i for i in range(10)], now, P, served=False) == 60.0
    # one that served before its verdict (a wedge, a lost node): not a crash loop
    assert backoff([now - 2, now - 1, now], now, P, served=True) == 5.0


def test_readers_over_captured_text():
    meminfo = (CAPTURED / "host-meminfo.txt").read_text()
    assert readings.mem_available(meminfo) == 24_332_672 * 1024
    assert readings.mem_available("MemTotal: 1 kB\n") is None
    metrics = (CAPTURED / "vllm-0.32-metrics.txt").read_text()
    running, generated = readings.engine_figures(metrics)
    assert (running, generated) == (2.0, 6064.0)


def test_supervisor_starts_hostile_argv_uninterpreted_and_stops_it(tmp_path, monkeypatch):
    for name in ("SERVE_LOG", "RECORD_PATH", "STATE_PATH", "SECRETS_PATH", "DESIRED_PATH"):
        monkeypatch.setattr(supervisor, name, str(tmp_path / name.lower()))
    Path(supervisor.SECRETS_PATH).write_text(json.dumps({"VLLM_API_KEY": "k-secret"}))
    script = "import os,sys,time; print(*sys.argv[1:], sep='\\n'); print('key', os.environ['VLLM_API_KEY'] == 'k-secret', flush=True); time.sleep(60)"
    desired = {
        "generation": "g1",
        "argv": [sys.executable, "-c", script, *HOSTILE_ARGS],
        "model": "m",
        "port": 1,
        "profile": "p",
        "salt": "s",
        "secrets_digest": "d",
    }
    sup = supervisor.Supervisor({"node": "n", "nodes": [], "peers": []}, Journal(str(tmp_path / "journal")))
    monkeypatch.chdir(tmp_path)
    sup.start(contract.Desired.of(desired))
    rec = json.loads(Path(supervisor.RECORD_PATH).read_text())
    assert rec["pid"] == sup.proc.pid and rec["generation"] == "g1" and "k-secret" not in json.dumps(rec)
    deadline = time.time() + 10
    while "key" not in Path(supervisor.SERVE_LOG).read_text() and time.time() < deadline:
        time.sleep(0.05)
    mark, _, logged = Path(supervisor.SERVE_LOG).read_text().partition("\n")
    assert mark.startswith(supervisor.engine_log.SERVE_MARK)  # this start's lines follow it (issue 59)
    assert logged == "".join(a + "\n" for a in HOSTILE_ARGS) + "key True\n"
    assert not (tmp_path / "pwned").exists()
    sup.stop("test")
    assert sup.proc is None and not Path(supervisor.RECORD_PATH).exists()
    journal = [json.loads(x) for x in (tmp_path / "journal").read_text().splitlines()]
    assert [e["event"] for e in journal] == ["vllm serve started", "state: starting", "vllm serve stopped"]
    assert "k-secret" not in (tmp_path / "journal").read_text()


def test_resumes_restart_count_and_final_verdicts_after_a_container_restart(tmp_path, monkeypatch):
    for name in ("RECORD_PATH", "STATE_PATH"):
        monkeypatch.setattr(supervisor, name, str(tmp_path / name.lower()))
    Path(supervisor.STATE_PATH).write_text(
        json.dumps(
            {"generation": "g1", "state": contract.LIMIT, "restarts": [1.0, 2.0, 3.0], "causes": [{"kind": "wedged"}]}
        )
    )
    sup = supervisor.Supervisor({"node": "n"}, Journal(str(tmp_path / "journal")))
    sup.adopt(contract.Desired(generation="g1"))
    assert (sup.state, sup.restarts, sup.first_start) == (contract.LIMIT, [1.0, 2.0, 3.0], False)
    fresh = supervisor.Supervisor({"node": "n"}, Journal(str(tmp_path / "journal")))
    fresh.adopt(contract.Desired(generation="g2"))
    assert (fresh.restarts, fresh.first_start) == ([], True)


def test_shm_janitor_removes_only_segments_it_saw_mapped_after_two_unmapped_looks(tmp_path, monkeypatch):
    seg = tmp_path / "psm_abc"
    seg.write_bytes(b"x")
    other = tmp_path / "psm_other"
    other.write_bytes(b"y")
    mapped = {str(seg)}
    monkeypatch.setattr(shm, "shm_in_use", lambda: set(mapped))
    j = shm.ShmJanitor(Journal(str(tmp_path / "journal")))
    j.look()
    mapped.clear()
    j.look()
    assert seg.exists()  # unmapped once: perhaps between two processes
    j.look()
    assert not seg.exists() and other.exists()


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc")
def test_shm_in_use_reads_a_real_mapping():
    from multiprocessing import shared_memory

    seg = shared_memory.SharedMemory(create=True, size=4096, name="psm_sctest1")
    try:
        assert "/dev/shm/psm_sctest1" in shm.shm_in_use()
    finally:
        seg.close()
        seg.unlink()


def test_up_says_serving_only_once_the_supervisor_has_seen_it_serve(monkeypatch):
    from types import SimpleNamespace

    from sparkcluster.deployment import server, supervision
    from sparkcluster.errors import StageError
    from sparkcluster.up.stages import serve as serve_stage

    states = iter(
        [
            None,
            {"state": "starting", "generation": "g1"},
            {"state": "serving", "generation": "g0"},
            {"state": "serving", "generation": "g1"},
        ]
    )
    monkeypatch.setattr(server, "wait_ready", lambda *a, **kw: 3.0)
    monkeypatch.setattr(supervision, "state", lambda api, c: contract.Supervised.of(next(states)))
    monkeypatch.setattr(server, "supervisor_tail", lambda api, c: "journal tail")
    prof = SimpleNamespace(ready_timeout_s=60, model="m", supervisor=SimpleNamespace(probe_timeout_s=1.0))
    sv = SimpleNamespace(container="c", describe=lambda: "the supervisor in c runs: vllm serve m")
    head = SimpleNamespace(name="spark-head", address="198.18.0.2", docker=lambda: SimpleNamespace(api=None))
    r = SimpleNamespace(
        plan=SimpleNamespace(serve=sv, profile=prof),
        cluster=SimpleNamespace(head=head),
        get=lambda kind: SimpleNamespace(generation="g1"),
        secrets={},
        progress=None,
    )
    monkeypatch.setattr(serve_stage, "_reached", lambda r: contextlib.nullcontext("http://x"))
    assert serve_stage.wait_ready(r) == 3.0  # a serving state of another generation did not count
    monkeypatch.setattr(
        supervision, "state", lambda api, c: contract.Supervised.of({"state": "starting", "generation": "g1"})
    )
    monkeypatch.setattr(serve_stage, "SUPERVISOR_CONFIRM_S", 0.5)
    with pytest.raises(StageError, match="the supervisor has not seen it serve within 1.5s .its state: starting"):
        serve_stage.wait_ready(r)


def test_a_peer_whose_memory_report_does_not_answer_is_journalled_once_and_reported(tmp_path, monkeypatch):
    """Issue 23: a peer whose report does not answer is "memory unknown", never "not low"."""
    from sparkcluster.node import memreport

    monkeypatch.setattr(supervisor, "STATE_PATH", str(tmp_path / "state"))
    answers = {"198.19.2.2": (None, "its memory report at 198.19.2.2:8297 does not answer (timed out)")}
    monkeypatch.setattr(supervisor, "peer_memory", lambda ip, port, seen=None: answers.get(ip, (64 * 2**30, "")))
    monkeypatch.setattr(memreport, "peer_memory", supervisor.peer_memory)
    cfg = {"node": "spark-head", "report_port": 8297, "peers": [{"name": "spark-worker", "ip": "198.19.2.2"}]}
    sup = supervisor.Supervisor(cfg, Journal(str(tmp_path / "journal")))
    policy = contract.Policy()
    assert sup.low_memory(policy) == {} and sup.low_memory(policy) == {}
    assert "spark-worker" in sup.memory_unknown
    sup.save()
    assert "spark-worker" in json.loads(Path(tmp_path / "state").read_text())["memory_unknown"]
    answers.clear()
    sup.low_memory(policy)
    events = [json.loads(x)["event"] for x in (tmp_path / "journal").read_text().splitlines()]
    assert events == ["memory unknown", "memory known again"]


def test_the_heads_report_carries_the_supervisors_state_for_the_gateway(tmp_path, monkeypatch):
    """Issue 36: the gateway reads the supervisor's verdict from the head agent's report."""
    import json
    import subprocess

    from sparkcluster.node import agent

    state = tmp_path / "supervisor.json"
    state.write_text(json.dumps({"state": "restarting", "causes": [{"cause": "wedged"}]}))
    monkeypatch.setattr(agent, "STATE_PATH", str(state))
    ray = subprocess.Popen(["true"])
    ray.wait()
    sup = agent.Supervisor({"node": "spark-head", "role": "head"}, journal=None)
    head = agent.report({"node": "spark-head"}, ray, 1.0, sup, None)
    assert head["supervisor"]["state"] == "restarting" and head["mem_available"] > 0
    assert "supervisor" not in agent.report({"node": "spark-worker"}, ray, 1.0, None, None)


def test_a_verdict_is_published_before_the_engine_is_stopped(tmp_path, monkeypatch):
    """Issue 36: the stop may take the whole stop grace; the state file must say the verdict
    meanwhile, so the gateway takes the deployment out of rotation at once."""
    from types import SimpleNamespace

    for name in ("RECORD_PATH", "STATE_PATH", "DESIRED_PATH"):
        monkeypatch.setattr(supervisor, name, str(tmp_path / name.lower()))
    Path(supervisor.DESIRED_PATH).write_text(json.dumps({"generation": "g1", "argv": ["x"], "port": 1, "model": "m"}))
    sup = supervisor.Supervisor({"node": "n"}, Journal(str(tmp_path / "journal")))
    sup.generation, sup.state, sup.first_start = "g1", contract.SERVING, False
    sup.proc, sup.watch = SimpleNamespace(pid=4242), ready_watch()
    monkeypatch.setattr(sup, "look", lambda desired, policy: Look(now=time.time(), alive=True))
    monkeypatch.setattr(supervisor, "verdict", lambda w, look, policy: ("wedged", "no progress for 60s"))
    seen = {}

    def stop(why, verdict=False):
        seen.update(json.loads(Path(supervisor.STATE_PATH).read_text()))
        sup.proc = None

    monkeypatch.setattr(sup, "stop", stop)
    sup.tick()
    assert seen["state"] == contract.SERVING and seen["causes"][-1]["cause"] == "no progress for 60s"
    assert seen["causes"][-1]["ts"] >= seen["since"]
    assert json.loads(Path(supervisor.STATE_PATH).read_text())["state"] == contract.RESTARTING
