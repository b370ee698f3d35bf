"""The engine's log read for its ranks (issue 59): the all-reduce backend each rank chose, judged against
the profile, and each rank's warm-up phase; the CX7's AER counters (node/aer) read, exported and
journalled. Captures: tests/captured/README (vLLM's and the RoCEnante shim's lines)."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import cap

from sparkcluster.node import aer, engine_log, metrics, supervisor
from sparkcluster.node.journal import Journal

ROCE_ON = {"VLLM_ENABLE_ROCE_ALLREDUCE": "1"}


# --- the all-reduce backend ---------------------------------------------------------------------


def test_pynccl_on_both_ranks_is_reported_and_fine_without_a_request():
    ar = engine_log.all_reduce({"head": cap("vllm-allreduce-pynccl-tp2.log")})
    assert ar.serving() == "PYNCCL" and len(ar.using) == 2
    assert "B12X_ROCENANTE" in ar.potential
    status, what, fix = engine_log.judge_all_reduce(ar, {})
    assert status == "ok" and "PYNCCL serves the tp:0 all-reduce (2 rank(s) reported)" in what and not fix


def test_a_profile_asking_for_rocenante_while_ranks_run_pynccl_fails_with_its_reason():
    ar = engine_log.all_reduce({"head": cap("vllm-allreduce-rocenante-disabled.log")})
    status, what, fix = engine_log.judge_all_reduce(ar, ROCE_ON)
    assert status == "fail"
    assert "VLLM_ENABLE_ROCE_ALLREDUCE=1" in what and "B12X_ROCENANTE" in what
    assert "b12x.comm.roce is not importable" in what  # the shim's own reason, from the vote
    assert "remove VLLM_ENABLE_ROCE_ALLREDUCE" in fix and "sparkcluster up" in fix


def test_rocenante_serving_on_every_rank_passes_the_request():
    ar = engine_log.all_reduce({"head": cap("vllm-allreduce-rocenante.log")})
    assert ar.serving() == "B12X_ROCENANTE"
    assert engine_log.judge_all_reduce(ar, ROCE_ON)[0] == "ok"


def test_ranks_that_disagree_fail_naming_each_list():
    ok = cap("vllm-allreduce-rocenante.log").splitlines()
    pyn = cap("vllm-allreduce-pynccl-tp2.log").splitlines()
    # the head's rank took RoCEnante, the worker's (its own serve log under mp) PYNCCL
    ar = engine_log.all_reduce({"head": ok[1], "worker": pyn[1]})
    status, what, fix = engine_log.judge_all_reduce(ar, {})
    assert status == "fail" and "disagree" in what
    assert "head: Worker_TP0" in what and "worker: Worker_TP1" in what and "doctor" in fix


def test_the_cpu_engine_prints_none_not_reported():
    # the testbed's engine (vLLM 0.32's CPU build) names no all-reduce backend
    text = cap("vllm-0.32-cpu-compile.log") + cap("vllm-0.32-ray-worker-sigill.log")
    ar = engine_log.all_reduce({"head": text})
    assert not ar.reported()
    assert engine_log.judge_all_reduce(ar, ROCE_ON) == (
        "unknown",
        "not reported (the engine printed no all-reduce backend line)",
        "",
    )


def test_the_older_line_without_dispatch_order_is_read_too():
    line = "(Worker pid=56) INFO 09-04 10:59:02 [cuda_communicator.py:266] Using ['PYNCCL'] all-reduce backends for group 'tp:0'"
    assert engine_log.all_reduce({"n": line}).serving() == "PYNCCL"


# --- the warm-up phases -------------------------------------------------------------------------


def test_phases_follow_each_rank_from_vllms_lines():
    ph = engine_log.phases({"head": cap("vllm-0.32-compile-miss.log")})
    # both TP ranks compiled; the engine core's lines are not a rank's
    assert set(ph) == {"Worker_TP0 pid=655", "Worker_TP1 pid=656"}
    assert set(ph.values()) == {"compile"}
    cpu = engine_log.phases({"head": cap("vllm-0.32-cpu-aot-cold.log")})
    assert list(cpu.values()) == ["ready"]  # "Warming up done."


def test_ranks_apart_are_named_with_their_phases_and_timed():
    texts = {"head": cap("vllm-warmup-drift-head.log"), "worker": cap("vllm-warmup-drift-worker.log")}
    ph = engine_log.phases(texts)
    assert engine_log.drifted(ph)
    text = engine_log.drift_text(ph)
    assert "worker: Worker pid=454: autotuning" in text and "head: Worker pid=611: graph capture" in text
    clock = engine_log.DriftClock()
    assert clock.see(ph, 100.0) == 0.0 and clock.see(ph, 400.0) == 300.0
    assert clock.see({"a": "ready", "b": "ready"}, 500.0) == 0.0 and clock.since is None


def test_the_grep_picks_every_phase_and_backend_line():
    import re

    wanted = re.compile(engine_log.WANTED)
    for _, pats in engine_log.PHASES:
        for p in pats:
            assert wanted.search(f"(Worker pid=1) INFO 1 [x.py:1] {p} 3"), p
    assert wanted.search(cap("vllm-allreduce-pynccl-tp2.log"))
    # the engine's config line names FlashInfer's autotune switch: not a phase
    assert engine_log.phases({"h": "(EngineCore pid=1) INFO ... enable_flashinfer_autotune=True"}) == {}


# --- the CX7's AER counters ----------------------------------------------------------------------

# documented shape (Linux Documentation/ABI/testing/sysfs-bus-pci-devices-aer_stats, drivers/pci/pcie/aer.c):
# a count per error type, then the TOTAL_ line
COR = "RxErr 0\nBadTLP 2\nBadDLLP 0\nRollover 0\nTimeout 1\nNonFatalErr 0\nCorrIntErr 0\nHeaderOF 0\nTOTAL_ERR_COR 3\n"
FATAL = "Undefined 0\nDLP 0\nSDES 0\nTLP {n}\nFCP 0\nCmpltTO 0\nCmpltAbrt 0\nUnxCmplt 0\nRxOF 0\nMalfTLP 0\nECRC 0\nUnsupReq 0\nACSViol 0\nUncorrIntErr 0\nBlockedTLP 0\nAtomicOpBlocked 0\nTLPBlockedErr 0\nTOTAL_ERR_FATAL {n}\n"
NONFATAL = "Undefined 0\nTOTAL_ERR_NONFATAL 0\n"


def sysfs(tmp_path: Path, fatal: int = 0) -> Path:
    """A CX7 function under its root port, as sysfs links them (the HCA's device -> the PCI function)."""
    port = tmp_path / "devices" / "pci0000:00" / "0000:00:00.0"
    fn = port / "0000:01:00.0"
    fn.mkdir(parents=True)
    for d, f in ((fn, fatal), (port, 0)):
        (d / "aer_dev_correctable").write_text(COR)
        (d / "aer_dev_fatal").write_text(FATAL.format(n=f))
        (d / "aer_dev_nonfatal").write_text(NONFATAL)
    ib = tmp_path / "class" / "infiniband"
    for hca in ("rocep1s0f0", "rocep1s0f1"):  # two HCAs on one function count once
        (ib / hca).mkdir(parents=True)
        (ib / hca / "device").symlink_to(fn)
    return ib


def test_aer_reads_the_function_and_its_port(tmp_path):
    got = aer.read(str(sysfs(tmp_path, fatal=1)))
    assert [(d["role"], d["pci"], d["fatal"], d["correctable"]) for d in got.values()] == [
        ("function", "0000:01:00.0", 1, 3),
        ("port", "0000:00:00.0", 0, 3),
    ]
    assert aer.read(str(tmp_path / "none")) == {}


def test_a_rise_is_journalled_by_the_supervisor_once(tmp_path, monkeypatch):
    ib = sysfs(tmp_path)
    monkeypatch.setattr(aer, "IB_ROOT", str(ib))
    monkeypatch.setattr(aer.read, "__defaults__", (str(ib),))
    sup = supervisor.Supervisor({"node": "head", "peers": []}, Journal(str(tmp_path / "journal")))
    sup.watch_aer(0.0)  # the first read is the baseline: counts since boot are doctor's
    fn = tmp_path / "devices" / "pci0000:00" / "0000:00:00.0" / "0000:01:00.0"
    (fn / "aer_dev_fatal").write_text(FATAL.format(n=2))
    sup.reports["worker"] = {"aer": {"/w": {"hca": "rocep1s0f0", "role": "function", "pci": "x", "fatal": 0}}}
    sup.watch_aer(10.0)  # within AER_EVERY_S: not read
    sup.watch_aer(aer.AER_EVERY_S + 1)
    sup.watch_aer(2 * aer.AER_EVERY_S + 2)  # no further rise: nothing more
    rows = [json.loads(x) for x in (tmp_path / "journal").read_text().splitlines()]
    assert [(r["event"], r["node"], r["severity"], r["before"], r["now"]) for r in rows] == [
        ("cx7 aer", "head", "fatal", 0, 2)
    ]
    assert sup.counts == {"aer:fatal": 1}


def test_aer_counters_are_exported_per_device_and_kind(tmp_path):
    got = aer.read(str(sysfs(tmp_path, fatal=1)))
    text = metrics.render(metrics.node_samples({}, "", False, [], None, {}, got))
    assert (
        'sparkcluster_cx7_aer_errors_total{hca="rocep1s0f0",pci="0000:01:00.0",role="function",kind="fatal"} 1' in text
    )
    assert "# TYPE sparkcluster_cx7_aer_errors_total counter" in text


def test_the_supervisor_journals_the_backend_when_it_serves(tmp_path, monkeypatch):
    log = tmp_path / "serve.log"
    log.write_text("old lines\n" + f"{engine_log.SERVE_MARK} x\n" + cap("vllm-allreduce-rocenante-disabled.log"))
    monkeypatch.setattr(supervisor, "SERVE_LOG", str(log))
    monkeypatch.setenv("VLLM_ENABLE_ROCE_ALLREDUCE", "1")
    sup = supervisor.Supervisor({"node": "head", "peers": []}, Journal(str(tmp_path / "journal")))
    sup.log_offset = len("old lines\n")
    sup.journal_all_reduce()
    (row,) = [json.loads(x) for x in (tmp_path / "journal").read_text().splitlines()]
    assert row["event"] == "all-reduce" and row["status"] == "fail" and row["backend"] == "PYNCCL"
    assert "VLLM_ENABLE_ROCE_ALLREDUCE" in row["fix"]


# --- the controller's reads: status, up, the profile ------------------------------------------------


def test_the_reader_prints_the_env_and_this_starts_lines_only(tmp_path, monkeypatch):
    import subprocess

    from sparkcluster.node import container_status

    log = tmp_path / "serve.log"
    log.write_text(
        cap("vllm-allreduce-rocenante.log")
        + f"{engine_log.SERVE_MARK} t\n"
        + "noise\n"
        + cap("vllm-allreduce-rocenante-disabled.log")
    )
    monkeypatch.setattr(container_status, "SERVE_LOG", str(log))
    out = subprocess.run(
        ["sh", "-c", container_status.engine_reader()],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "VLLM_ENABLE_ROCE_ALLREDUCE": "1"},
        check=True,
    ).stdout
    env, text = container_status.engine_text(out)
    assert env == {"VLLM_ENABLE_ROCE_ALLREDUCE": "1"}
    assert text == cap("vllm-allreduce-rocenante-disabled.log").rstrip("\n")


