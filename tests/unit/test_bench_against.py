"""Issue 38 through the command: `bench` writes its record, `--compare` takes a published record, the
cluster's baseline or a record file (the levels default to the record's conditions), refuses or flags
what it cannot compare, and names the likely causes when the run falls short. Against the fake head
of test_bench (its levels answer the captured vLLM 0.32 result, 100 output tok/s per concurrency)."""

from __future__ import annotations

import json

import pytest

from sparkcluster.bench import aiperf, benchy, measured, orchestrate, perf_record, results, runner, sweep
from sparkcluster.bench.orchestrate import deployment_nodes, record_for
from sparkcluster.config.profile import load_profile
from sparkcluster.errors import InputError
from tests.unit import test_bench
from tests.unit.test_bench import run


@pytest.fixture
def cli_env(tmp_path, monkeypatch):
    """test_bench's fake head and inventory (its fixture, reused)."""
    yield from test_bench.cli_env.__wrapped__(tmp_path, monkeypatch)


def record_file(
    tmp_path, output_tok_s: float, c: int = 1, n_in: int = 512, n_out: int = 128, harness="vllm-bench-serve"
):
    text = f"""
kind = "measured"
[source]
url = "elsewhere"
measured_at = 2026-11-20
[hardware]
nodes = 2
gpus = 2
accelerator = "CPU (no NVIDIA GPU seen)"
[harness]
name = "{harness}"
version = "0.32.0"
[software]
model = "sparkcluster/testbed-tiny"
[[runs]]
id = "c{c}"
[runs.conditions]
input_tokens = {n_in}
output_tokens = {n_out}
concurrency = {c}
dataset = "random"
requests = 8
[runs.figures]
output_tok_s = {output_tok_s}
"""
    p = tmp_path / "theirs.perf.toml"
    p.write_text(text)
    return p


def test_every_run_leaves_its_record_with_the_levels_it_measured(cli_env, capsys):
    rc, out, err = run(capsys, cli_env, "bench", "-c", "1,4", "--num-prompts", "8", "--repeat", "2", "--json")
    assert rc == 0, err
    summary = json.loads(out)
    rec = perf_record.load(__import__("pathlib").Path(summary["record"]))
    assert rec.kind == "measured" and rec.software.profile == "testbed" and rec.hardware.nodes == 2
    assert [(r.conditions.concurrency, r.repetitions) for r in rec.runs] == [(1, 2), (4, 2)]
    assert rec.run_at((512, 128, 4)).figures.output_tok_s == pytest.approx(400.0)
    assert rec.harness.argv[:3] == ["vllm", "bench", "serve"]


def test_compare_published_runs_the_records_conditions_and_holds(cli_env, capsys):
    """The testbed profile's shipped record is 512 in / 128 out at c1 and c4 (README's run)."""
    rc, out, err = run(capsys, cli_env, "bench", "--compare", "published", "--json")
    assert rc == 0, err
    summary = json.loads(out)
    assert [r["concurrency"] for r in summary["rows"]] == [1, 4]
    against = summary["against"]
    assert against["kind"] == "published" and against["verdict"] == "ok" and not against["refused"]
    assert {r["figure"] for r in against["ratios"]} == {"output_tok_s", "ttft_ms_p99"}
    assert against["chart"].endswith("against.png")


def test_a_run_short_of_a_record_names_the_fabric_first(cli_env, capsys, tmp_path, monkeypatch):
    theirs = record_file(tmp_path, output_tok_s=1000.0)
    facts = runner.ClusterFacts(
        nodes={"spark-head": {"kernel": "6.1"}, "spark-worker": {"kernel": "6.1"}},
        rtts={"spark-worker": (40.3, "")},
    )
    monkeypatch.setattr(orchestrate, "cluster_facts", lambda *a: facts)
    rc, out, err = run(capsys, cli_env, "bench", "--compare", str(theirs), "--output", str(tmp_path / "run"))
    assert rc == 0, err
    assert "SHORT" in out and "output_tok_s 100 against 1000 (0.10)" in out
    assert "1. [fabric] spark-worker: the round trip between the ranks" in out and "40.30 ms" in out
    assert (tmp_path / "run" / "against.png").read_bytes()[:4] == b"\x89PNG"


