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


# Real: local-inference-lab/b12x docs/evidence/rocenante/serving-ab-20261001-3spark-ring/ (three Sparks,
# DeepSeek-V4.1-Flash TP3), rank 0's startup lines per arm: nccl-startup.txt (commit 826eb42,
# VLLM_ENABLE_ROCE_ALLREDUCE=0) and roce-startup.txt (commit fbd8235, =1; its second line is cut into by
# NCCL's own output, "ahazidgx1:205:386 [0] NCCL I(Worker pid=205) INFO ...").
NCCL_ARM = "b12x-rocenante-ring-nccl-startup.txt"
ROCE_ARM = "b12x-rocenante-ring-roce-startup.txt"


def test_pynccl_is_reported_and_fine_without_a_request():
    ar = engine_log.all_reduce({"head": cap(NCCL_ARM)})
    assert ar.serving() == "PYNCCL" and list(ar.using) == ["Worker pid=204"]
    assert ar.potential[:3] == ("FLASHINFER_PCIE_IPC", "B12X_PCIE", "B12X_ROCENANTE")
    status, what, fix = engine_log.judge_all_reduce(ar, {})
    assert status == "ok" and "PYNCCL serves the tp:0 all-reduce (1 rank(s) reported)" in what and not fix


def test_a_profile_asking_for_rocenante_while_ranks_run_pynccl_fails():
    # the published NCCL arm read as if the profile had asked for RoCEnante: no reason was printed
    status, what, fix = engine_log.judge_all_reduce(engine_log.all_reduce({"head": cap(NCCL_ARM)}), ROCE_ON)
    assert status == "fail" and "Worker pid=204: ['PYNCCL'] run without B12X_ROCENANTE" in what
    assert "remove VLLM_ENABLE_ROCE_ALLREDUCE" in fix and "sparkcluster up" in fix


def test_a_profile_asking_for_rocenante_fails_with_the_shims_reason():
    # rebuilt (no published "RoCEnante disabled" line was found): the shim's warning as its source
    # writes it, then the published NCCL arm's line
    ar = engine_log.all_reduce({"head": cap("vllm-allreduce-rocenante-disabled.log")})
    status, what, fix = engine_log.judge_all_reduce(ar, ROCE_ON)
    assert status == "fail"
    assert "VLLM_ENABLE_ROCE_ALLREDUCE=1" in what and "B12X_ROCENANTE" in what
    assert "b12x.comm.roce is not importable" in what  # the shim's own reason, from the vote
    assert "remove VLLM_ENABLE_ROCE_ALLREDUCE" in fix and "sparkcluster up" in fix


def test_rocenante_serving_passes_the_request_and_a_cut_line_keeps_its_rank():
    ar = engine_log.all_reduce({"head": cap(ROCE_ARM)})
    assert ar.serving() == "B12X_ROCENANTE" and ar.serving("ep:0") == "PYNCCL"
    # the ep:0 line NCCL's output cut into is still pid 205's, not the node's; the rank is named as
    # vLLM later renames it ("(Worker_TP0 pid=205) ... RoCEnante all-reduce is live")
    assert ar.using == {"Worker_TP0 pid=205": {"tp:0": ("B12X_ROCENANTE", "PYNCCL"), "ep:0": ("PYNCCL",)}}
    assert engine_log.judge_all_reduce(ar, ROCE_ON)[0] == "ok"


def test_ranks_that_disagree_fail_naming_each_list():
    # the head's rank took RoCEnante, the worker's (its own serve log) PYNCCL: the two arms side by side
    ar = engine_log.all_reduce({"head": cap(ROCE_ARM), "worker": cap(NCCL_ARM)})
    status, what, fix = engine_log.judge_all_reduce(ar, {})
    assert status == "fail" and "disagree" in what
    assert "head: Worker_TP0 pid=205" in what and "worker: Worker pid=204" in what and "doctor" in fix


def test_a_line_cut_off_in_a_saved_log_is_still_read():
    # real: b12x docs/evidence/rocenante/serving-ab-final-20260903/nccl-startup.txt (commit 34c4a3b),
    # the line cut at "potential backe"
    ar = engine_log.all_reduce({"head": cap("b12x-rocenante-final-nccl-startup.txt")})
    assert ar.serving() == "PYNCCL" and ar.potential == ()


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


def test_the_shortened_line_owners_quote_is_read_too():
    # as owners' notes quote it (e.g. "Using ['CUSTOM', 'PYNCCL'] all-reduce backends for group 'tp:0'");
    # the prefix and the rest are the published NCCL arm's
    line = "(Worker pid=204) INFO 10-01 18:30:16 [cuda_communicator.py:420] Using ['PYNCCL'] all-reduce backends for group 'tp:0'"
    assert engine_log.all_reduce({"n": line}).serving() == "PYNCCL"