def test_status_names_the_backend_and_fails_a_request_the_ranks_ignored():
    from sparkcluster.status import status

    st = status.ClusterStatus("c", "healthy", [])
    env_on = "ENV VLLM_ENABLE_ROCE_ALLREDUCE=1\n"
    status.ranks_read(st, {"head": env_on + cap("vllm-allreduce-rocenante-disabled.log")}, {"state": "serving"})
    assert st.state == "degraded" and st.all_reduce == "" and not st.phases
    assert "all-reduce: the profile sets VLLM_ENABLE_ROCE_ALLREDUCE=1" in st.problems[0]
    ok = status.ClusterStatus("c", "healthy", [])
    status.ranks_read(ok, {"head": "ENV VLLM_ENABLE_ROCE_ALLREDUCE=\n" + cap("vllm-allreduce-pynccl-tp2.log")}, None)
    assert ok.state == "healthy" and ok.all_reduce == "PYNCCL" and not ok.problems
    cpu = status.ClusterStatus("c", "healthy", [])
    status.ranks_read(cpu, {"head": cap("vllm-0.32-cpu-compile.log")}, {"state": "serving"})
    assert cpu.all_reduce == "not reported" and not cpu.problems


def test_status_shows_each_ranks_phase_while_the_engine_starts():
    from sparkcluster.status import status

    st = status.ClusterStatus("c", "healthy", [])
    outs = {"head": cap("vllm-warmup-drift-head.log"), "worker": cap("vllm-warmup-drift-worker.log")}
    status.ranks_read(st, outs, {"state": "starting"})
    assert st.phases == {"head: Worker pid=611": "graph capture", "worker: Worker pid=454": "autotuning"}


