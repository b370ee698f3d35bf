"""Performance records carry the hosts' memory size and `bench --compare` flags another size (issue 52
item 3); the prompt set is a ranked cause, and a speculative-decoding profile is measured on the record's
dataset where the image has it, else its decode figures are refused on random prompts (issue 58 item 3)."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import tomllib
from pathlib import Path

import pytest

from sparkcluster.bench import against, causes, measured, orchestrate, perf_record, prompts, runner
from sparkcluster.bench.sweep import Level, Target, bench_argv
from sparkcluster.config.profile import load_profile
from sparkcluster.errors import InputError
from tests.unit import test_bench
from tests.unit.test_bench import run
from tests.unit.test_bench_against import record_file

ROOT = Path(__file__).resolve().parents[2]
CAPTURED = ROOT / "tests" / "captured"
# MemTotal of a 128 GB and a 64 GB Spark, as tests/unit/test_checks.py's MEMINFO and MEMINFO_64 carry them
KB_128 = 125276348
KB_64 = 62638174


def record(memory_gb="unknown", dataset="random", subset=None, speculative=None, decode=50.0, output=50.0, nodes=1):
    runs = {
        "id": "c1",
        "conditions": {
            "input_tokens": 8192,
            "output_tokens": 256,
            "concurrency": 1,
            "dataset": dataset,
            **({"dataset_subset": subset} if subset else {}),
        },
        "figures": {"decode_tok_s": decode, "output_tok_s": output, "prefill_tok_s": 2000.0, "ttft_ms_p50": 4000.0},
    }
    return perf_record.PerfRecord.model_validate(
        {
            "kind": "measured",
            "source": {"url": "elsewhere", "measured_at": dt.date(2026, 11, 20)},
            "hardware": {"nodes": nodes, "gpus": nodes, "accelerator": "NVIDIA GB10", "memory_gb": memory_gb},
            "harness": {"name": "vllm-bench-serve", "version": "0.32.0"},
            "software": {"model": "m", **({"speculative": speculative} if speculative else {})},
            "runs": [runs],
        }
    )


# ---- issue 52 item 3: the hosts' memory in every record -------------------------------------------


def test_every_shipped_record_states_its_hosts_memory_and_64_only_where_its_source_names_a_64g_host():
    """Read from each record's note (the source's header comment, NVIDIA/local-ai-inference-recipes at
    12b25c66: "Performance measured on nvspark-64g-1 ..."): a host named nvspark-64g-* is the only word
    any source says on memory, so 64 there, "unknown" where the host is nvspark-ci-*."""
    seen = {}
    for p in sorted((ROOT / "env-profiles").glob("*.perf.toml")):
        raw = tomllib.loads(p.read_text())
        assert "memory_gb" in raw["hardware"], p.name  # stated, never left to the default
        note = raw["source"]["note"]
        seen[p.name] = raw["hardware"]["memory_gb"]
        if "nvspark-64g-" in note:
            assert raw["hardware"]["memory_gb"] == 64.0, p.name
        else:
            assert raw["hardware"]["memory_gb"] == "unknown" and "measured on nvspark-ci-" in note, p.name
        assert perf_record.load(p).runs[0].conditions.dataset_subset == "throughput_8k"
    assert seen["qwen36-35b-nvfp4-single.perf.toml"] == 64.0
    assert seen["nemotron3-super-nvfp4-single.perf.toml"] == "unknown"


def test_a_record_without_memory_reads_as_unknown_and_a_bad_size_is_refused():
    old = record()
    assert old.hardware.memory_gb == "unknown" and old.hardware.memory_known is None
    assert record(64).hardware.memory_known == 64.0
    with pytest.raises(InputError) as ei:
        perf_record.parse(perf_record.dumps(record(64)).replace("memory_gb = 64.0", "memory_gb = -1"))
    assert "memory_gb" in " ".join(ei.value.details)
    assert perf_record.parse(perf_record.dumps(record(64))).hardware.memory_gb == 64.0  # written and read back


def test_a_bench_record_carries_the_smallest_nodes_memtotal():
    assert measured.memory_gb({"a": {"mem_total_kb": str(KB_128)}, "b": {"mem_total_kb": str(KB_64)}}) == 64.1
    assert measured.memory_gb({"a": {"mem_total_kb": str(KB_128)}}) == 128.3
    assert measured.memory_gb({"a": {}, "b": {"mem_total_kb": ""}}) == "unknown"


def test_a_record_of_another_memory_size_is_flagged_and_of_the_same_size_or_unknown_is_not():
    st = against.against(record(128.3), record(64))
    assert any(f.startswith("memory: the record's hosts have 64 GB, this run's 128.3 GB") for f in st.flags)
    assert st.ratios  # flagged, still compared
    assert not any(f.startswith("memory") for f in against.against(record(128.3), record(128)).flags)
    assert not any(f.startswith("memory") for f in against.against(record(128.3), record()).flags)


def test_another_memory_size_is_a_ranked_cause_after_the_hardware_and_before_the_software():
    view = causes.ClusterView(
        nodes=(causes.NodeView("spark-a", mem_total=KB_128 * 1024, mtu_expected=9000, mtus={"enp1": 1500}),),
        image="img:2",
    )
    theirs = record(64).model_copy(update={"software": perf_record.Software(model="m", image="img:1")})
    found = causes.rank(view, theirs)
    assert [c.area for c in found] == ["mtu", "memory", "image"]
    assert "MemTotal 128.3 GB here, the record's hosts 64 GB" in found[1].says
    assert not [c for c in causes.rank(view, record()) if c.area == "memory"]  # unknown: never assumed


def test_view_from_reads_the_nodes_memtotal_from_benchs_facts():
    class Node:
        mtu, netdevs, hcas = None, (), ()

    class Inv:
        def node(self, name):
            return Node()

    view = causes.view_from(Inv(), ["a", "b"], {"a": {"mem_total_kb": str(KB_64)}, "b": {}}, {}, {})
    assert [n.mem_total for n in view.nodes] == [KB_64 * 1024, None]


def test_compare_flags_a_64_gb_record_beside_a_128_gb_run(cli_env, capsys, tmp_path, monkeypatch):
    theirs = record_file(tmp_path, output_tok_s=100.0)
    theirs.write_text(theirs.read_text().replace('accelerator = "CPU', 'memory_gb = 64.0\naccelerator = "CPU'))
    facts = runner.ClusterFacts(
        nodes={n: {"kernel": "6.1", "mem_total_kb": str(KB_128)} for n in ("spark-head", "spark-worker")}
    )
    monkeypatch.setattr(orchestrate, "cluster_facts", lambda *a: facts)
    rc, out, err = run(capsys, cli_env, "bench", "--compare", str(theirs), "--json")
    assert rc == 0, err
    summary = json.loads(out)
    assert any(
        f.startswith("memory: the record's hosts have 64 GB, this run's 128.3 GB") for f in summary["against"]["flags"]
    )
    assert perf_record.load(Path(summary["record"])).hardware.memory_gb == 128.3


@pytest.fixture
def cli_env(tmp_path, monkeypatch):
    yield from test_bench.cli_env.__wrapped__(tmp_path, monkeypatch)


# ---- issue 58 item 3: the prompt set -------------------------------------------------------------


def test_the_prompts_are_the_last_cause_without_speculation_and_the_first_with_it():
    view = causes.ClusterView(nodes=(causes.NodeView("spark-a", driver="580.95.05"),))
    theirs = record(dataset=prompts.SPEED_BENCH, subset="throughput_8k").model_copy(
        update={"software": perf_record.Software(model="m", driver="580.159.03")}
    )
    plain = causes.rank(view, theirs, ours=record())
    assert [c.area for c in plain] == ["driver", "prompts"]
    assert "this run sent random prompts, the record nvidia/SPEED-Bench (throughput_8k)'s" in plain[1].says
    spec = causes.rank(view, theirs, ours=record(speculative="mtp"))
    assert [c.area for c in spec] == ["prompts", "driver"]
    assert "decodes speculatively (mtp)" in spec[0].says and "vllm#33497" in spec[0].says
    same = record(dataset=prompts.SPEED_BENCH, subset="throughput_8k", speculative="mtp")
    assert [c.area for c in causes.rank(view, theirs, ours=same)] == ["driver"]


def test_a_speculative_profiles_decode_figures_on_random_prompts_are_refused_saying_why():
    theirs = record(dataset=prompts.SPEED_BENCH, subset="throughput_8k", decode=90.0, output=90.0)
    st = against.against(record(speculative="mtp", decode=30.0, output=30.0), theirs)
    assert {r.figure for r in st.ratios} == {"prefill_tok_s", "ttft_ms_p50"}
    assert len(st.refused) == 1 and "draft acceptance collapses on random tokens (vllm#33497)" in st.refused[0]
    assert "decodes speculatively (mtp)" in st.refused[0] and st.verdict == "ok"
    plain = against.against(record(decode=30.0, output=30.0), theirs)  # no speculation: compared, flagged
    assert "decode_tok_s" in {r.figure for r in plain.ratios} and plain.verdict == "short"
    assert any(
        f.startswith("dataset: the record's prompts are nvidia/SPEED-Bench (throughput_8k)") for f in plain.flags
    )
    on_it = record(dataset=prompts.SPEED_BENCH, subset="throughput_8k", speculative="mtp", decode=30.0)
    assert "decode_tok_s" in {r.figure for r in against.against(on_it, theirs).ratios}


def test_the_probe_finds_speed_bench_in_the_captured_vllm_032_help_and_the_dataset_folder(tmp_path):
    """PROBE run by sh against a `vllm` that prints vLLM 0.32.0's captured `--help=all`, with and
    without a prepared dataset in HF_HOME."""
    fake = tmp_path / "bin" / "vllm"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\ncat {CAPTURED / 'vllm-bench-serve-help-all.txt'}\n")
    fake.chmod(0o755)
    py = fake.parent / "python3"  # the image's python: pandas imports (exit 0), until told otherwise
    py.write_text("#!/bin/sh\nexit 0\n")
    py.chmod(0o755)
    hf = tmp_path / "hf"
    env = {"PATH": f"{fake.parent}:{os.environ['PATH']}", "HF_HOME": str(hf)}
    out = subprocess.run(
        ["sh", "-c", prompts.probe("throughput_8k")], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert prompts.parse_probe(out) == (True, "", "")
    prepared = hf / "speed_bench"
    prepared.mkdir(parents=True)
    (prepared / "qualitative.jsonl").write_text("{}\n")  # another subset is not this one
    out = subprocess.run(
        ["sh", "-c", prompts.probe("throughput_8k")], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert prompts.parse_probe(out) == (True, "", "")
    (prepared / "throughput_8k.jsonl").write_text("{}\n")  # prepare.py --output_dir <hf_cache>/speed_bench
    out = subprocess.run(
        ["sh", "-c", prompts.probe("throughput_8k")], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert prompts.parse_probe(out) == (True, str(prepared), "")
    (prepared / "throughput_8k.jsonl").unlink()
    nested = prepared / "data" / "speed_bench"  # the path vLLM's docs name
    nested.mkdir(parents=True)
    (nested / "throughput_8k.jsonl").write_text("{}\n")
    out = subprocess.run(
        ["sh", "-c", prompts.probe("throughput_8k")], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert prompts.parse_probe(out) == (True, str(nested), "")
    py.write_text("#!/bin/sh\nexit 1\n")  # no pandas: the bench knows the dataset but cannot load it
    out = subprocess.run(
        ["sh", "-c", prompts.probe("throughput_8k")], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert prompts.parse_probe(out) == (False, str(nested), prompts.NO_PANDAS)
    lacks = prompts.choose(None, "mtp", "vllm-bench-serve", False, str(nested), prompts.NO_PANDAS)
    assert lacks == prompts.PromptSet()  # nothing compared
    fake.write_text("#!/bin/sh\necho 'usage: vllm bench serve [options]'\n")
    out = subprocess.run(
        ["sh", "-c", prompts.probe("throughput_8k")], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert prompts.parse_probe(out)[0] is False


def test_a_speculative_profile_is_measured_on_the_records_dataset_where_the_image_has_it():
    spec = load_profile("qwen36-35b-nvfp4-mtp")
    assert prompts.speculative(spec) == "mtp"
    published = perf_record.load(ROOT / "env-profiles" / "qwen36-35b-nvfp4-single.perf.toml")
    got = prompts.choose(published, "mtp", "vllm-bench-serve", True, "/hf/speed_bench/data/speed_bench")
    assert got == prompts.PromptSet(prompts.SPEED_BENCH, "throughput_8k", "/hf/speed_bench/data/speed_bench")
    argv = bench_argv(Level(1, 8, 8192, 256), Target("http://127.0.0.1:8000", "m", "m"), "/tmp/x", prompts=got)
    assert "--dataset-name=speed_bench" in argv and "--speed-bench-dataset-subset=throughput_8k" in argv
    assert "--speed-bench-output-len=256" in argv and not any(a.startswith("--random-") for a in argv)
    assert "--dataset-path=/hf/speed_bench/data/speed_bench" in argv
    # the flags it uses are those vLLM 0.32.0's bench has (its captured --help=all)
    help_all = (CAPTURED / "vllm-bench-serve-help-all.txt").read_text()
    for flag in ("--dataset-path", "--speed-bench-dataset-subset", "--speed-bench-output-len"):
        assert flag in help_all
    no_image = prompts.choose(published, "mtp", "vllm-bench-serve", False, "")
    assert not no_image.speed_bench and "no --dataset-name speed_bench" in no_image.fallback
    no_data = prompts.choose(published, "mtp", "vllm-bench-serve", True, "")
    assert not no_data.speed_bench and "no prepared nvidia/SPEED-Bench in the head's HF cache" in no_data.fallback
    assert prompts.choose(published, "", "vllm-bench-serve", True, "/x") == prompts.PromptSet()  # not speculative
    assert prompts.choose(None, "mtp", "vllm-bench-serve", True, "/x") == prompts.PromptSet()  # nothing compared


def test_the_head_is_asked_only_for_a_speculative_profile_compared_with_a_dataset():
    class Head:
        asked = 0

        def speed_bench(self, subset):
            assert subset == "throughput_8k"
            Head.asked += 1
            return True, "/snap/", ""

    published = perf_record.load(ROOT / "env-profiles" / "qwen36-35b-nvfp4-single.perf.toml")
    plain = load_profile("qwen36-35b-fp8-single")  # no speculative_config
    assert runner.prompt_set(Head(), published, plain, "vllm-bench-serve") == prompts.PromptSet()
    assert Head.asked == 0
    got = runner.prompt_set(Head(), published, load_profile("qwen36-35b-nvfp4-mtp"), "vllm-bench-serve")
    assert got.speed_bench and got.path == "/snap/" and Head.asked == 1


def test_a_run_on_speed_bench_writes_its_dataset_and_subset_into_its_record():
    rows = [
        {"completed": 8, "concurrency": 1, "input_len": 8192, "output_len": 256, "num_prompts": 8, "tpot_mean_ms": 20.0}
    ]
    sent = prompts.PromptSet(prompts.SPEED_BENCH, "throughput_8k", "/snap/")
    prov = measured.Provenance(cluster="c", nodes={"a": {"mem_total_kb": str(KB_64)}}, prompts=sent, speculative="mtp")
    rec = measured.build(rows, prov, harness_version="0.32.0", argv=[], measured_at=dt.date(2026, 11, 28), source="x")
    c = rec.runs[0].conditions
    assert (c.dataset, c.dataset_subset) == (prompts.SPEED_BENCH, "throughput_8k")
    assert rec.software.speculative == "mtp" and rec.hardware.memory_gb == 64.1
    plain = measured.build(
        rows,
        measured.Provenance(cluster="c"),
        harness_version="0.32.0",
        argv=[],
        measured_at=dt.date(2026, 11, 28),
        source="x",
    )
    assert plain.runs[0].conditions.dataset == "random" and plain.software.speculative is None