def test_other_conditions_are_not_compared_and_say_how_to_measure_them(cli_env, capsys, tmp_path):
    theirs = record_file(tmp_path, output_tok_s=10.0, n_in=8192, n_out=256)
    rc, out, _ = run(capsys, cli_env, "bench", "-c", "1", "--compare", str(theirs), "--json")
    against = json.loads(out)["against"]
    assert rc == 0 and against["verdict"] == "refused" and not against["ratios"]
    assert "--input-len 8192 --output-len 256 --concurrency 1" in against["refused"][0]


def test_another_harness_is_compared_only_with_a_flag(cli_env, capsys, tmp_path):
    theirs = record_file(tmp_path, output_tok_s=90.0, harness="llama-benchy")
    rc, out, _ = run(capsys, cli_env, "bench", "--compare", str(theirs), "--harness", "vllm-bench-serve")
    assert rc == 0 and "flagged harness: the record used llama-benchy 0.32.0" in out and "holds" in out


def test_a_kept_baseline_is_compared_by_default_and_on_request(cli_env, capsys):
    rc, out, _ = run(capsys, cli_env, "bench", "-c", "1", "--num-prompts", "8", "--keep-baseline")
    assert rc == 0 and "kept as this cluster's baseline for 'testbed'" in out
    assert (cli_env["root"] / "baselines" / "testbed.perf.toml").is_file()
    rc, out, _ = run(capsys, cli_env, "bench", "-c", "1", "--num-prompts", "8", "--json")
    assert json.loads(out)["against"]["kind"] == "baseline" and json.loads(out)["against"]["verdict"] == "ok"
    rc, out, _ = run(capsys, cli_env, "bench", "--compare", "baseline", "--json")
    assert [r["concurrency"] for r in json.loads(out)["rows"]] == [1]  # the baseline's own conditions


@pytest.mark.parametrize(
    "args, words",
    [
        (["--compare", "nowhere.perf.toml"], "no such performance record"),
        (["--compare", "baseline"], "keeps no baseline for profile 'testbed'"),
        (["--repeat", "0"], "--repeat 0"),
    ],
)
def test_bad_compare_targets_are_one_line_and_exit_2(cli_env, capsys, args, words):
    code, _, err = run(capsys, cli_env, "bench", *args)
    assert code == 2 and words in err and "fix:" in err


def test_a_profile_without_a_record_says_how_to_get_one(tmp_path):
    with pytest.raises(InputError) as e:
        record_for("published", None, load_profile("nemotron"), tmp_path)
    assert "ships no performance record" in e.value.message and "--keep-baseline" in e.value.fix


def test_the_deployment_spans_the_nodes_its_gpus_need():
    from sparkcluster.config.inventory import parse as parse_inventory
    from tests.unit.test_cli_errors import inventory_toml

    inv = parse_inventory(inventory_toml())
    assert deployment_nodes(inv, load_profile("testbed")) == ["spark-head", "spark-worker"]
    assert deployment_nodes(inv, load_profile("testbed-single")) == ["spark-head"]