class _Out:
    def __init__(self, value):
        self.ok, self.value = True, value


class _Cluster:
    def __init__(self, outs):
        self.outs, self.hosts = outs, {n: n for n in outs}

    def each(self, fn, hosts=None):
        return {n: _Out(o) for n, o in self.outs.items()}


def _run(outs, drift_s=300):
    from types import SimpleNamespace

    inv = SimpleNamespace(
        nodes=[SimpleNamespace(name=n) for n in outs],
        cluster=SimpleNamespace(name="c"),
        head=SimpleNamespace(name="head"),
    )
    plan = SimpleNamespace(
        profile=SimpleNamespace(warmup_drift_s=drift_s), serve=SimpleNamespace(describe=lambda: "vllm serve")
    )
    return SimpleNamespace(cluster=_Cluster(outs), inv=inv, plan=plan)


def test_up_names_ranks_apart_past_the_bound_before_the_barrier():
    import pytest

    from sparkcluster.errors import StageError
    from sparkcluster.up.stages import serve

    r = _run({"head": cap("vllm-warmup-drift-head.log"), "worker": cap("vllm-warmup-drift-worker.log")})
    watch = serve.WarmupWatch(r)
    watch("not ready", 20.0)  # apart since this read
    watch("not ready", 25.0)  # within EVERY_S: not read
    watch("not ready", 200.0)
    with pytest.raises(StageError) as e:
        watch("not ready", 330.0)
    f = e.value.failures[0]
    assert "different warm-up phases for 310s" in f.reason
    assert "head: Worker pid=611: graph capture" in f.reason and "worker: Worker pid=454: autotuning" in f.reason
    assert "flashinfer_autotune_sync" in f.fix
    serve.WarmupWatch(_run(dict(r.cluster.outs), drift_s=0))("not ready", 10_000.0)  # 0: not judged