# --- the warm-up phases -------------------------------------------------------------------------


def test_phases_follow_each_rank_from_vllms_lines():
    ph = engine_log.phases({"head": cap("vllm-0.32-compile-miss.log")})
    # both TP ranks compiled; the engine core's lines are not a rank's
    assert set(ph) == {"Worker_TP0 pid=655", "Worker_TP1 pid=656"}
    assert set(ph.values()) == {"compile"}
    cpu = engine_log.phases({"head": cap("vllm-0.32-cpu-aot-cold.log")})
    assert list(cpu.values()) == ["ready"]  # "Warming up done."


def test_a_bar_after_a_bare_prefix_is_that_ranks():
    # real: vllm-project/vllm#57423's TP8 log (as quoted): FlashInfer's own logger line, vLLM's
    # kernel_warmup line, and a tqdm bar printed after its rank's prefix alone on a line, the next
    # rank's prefix at the bar's end (TP2's line, cut by the quote, says nothing)
    ph = engine_log.phases({"head": cap("vllm-57423-autotune-tp8.log")})
    assert ph == {
        "Worker_TP0_EP0 pid=641": "autotuning",
        "Worker_TP5_EP5 pid=646": "autotuning",
        "Worker_TP6_EP6 pid=647": "autotuning",
        "Worker_TP7_EP7 pid=648": "autotuning",
    }
    # real: vllm-project/vllm PR #46389: the decode graphs' bar after "(Worker_TP0 pid=2500801) "
    assert engine_log.phases({"n": cap("vllm-46389-graph-capture.log")}) == {"Worker_TP0 pid=2500801": "graph capture"}


def test_weights_and_profiling_from_published_logs():
    # real: vllm-project/vllm#38820, noonghunna/club-3090#552 (the bars under bare prefixes, then
    # "Loading weights took" and "Model loading took"); hiyouga/EasyR1#69 (vLLM 0.7's V0 lines)
    assert engine_log.phases({"n": cap("vllm-38820-weights-tp.log")}) == {"Worker_TP0 pid=34322": "compile"}
    assert engine_log.phases({"n": cap("club3090-552-weights-tp2.log")}) == {"Worker_TP0 pid=114": "compile"}
    assert engine_log.phases({"n": cap("easyr1-69-v0-profiling.log")}) == {"WorkerDict pid=55573": "profiling"}


def test_a_ray_workers_nested_prefixes_are_one_rank():
    # real: ray-project/ray PR #65486 / #66230 (vLLM under Ray Serve): the driver's prefixes stack in
    # front of the worker's; the engine core's own line is no rank's
    ph = engine_log.phases({"n": cap("ray-65486-nested-prefixes.log")})
    assert ph == {"Worker pid=29271": "autotuning"}


def test_a_worker_renamed_once_its_rank_is_known_is_one_rank():
    # real: the b12x RoCE arm prints "(Worker pid=205)" at init and "(Worker_TP0 pid=205)" once the rank
    # is assigned; club-3090#552's bars each sit under a bare "(Worker_TP0 pid=114) "
    assert {r for r, _, _ in engine_log.ranked(cap(ROCE_ARM))} == {"Worker_TP0 pid=205"}
    rows = engine_log.ranked(cap("club3090-552-weights-tp2.log"), "spark-a")
    assert {r for r, _, _ in rows} == {"spark-a: Worker_TP0 pid=114", "spark-a: Worker_TP1 pid=119"}
    assert all(named for _, _, named in rows)


def test_ranks_apart_are_named_with_their_phases_and_timed():
    # rebuilt, not captured: no published log of getainode/ainode#134's drift carries its lines (the
    # issue and PR #136 tell it in prose); each line's form is a published one (tests/captured/README)
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
    assert wanted.search(cap(NCCL_ARM))
    assert wanted.search("(Worker_TP5_EP5 pid=646)") and wanted.search("(Worker_TP0 pid=114) ")
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
        cap(ROCE_ARM) + f"{engine_log.SERVE_MARK} t\n" + "noise\n" + cap("vllm-allreduce-rocenante-disabled.log")
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
    status.ranks_read(ok, {"head": "ENV VLLM_ENABLE_ROCE_ALLREDUCE=\n" + cap(NCCL_ARM)}, None)
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
    ok = _run({"head": cap(ROCE_ARM), "worker": ""})
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