def test_canary_is_taken_then_compared_and_a_changed_answer_exits_1(cli_env, capsys, monkeypatch):
    """`bench --canary` keeps its answers in the deployment's known-good record (the one record of its
    last good serve) and hands every check to the head container, as `up` and the supervisor do."""
    from sparkcluster.deployment import canary_watch, endpoint, known_good
    from sparkcluster.node import canary
    from sparkcluster.status.status import ClusterStatus

    deployment = "testbed@spark-head+spark-worker"
    asked, handed = [], []
    answers = [[canary.Answer(p, "ok", (1, 2)) for p in canary.PROMPTS]]

    def ask(address, port, model, secrets):
        asked.append(model)
        return answers[0]

    monkeypatch.setattr(endpoint, "ask_canary", ask)
    monkeypatch.setattr(orchestrate, "model_revision", lambda *a: "r1")
    monkeypatch.setattr(canary_watch, "hand", lambda api, container, ref, check: handed.append((container, ref, check)))
    rc, out, err = run(capsys, cli_env, "bench", "--canary")
    assert rc == 2 and "no good serve of testbed@spark-head+spark-worker is recorded" in err and not asked
    model = load_profile("testbed").model
    good = known_good.GoodRecord(deployment, "2026-11-25T10:00:00Z", "testbed", "h", "img", "0.32.0", model, "r1")
    known_good.append("pair", good)
    rc, out, err = run(capsys, cli_env, "bench", "--canary", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["canary"] == "taken" and doc["deterministic"] and len(asked) == 2  # two passes when taken
    assert asked == ["testbed-tiny", "testbed-tiny"] and not list(cli_env["root"].glob("*/results.csv"))
    (kept,) = known_good.load("pair")  # the same record, extended: not a second one
    assert kept.canary_answers() == answers[0] and kept.canary_deterministic
    assert kept.canary_taken["model_revision"] == "r1"
    assert handed[-1][1].answers == answers[0] and handed[-1][2]["state"] == "taken"
    rc, out, _ = run(capsys, cli_env, "bench", "--canary")
    assert rc == 0 and "unchanged" in out and handed[-1][2]["state"] == "same"
    answers[0] = [canary.Answer(p, "loop", (9, 9)) for p in canary.PROMPTS]
    monkeypatch.setattr(orchestrate, "model_revision", lambda *a: "r2")
    rc, out, _ = run(capsys, cli_env, "bench", "--canary", "--json")
    doc = json.loads(out)
    assert rc == 1 and doc["canary"] == "changed" and doc["problem"] and doc["since"] == ["model revision r1 -> r2"]
    # the reference stays what it was: every later check says changed until taken anew
    assert known_good.load("pair")[-1].canary_answers() != answers[0]
    from sparkcluster.cli.status_cmd import canary_line

    line = canary_line(handed[-1][2])
    assert line.startswith("canary: [bold red]changed[/] at ") and "after bench --canary" in line
    assert "since model revision r1 -> r2 (3 answer(s))" in line and "--canary-retake" in line
    assert canary_line(None) is None and ClusterStatus("pair", "healthy", []).canary is None
    rc, out, _ = run(capsys, cli_env, "bench", "--canary-retake", "--json")
    assert rc == 0 and json.loads(out)["canary"] == "taken"
    assert known_good.load("pair")[-1].canary_answers() == answers[0]


def test_status_shows_the_newest_comparison_of_the_serving_profile(cli_env, capsys, tmp_path, monkeypatch):
    from sparkcluster.cli.status_cmd import speed_line

    assert speed_line("pair", "testbed") is None
    theirs = record_file(tmp_path, output_tok_s=1000.0)
    facts = runner.ClusterFacts(nodes={"spark-head": {}, "spark-worker": {}}, rtts={"spark-worker": (40.3, "")})
    monkeypatch.setattr(orchestrate, "cluster_facts", lambda *a: facts)
    rc, _, err = run(capsys, cli_env, "bench", "--compare", str(theirs))
    assert rc == 0, err
    line = speed_line("pair", "testbed")
    assert "short" in line and "output_tok_s 0.10 of it at 512 in / 128 out at concurrency 1" in line
    assert line.endswith("likely cause: fabric") and speed_line("pair", "nemotron") is None


# ---- llama-benchy --------------------------------------------------------------------------------------

BENCHY_JSON = (test_bench.Path(__file__).resolve().parents[1] / "captured" / "llama-benchy-0.4.0-c1.json").read_text()


class HarnessAPI(test_bench.FakeAPI):
    """The fake head, answering a harness's level with its captured export, where the harness writes it:
    `venv` names the harness (its python in argv), `flag` the option that names the output, `place` where
    under it the export goes."""

    venv = log = flag = place = export = ""

    def exec_start(self, exec_id, detach=False):
        e = self.execs[exec_id]
        cmd = e["cmd"]
        if cmd[:3] == ["sh", "-c", sweep.LAUNCH] and cmd[5] == f"{self.venv}/bin/python":
            folder, argv = cmd[4], cmd[5:]
            out = next(a.split("=", 1)[1] for a in argv if a.startswith(self.flag))
            self.files[f"{folder}/pid"] = b"77\n"
            self.files[f"{folder}/bench.log"] = self.log.encode()
            self.files[self.place.format(out=out)] = self.export.encode()
            e["exit"] = 0
            return None
        return super().exec_start(exec_id, detach)


class BenchyAPI(HarnessAPI):
    venv, log, flag, place, export = benchy.VENV, "llama-benchy (0.4.0)\n", "--save-result=", "{out}", BENCHY_JSON


def test_the_argv_keeps_the_key_off_the_command_line_and_names_the_records_conditions():
    level = sweep.Level(1, 8, 8192, 256)
    target = sweep.Target("http://127.0.0.1:8000", "nvidia/qwen", "nvidia/Qwen3.6-27B-NVFP4")
    argv = benchy.bench_argv(level, target, "/tmp/x/result.json")
    assert argv[:3] == [f"{benchy.VENV}/bin/python", "-c", benchy.LAUNCHER]
    assert "--base-url=http://127.0.0.1:8000/v1" in argv and "--served-model-name=nvidia/qwen" in argv
    i = argv.index("--pp")
    assert argv[i : i + 4] == ["--pp", "8192", "--tg", "256"] and "--exact-tg" in argv and "--skip-coherence" in argv
    assert not [a for a in argv[3:] if "api-key" in a]
    setup = " ".join(benchy.setup_argv("http://mirror/simple"))
    assert f"llama-benchy=={benchy.VERSION}" in setup and "--index-url http://mirror/simple" in setup


def test_a_benchy_result_is_the_same_row_and_record_figures():
    row = benchy.row_from_result(__import__("json").loads(BENCHY_JSON), sweep.Level(1, 8, 512, 128))
    assert row["output_tok_s"] == 41.0 and row["tpot_mean_ms"] == pytest.approx(1000 / 41.0)
    assert row["prefill_tok_s"] == 2150.0 and row["ttft_mean_ms"] == 250.0 and row["completed"] == 3
    figs = measured.figures_of(row)
    assert figs["decode_tok_s"] == pytest.approx(41.0) and figs["prefill_tok_s"] == 2150.0


def test_a_llama_benchy_record_is_measured_with_llama_benchy_and_compared_unflagged(
    cli_env, capsys, tmp_path, monkeypatch
):
    api = BenchyAPI()
    monkeypatch.setattr(orchestrate, "connect", lambda inv: test_bench.FakeCluster(api))
    theirs = tmp_path / "benchy.perf.toml"
    text = record_file(tmp_path, output_tok_s=40.0, harness="llama-benchy").read_text()
    theirs.write_text(
        text.replace('version = "0.32.0"', f'version = "{benchy.VERSION}"').replace(
            '"random"', '"gutenberg:1661 (llama-benchy\'s default book)"'
        )
    )
    rc, out, err = run(capsys, cli_env, "bench", "--compare", str(theirs), "--json")
    assert rc == 0, err
    summary = json.loads(out)
    assert summary["against"]["verdict"] == "ok" and summary["against"]["flags"] == []
    rec = perf_record.load(test_bench.Path(summary["record"]))
    assert rec.harness.name == "llama-benchy" and rec.harness.version == benchy.VERSION
    installs = [c for c in api.commands() if "venv" in " ".join(c)]
    assert len(installs) == 1  # the virtualenv, once, before the levels
    for c in api.commands():
        assert test_bench.API_KEY not in " ".join(c)


def test_the_launcher_hands_llama_benchy_the_key_inside_the_process_only(tmp_path):
    """Through a real Python: a stand-in `llama_benchy` module sees the key in its argv, while the
    process's own command line (/proc/PID/cmdline, what `ps` shows) never has it."""
    import subprocess
    import sys

    pkg = tmp_path / "llama_benchy"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text(
        "import os, sys\n"
        "cmdline = open(f'/proc/{os.getpid()}/cmdline', 'rb').read().decode().split('\\0')\n"
        "print(repr(sys.argv[1:]), 'sk-launch' in ' '.join(cmdline))\n"
    )
    env = {"PYTHONPATH": str(tmp_path), "OPENAI_API_KEY": "sk-launch", "PATH": "/usr/bin:/bin"}
    got = subprocess.run(
        [sys.executable, "-c", benchy.LAUNCHER, "--pp", "64"], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert got.strip() == "['--pp', '64', '--api-key', 'sk-launch'] False"
    env.pop("OPENAI_API_KEY")
    got = subprocess.run([sys.executable, "-c", benchy.LAUNCHER, "--pp", "64"], env=env, capture_output=True, text=True)
    assert got.stdout.strip() == "['--pp', '64'] False"


def test_the_comparison_is_drawn_beside_the_published_figures_from_made_up_figures(tmp_path, monkeypatch):
    """Item 5: against.png draws each figure in its own panel and unit, the record's bar beside yours,
    and against.csv holds the same rows; made-up figures shaped like a recipe's performance.yaml."""
    import csv
    import struct

    from sparkcluster.bench import against, results

    cond = "8192 in / 256 out at concurrency 1"
    st = against.Standing(
        "https://github.com/NVIDIA/local-ai-inference-recipes/.../performance.yaml",
        10.0,
        ratios=[
            against.Ratio("c1", cond, 1, "ttft_ms_p50", 5200.0, 4535.0, 0.872, True, 10.0),
            against.Ratio("c1", cond, 1, "prefill_tok_s", 1500.0, 1806.92, 0.830, True, 10.0),
            against.Ratio("c1", cond, 1, "decode_tok_s", 44.1, 43.58, 1.012, False, 10.0),
        ],
        flags=["another harness: aiperf 0.12.0 against vllm-bench-serve"],
    )
    drawn = against.panels(st)
    assert list(drawn) == ["decode_tok_s", "prefill_tok_s", "ttft_ms_p50"]  # the record format's order
    assert drawn["prefill_tok_s"] == [against.Bar("c1\n8192 in / 256 out", 1806.92, 1500.0, 0.830, True)]
    assert against.unit("decode_tok_s") == "tok/s" and against.unit("ttft_ms_p50").startswith("ms")
    three, one = tmp_path / "three.png", tmp_path / "one.png"
    assert (
        against.write_chart(three, st, "qwen36-27b-nvfp4-tp2: yours against the published record", "published") is None
    )
    single = against.Standing(st.source, 10.0, ratios=st.ratios[2:])
    assert against.write_chart(one, single) is None

    def width(p):
        data = p.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        return struct.unpack(">I", data[16:20])[0]

    assert width(three) > width(one)  # a panel per figure
    against.write_csv(tmp_path / "against.csv", st)
    rows = list(csv.DictReader((tmp_path / "against.csv").open()))
    assert [r["figure"] for r in rows] == ["ttft_ms_p50", "prefill_tok_s", "decode_tok_s"]
    assert rows[1]["yours"] == "1500.0" and rows[1]["record"] == "1806.92" and rows[1]["short"] == "True"
    assert "nothing was comparable" in against.write_chart(tmp_path / "none.png", against.Standing("s", 10.0))
    monkeypatch.setattr(results, "pyplot", lambda: None)  # the same path as chart.png: one note for both
    assert "matplotlib is not installed" in against.write_chart(tmp_path / "x.png", st)
    assert "matplotlib is not installed" in results.write_chart(tmp_path / "y.png", [{"concurrency": 1}])


# ---- aiperf (opt-in) -----------------------------------------------------------------------------------

AIPERF_JSON = (test_bench.Path(__file__).resolve().parents[1] / "captured" / "aiperf-0.13.0-c2.json").read_text()


class AiperfAPI(HarnessAPI):
    venv, log, flag = aiperf.VENV, "aiperf 0.13.0\n", "--output-artifact-dir="
    place, export = f"{{out}}/{aiperf.EXPORT_FILE}", AIPERF_JSON


def test_the_aiperf_argv_keeps_the_key_off_the_command_line_and_names_the_levels_conditions():
    level = sweep.Level(4, 16, 8192, 256)
    target = sweep.Target("http://127.0.0.1:8000", "nvidia/qwen", "/root/.cache/huggingface/hub/models--q/snapshots/a")
    argv = aiperf.bench_argv(level, target, "/tmp/x/c4")
    assert argv[:4] == [f"{aiperf.VENV}/bin/python", "-c", aiperf.LAUNCHER, "profile"]
    assert "--url=http://127.0.0.1:8000" in argv and "--model=nvidia/qwen" in argv
    assert "--tokenizer=/root/.cache/huggingface/hub/models--q/snapshots/a" in argv and "--streaming" in argv
    assert argv[argv.index("--isl") + 1] == "8192" and argv[argv.index("--osl") + 1] == "256"
    assert argv[argv.index("--concurrency") + 1] == "4" and argv[argv.index("--request-count") + 1] == "16"
    assert "--extra-inputs=ignore_eos:true,min_tokens:256" in argv
    assert "--output-artifact-dir=/tmp/x/c4/aiperf" in argv
    assert aiperf.result_path("/tmp/x/c4") == "/tmp/x/c4/aiperf/profile_export_aiperf.json"
    assert not [a for a in argv[3:] if "api-key" in a]
    setup = " ".join(aiperf.setup_argv("http://mirror/simple"))
    assert f"aiperf=={aiperf.VERSION}" in setup and "--index-url http://mirror/simple" in setup
    assert f"python3 -m venv {aiperf.VENV}" in setup and "--index-url" not in " ".join(aiperf.setup_argv())


def test_an_aiperf_summary_is_the_same_row_and_record_figures():
    """Real aiperf 0.13.0 output (tests/captured/README.md: a loopback stand-in server, figures meaningless)."""
    doc = json.loads(AIPERF_JSON)
    row = aiperf.row_from_result(doc, sweep.Level(2, 6, 64, 16))
    assert set(row) >= {c for c in results.COLUMNS} - {"tpot_p50_ms", "tpot_p99_ms"}
    assert row["completed"] == doc["request_count"]["avg"] == 6 and row["errors"] == 0
    assert row["output_tok_s"] == doc["output_token_throughput"]["avg"]
    assert row["ttft_mean_ms"] == doc["time_to_first_token"]["avg"] and doc["time_to_first_token"]["unit"] == "ms"
    assert (
        row["ttft_p99_ms"] == doc["time_to_first_token"]["p99"]
        and row["itl_p50_ms"] == doc["inter_token_latency"]["p50"]
    )
    assert row["tpot_mean_ms"] == pytest.approx(1000.0 / doc["output_token_throughput_per_user"]["avg"])
    assert row["prefill_tok_s"] == doc["prefill_throughput_per_user"]["avg"]
    assert row["duration_s"] == doc["benchmark_duration"]["avg"] and doc["benchmark_duration"]["unit"] == "sec"
    figs = measured.figures_of(row)
    assert figs["decode_tok_s"] == pytest.approx(doc["output_token_throughput_per_user"]["avg"])
    assert figs["prefill_tok_s"] == row["prefill_tok_s"] and figs["e2e_latency_ms_mean"] == row["e2el_mean_ms"]
    none = aiperf.row_from_result({}, sweep.Level(2, 6, 64, 16))
    assert none["completed"] == 0 and none["output_tok_s"] is None and none["tpot_mean_ms"] is None


def test_an_aiperf_record_runs_vllms_bench_unless_aiperf_is_asked_for(cli_env, capsys, tmp_path, monkeypatch):
    api = AiperfAPI()
    monkeypatch.setattr(orchestrate, "connect", lambda inv: test_bench.FakeCluster(api))
    theirs = record_file(tmp_path, output_tok_s=40.0, harness="aiperf")
    rc, out, err = run(capsys, cli_env, "bench", "--compare", str(theirs), "--json")
    assert rc == 0, err
    summary = json.loads(out)
    assert perf_record.load(test_bench.Path(summary["record"])).harness.name == "vllm-bench-serve"
    assert any(f.startswith("harness: the record used aiperf") for f in summary["against"]["flags"])
    assert not [c for c in api.commands() if aiperf.VENV in " ".join(c)]  # opt-in: nothing installed

    rc, out, err = run(capsys, cli_env, "bench", "--compare", str(theirs), "--harness", "aiperf", "--json")
    assert rc == 0, err
    summary = json.loads(out)
    rec = perf_record.load(test_bench.Path(summary["record"]))
    assert rec.harness.name == "aiperf" and rec.harness.version == aiperf.VERSION
    assert any(f.startswith("harness version: the record used aiperf 0.32.0") for f in summary["against"]["flags"])
    installs = [c for c in api.commands() if "venv" in " ".join(c) and aiperf.VENV in " ".join(c)]
    assert len(installs) == 1
    for c in api.commands():
        assert test_bench.API_KEY not in " ".join(c)


def test_the_launcher_hands_aiperf_the_key_inside_the_process_only(tmp_path):
    """Through a real Python: a stand-in `aiperf.cli.app` sees the key in its argv, while the process's
    own command line (/proc/PID/cmdline, what `ps` shows) never has it."""
    import subprocess
    import sys

    pkg = tmp_path / "aiperf"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "cli.py").write_text(
        "import os, sys\n"
        "def app():\n"
        "    cmdline = open(f'/proc/{os.getpid()}/cmdline', 'rb').read().decode().split('\\0')\n"
        "    print(repr(sys.argv), 'sk-launch' in ' '.join(cmdline))\n"
    )
    env = {"PYTHONPATH": str(tmp_path), "OPENAI_API_KEY": "sk-launch", "PATH": "/usr/bin:/bin"}
    argv = [sys.executable, "-c", aiperf.LAUNCHER, "profile", "--isl", "64"]
    got = subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout
    assert got.strip() == "['aiperf', 'profile', '--isl', '64', '--api-key', 'sk-launch'] False"
    env.pop("OPENAI_API_KEY")
    got = subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout
    assert got.strip() == "['aiperf', 'profile', '--isl', '64'] False"


def test_an_aiperf_level_where_no_request_completed_fails_the_run(cli_env, capsys, tmp_path, monkeypatch):
    """A summary without request_count (aiperf leaves out what it did not measure) is no request completed."""
    doc = json.loads(AIPERF_JSON)
    doc.pop("request_count")
    monkeypatch.setattr(AiperfAPI, "export", json.dumps(doc))
    api = AiperfAPI()
    monkeypatch.setattr(orchestrate, "connect", lambda inv: test_bench.FakeCluster(api))
    rc, out, err = run(capsys, cli_env, "bench", "--harness", "aiperf", "-c", "2", "--json")
    assert rc != 0 and "no request completed at concurrency 2" in err
