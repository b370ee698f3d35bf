"""A failed engine's first failure, read from its log (issue 62): the captured text each known cause's
public report shows (tests/captured/README.md says where each came from)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sparkcluster.deployment import failed_serve
from sparkcluster.node import engine_failure

CAPTURED = Path(__file__).resolve().parents[1] / "captured"


def read(name: str) -> engine_failure.Failure:
    found = engine_failure.read((CAPTURED / name).read_text())
    assert found is not None
    return found


def test_the_engine_cores_oom_is_first_and_the_shutdown_is_left_out():
    f = read("vllm-enginecore-oom-backport-24.log")
    assert f.first.text.startswith(
        "RuntimeError: Worker failed with error 'CUDA out of memory. Tried to allocate 2.96 GiB"
    )
    assert f.first.proc == "EngineCore pid=162129" and f.first.ts == "08-14 16:06:55"
    assert [ln.text for ln in f.lines][1].startswith("Worker proc VllmWorker-2 died unexpectedly")
    assert not any("waiting for worker exit" in ln.text or ln.text.startswith("Traceback") for ln in f.lines)
    assert f.cause().id == "out-of-memory"


def test_a_ray_workers_exception_names_its_rank_and_address_not_its_frames():
    f = read("vllm-ray-worker-oom-15598.log")
    assert len(f.lines) == 1, f.lines  # the frames, source lines and markers are not failures
    assert f.first.text.startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 MiB")
    assert (f.first.proc, f.first.ip) == ("RayWorkerWrapper pid=206994", "192.168.10.25")
    assert f.cause().id == "out-of-memory"


@pytest.mark.parametrize(
    "name, cause",
    [
        ("vllm-gb10-no-kernel-image-30855.txt", "no-kernel-image"),
        ("nccl/published-modify-qp-61-spark-pair.txt", "nccl-init"),
        ("vllm-47397-ptx-gb10.txt", "ptx-toolchain"),
        ("langx101-ngc-spark-ptx.txt", "ptx-toolchain"),
        ("vllm-31700-ptx-enginecore.log", "ptx-toolchain"),
        ("nunif-702-driver-insufficient.txt", "driver-too-old"),
        ("faster-whisper-1278-driver-insufficient.txt", "driver-too-old"),
        ("fooocus-1313-driver-too-old.txt", "driver-too-old"),
    ],
)
def test_known_causes_from_their_public_reports(name, cause):
    f = read(name)
    assert f.cause().id == cause
    assert f.cause().fix and f.cause().source


def test_the_nccl_failure_keeps_ncclS_own_line_first():
    f = read("nccl/published-modify-qp-61-spark-pair.txt")
    assert f.first.text.startswith("NCCL WARN Call to ibv_modify_qp failed with 61")
    assert any(ln.text == "RuntimeError: NCCL error: unhandled system error" for ln in f.lines)


def test_a_healthy_start_reports_no_failure():
    assert engine_failure.read((CAPTURED / "vllm-0.32-compile-hit.log").read_text()) is None


def test_the_same_line_from_every_rank_is_said_once():
    text = "\n".join(
        f"(RayWorkerWrapper pid={p}, ip=10.0.0.{p}) ERROR 01-01 00:00:0{p} [x.py:1] ValueError: bad" for p in (1, 2)
    )
    f = engine_failure.read(text)
    assert len(f.lines) == 1 and f.first.ip == "10.0.0.1"


# --- the controller's side: logs kept before the rollback, the first failure named -----------------


def test_logs_are_kept_for_the_owner_only_and_the_newest_ten_stay(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    oom = (CAPTURED / "vllm-ray-worker-oom-15598.log").read_text()
    for i in range(12):
        kept = failed_serve.keep(
            "testbed@spark-head+spark-worker", {"spark-head": oom, "spark-worker": ""}, now=1e9 + i
        )
    folders = sorted(failed_serve.root().iterdir())
    assert len(folders) == failed_serve.KEEP and folders[-1] == kept.folder == failed_serve.newest()
    assert (kept.folder / "spark-head.log").read_text() == oom
    assert os.stat(kept.folder).st_mode & 0o777 == 0o700
    assert os.stat(kept.folder / "spark-head.log").st_mode & 0o777 == 0o600
    reason, lines = kept.error({"192.168.10.25": "spark-worker"})
    # the rank's address says the node it ran on, though the head's log carried it (Ray forwards it)
    assert reason.startswith("a rank ran out of memory") and "(RayWorkerWrapper pid=206994 on spark-worker)" in reason
    assert lines.startswith("[RayWorkerWrapper pid=206994 on spark-worker] torch.OutOfMemoryError")


def test_the_first_failure_across_nodes_is_the_earliest_stamped():
    late = "(x pid=1) ERROR 01-01 00:00:09 [a.py:1] RuntimeError: second"
    early = "(y pid=2) ERROR 01-01 00:00:01 [a.py:1] RuntimeError: first"
    node, f = failed_serve.first_failure({"spark-head": late, "spark-worker": early})
    assert node == "spark-worker" and f.first.text == "RuntimeError: first"


def test_the_supervisor_journals_the_engines_own_first_failure(tmp_path):
    from sparkcluster.node import supervisor

    log = tmp_path / "vllm-serve.log"
    log.write_text(
        "INFO 01-01 00:00:00 [api_server.py:1] starting\n" + (CAPTURED / "vllm-ray-worker-oom-15598.log").read_text()
    )
    fields = supervisor.first_failure(str(log))
    assert fields["first_failure"].startswith("torch.OutOfMemoryError: CUDA out of memory")
    assert fields["rank"] == "RayWorkerWrapper pid=206994" and fields["rank_ip"] == "192.168.10.25"
    assert fields["known_cause"] == "out-of-memory" and fields["fix"]
    assert supervisor.first_failure(str(tmp_path / "absent.log")) == {}


def test_a_ray_worker_killed_by_sigill_is_named_by_its_own_line_not_rays_report():
    """Real: the testbed's vLLM 0.32 (TP=2 over Ray) whose worker rank got SIGILL while `up` waited
    (tests/captured/README.md): Ray forwards its "(raylet) A worker died" before the rank's own lines,
    each in ANSI colours; the rank's SIGILL is the first failure, on the worker's address."""
    f = read("vllm-0.32-ray-worker-sigill.log")
    assert f.first.text == "*** SIGILL received at time=1795844486 on cpu 0 ***"
    assert (f.first.proc, f.first.ip) == ("RayWorkerProc pid=242", "198.19.2.2")
    assert f.cause().id == "illegal-instruction"
    assert f.lines[0].proc == "raylet" and f.lines[0].ip == "198.19.2.2"  # Ray's report, still shown, in order
    assert any(ln.text == "Fatal Python error: Illegal instruction" for ln in f.lines)
    assert not any("stopping" in ln.text.lower() or "shutting down" in ln.text.lower() for ln in f.lines)


def test_the_ptx_error_is_one_line_from_its_rank_and_its_fix_keeps_the_entrypoint():
    """vllm#31700's traceback under the engine core's prefix: the frame, its source line and marker are
    left out; the error is the first failure and the fix names what langX101's Spark needed."""
    f = read("vllm-31700-ptx-enginecore.log")
    assert [ln.text for ln in f.lines] == [
        "torch.AcceleratorError: CUDA error: the provided PTX was compiled with an unsupported toolchain."
    ]
    assert f.first.proc == "EngineCore_DP0 pid=15638" and f.first.ts == "01-05 12:12:01"
    cause = f.cause()
    assert "entrypoint" in cause.fix and "image.driver" in cause.fix
    assert "vllm-project/vllm#47397" in cause.source and "gyliu513/langX101" in cause.source
    # vllm#47397's second line, the bare error name, is not a failure line of its own
    assert len(read("vllm-47397-ptx-gb10.txt").lines) == 1


def test_the_driver_causes_say_their_captures_are_not_from_a_spark():
    cause = read("nunif-702-driver-insufficient.txt").cause()
    assert cause.source.endswith("none of them on a Spark")
