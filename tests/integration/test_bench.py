"""`sparkcluster bench` on the testbed (issue 18): a real `vllm bench serve` in the head container
against the real engine, the run folder it leaves (CSV checked against each level's raw JSON, run.json,
chart.png), the table, the comparison with the previous run, no API key on any command line, Ctrl-C
stopping the benchmark inside the container, and the bad inputs.

One `up` for the class, a no-op when the cluster already serves the `testbed` profile (test_up's,
when the whole suite runs); the class leaves it serving for test_supervisor. `bench` with no
cluster serving is a unit test (tests/unit/test_bench.py).
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.conftest import CLI
from tests.integration.helpers import API_KEY, wait_for
from tests.integration.test_lifecycle import sc_env
from tests.unit.test_bench import assert_csv_matches_json

pytestmark = pytest.mark.testbed
HEAD = "spark-head"
BENCH_ROOT = ("sparkcluster", "bench", "testbed")  # under XDG_STATE_HOME; the testbed cluster's name
# the testbed's served model is looked up in its mounted HF cache; a testbed whose tokenizer lives
# elsewhere passes --tokenizer here
EXTRA: list[str] = []


def bench_procs(testbed) -> list[str]:
    ps = testbed.sh(HEAD, "ps -eo args").stdout.splitlines()
    return [line for line in ps if "bench serve" in line]


def runs(sc) -> list[Path]:
    root = Path(sc.state_dir).joinpath(*BENCH_ROOT)
    return sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []


@pytest.fixture(scope="class")
def serving(testbed, sc):
    # a cluster already serving the profile (another module's) is used as it is: up is then a no-op
    res = sc("up", "--profile", "testbed", "--replace", timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.usefixtures("serving")
class TestBench:
    def test_sweep_writes_csv_json_png_and_prints_the_table(self, sc):
        # short prompts and answers: what is tested is the run folder and the table, not the engine
        res = sc(
            "bench",
            "--concurrency",
            "1,4",
            "--num-prompts",
            "8",
            "--input-len",
            "64",
            "--output-len",
            "16",
            *EXTRA,
            timeout=600,
        )
        assert res.returncode == 0, res.stdout + res.stderr
        run_dir = runs(sc)[-1]
        for name in ("c1.json", "c4.json", "results.csv", "run.json", "chart.png"):
            assert (run_dir / name).is_file(), name
        assert_csv_matches_json(run_dir, [1, 4])
        assert (run_dir / "chart.png").read_bytes()[:4] == b"\x89PNG"
        rec = json.loads((run_dir / "run.json").read_text())
        assert rec["profile"] == "testbed" and len(rec["profile_hash"]) == 64
        assert rec["image_id"].startswith("sha256:") and rec["vllm_version"]
        assert set(rec["nodes"]) == {"spark-head", "spark-worker"}
        assert "out tok/s" in res.stdout and "TTFT p99" in res.stdout and str(run_dir / "chart.png") in res.stdout
        assert API_KEY not in res.stdout + res.stderr + (run_dir / "run.json").read_text()

    def test_second_run_compares_with_the_first_as_json(self, sc):
        before = runs(sc)[-1]
        res = sc(
            "bench",
            "-c",
            "1",
            "--num-prompts",
            "2",
            "--input-len",
            "64",
            "--output-len",
            "16",
            "--json",
            *EXTRA,
            timeout=600,
        )
        assert res.returncode == 0, res.stdout + res.stderr
        summary = json.loads(res.stdout)
        assert summary["compared_with"] == str(before)
        assert [r["concurrency"] for r in summary["rows"]] == [1]
        assert {c["metric"] for c in summary["changes"]} >= {"output_tok_s", "ttft_p99_ms"}

    def test_api_key_never_on_a_command_line_and_ctrl_c_stops_the_benchmark_in_the_container(
        self, testbed, sc, env_file, tmp_path
    ):
        out = tmp_path / "interrupted"
        p = subprocess.Popen(
            [
                *CLI,
                "--inventory",
                str(testbed.inventory),
                "bench",
                "-c",
                "1,2",
                "--num-prompts",
                "400",
                "--output-len",
                "256",
                "--output",
                str(out),
                *EXTRA,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=sc_env(sc, env_file),
        )
        try:
            assert wait_for(lambda: bench_procs(testbed) or p.poll() is not None, 120), "the benchmark never started"
            seen = bench_procs(testbed)
            assert seen and not any(API_KEY in line for line in seen), seen
            time.sleep(2)
            p.send_signal(signal.SIGINT)
            stdout, stderr = p.communicate(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
        assert p.returncode == 130, stdout + stderr
        assert "interrupted" in stderr
        assert wait_for(lambda: not bench_procs(testbed), 15), bench_procs(testbed)
        rec = json.loads((out / "run.json").read_text())
        assert rec["interrupted"] is True
        assert (out / "results.csv").is_file()
        assert_csv_matches_json(out, [int(p.stem[1:]) for p in sorted(out.glob("c*.json"))])
        # the endpoint still serves: stopping the benchmark never touches vllm serve
        assert sc("status", timeout=60).returncode == 0

    @pytest.mark.parametrize(
        "args, words",
        [
            (["--concurrency", "0"], "a concurrency of 0"),
            (["--profile", "qwen3-30b"], "serves profile 'testbed', not 'qwen3-30b'"),
        ],
    )
    def test_bad_input_exit_2(self, sc, args, words):
        res = sc("bench", *args, timeout=120)
        assert res.returncode == 2, res.stdout + res.stderr
        assert words in res.stderr and "fix:" in res.stderr