def test_up_fails_a_profile_whose_rocenante_no_rank_runs():
    import pytest

    from sparkcluster.errors import StageError
    from sparkcluster.up.stages import serve

    on = "ENV VLLM_ENABLE_ROCE_ALLREDUCE=1\n"
    r = _run({"head": on + cap("vllm-allreduce-rocenante-disabled.log"), "worker": on})
    r.cluster.each = lambda fn, hosts=None: _Values({n: _Out(o) for n, o in r.cluster.outs.items()})
    with pytest.raises(StageError) as e:
        serve.engine_all_reduce(r)
    assert "B12X_ROCENANTE" in e.value.failures[0].reason and "sparkcluster up" in e.value.fix
    ok = _run({"head": cap("vllm-allreduce-rocenante.log"), "worker": ""})
    ok.cluster.each = lambda fn, hosts=None: _Values({n: _Out(o) for n, o in ok.cluster.outs.items()})
    assert serve.engine_all_reduce(ok) == "B12X_ROCENANTE"


class _Values(dict):
    def values_or_raise(self, stage):
        return {n: o.value for n, o in self.items()}


def test_a_profile_sets_flashinfers_autotune_sync_once():
    import pytest
    from pydantic import ValidationError

    from sparkcluster.config import profile as profiles

    assert profiles.EnvSettings(flashinfer_autotune_sync=False).variables() == {
        "VLLM_FLASHINFER_AUTOTUNE_DISTRIBUTED_SYNC": "0"
    }
    assert profiles.EnvSettings().variables() == {}
    with pytest.raises(ValidationError, match="remove it from env.forward"):
        profiles.EnvSettings(flashinfer_autotune_sync=True, forward={"VLLM_FLASHINFER_AUTOTUNE_DISTRIBUTED_SYNC": "1"})


def test_status_reads_the_ranks_of_a_running_server_end_to_end():
    """Through the judge of every node's report: a running server (PID), each node's engine section."""
    from conftest import make_inventory

    from sparkcluster.deployment.endpoint import EngineView
    from sparkcluster.status import status

    inv = make_inventory()
    reports = {}
    for n, log in zip(inv.nodes, ("vllm-warmup-drift-head.log", "vllm-warmup-drift-worker.log"), strict=False):
        st = status.NodeStatus(n.name, container=f"c-{n.name}", state="running")
        head = n.name == inv.head.name
        view = (4242, {"state": "starting", "updated": 0}, []) if head else (None, None, [])
        reports[n.name] = status.NodeReport(
            st, [], None, view, "", None, None, "ENV VLLM_ENABLE_ROCE_ALLREDUCE=\n" + cap(log)
        )
    got = status._judge_reports(inv, reports, {}, {}, EngineView(health=None))
    assert got.all_reduce == "not reported"
    assert set(got.phases.values()) == {"graph capture", "autotuning"}
