"""Issue 58: a speculative profile compared on the record's dataset where the image has it. The subset is
made in the head's HF cache from the hub the inventory names (bench/prompts.fetch_command), here the
testbed hub's stand-in of nvidia/SPEED-Bench (tests/testbed/hub/speed_bench.py) on loopback, read by the
real huggingface_hub client; else the decode ratio is refused on random prompts, saying why."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkcluster.bench import perf_record, prompts, runner
from sparkcluster.config.profile import load_profile
from tests.testbed.hub import serve_in_thread
from tests.testbed.hub.speed_bench import rows as standin_rows

pytest.importorskip("huggingface_hub")


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    model = tmp_path_factory.mktemp("tiny")
    (model / "config.json").write_text('{"model_type": "llama"}\n')
    running = serve_in_thread(model, tmp_path_factory.mktemp("state"), synthetic_mb=0)
    yield running
    running.stop()


def _fetch(endpoint: str, home: Path, subset: str) -> str:
    """fetch_command as the head container runs it: sh, the image's python3 (here this venv's, which has
    huggingface_hub as vLLM's image does), HF_ENDPOINT from the inventory, HF_HOME the mounted cache."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_ENDPOINT=endpoint, HF_HOME=str(home), HF_HUB_DISABLE_TELEMETRY="1")
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    r = subprocess.run(prompts.fetch_command(subset), env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_the_records_subset_is_made_from_the_hubs_copy(hub, tmp_path):
    path, why = prompts.parse_fetch(_fetch(hub.endpoint, tmp_path, "throughput_8k"))
    assert not why and path == str(tmp_path / prompts.PREPARED)
    got = [json.loads(x) for x in (tmp_path / prompts.PREPARED / "throughput_8k.jsonl").read_text().splitlines()]
    assert got == standin_rows("throughput_8k")  # the dataset's own columns, one row a line
    # downloaded into the HF cache like the weights, as a dataset repository
    assert (tmp_path / "hub" / "datasets--nvidia--SPEED-Bench").is_dir()
    # and the probe now finds it where the bench's --dataset-path points
    env = {"HF_HOME": str(tmp_path), "PATH": os.environ["PATH"]}
    out = subprocess.run(["sh", "-c", prompts.probe("throughput_8k")], env=env, capture_output=True, text=True)
    assert prompts.parse_probe(out.stdout)[1] == path


def test_placeholder_rows_are_not_prompts(hub, tmp_path):
    path, why = prompts.parse_fetch(_fetch(hub.endpoint, tmp_path, "throughput_1k"))
    assert not path and "12 of 12 rows of nvidia/SPEED-Bench's throughput_1k are the hub's placeholder" in why
    assert not (tmp_path / prompts.PREPARED / "throughput_1k.jsonl").exists()


def test_a_hub_without_the_dataset_says_so(hub, tmp_path):
    path, why = prompts.parse_fetch(_fetch(hub.endpoint, tmp_path, "throughput_32k"))
    assert not path and "has no rows under throughput_32k/" in why
    path, why = prompts.parse_fetch(_fetch("http://127.0.0.1:9", tmp_path, "throughput_8k"))
    assert not path and "nvidia/SPEED-Bench from http://127.0.0.1:9" in why


class _Head:
    """runner.Head's two questions, answered as a head container would."""

    def __init__(self, has: bool, path: str, fetched: tuple[str, str]):
        self.has, self.path, self.fetched, self.hubs = has, path, fetched, []

    def speed_bench(self, subset):
        return self.has, self.path, ""

    def fetch_speed_bench(self, subset, hub):
        self.hubs.append((subset, hub))
        return self.fetched


def _published():
    return perf_record.load(Path(prompts.__file__).parents[2] / "env-profiles" / "qwen36-35b-nvfp4-single.perf.toml")


def _mtp():
    return load_profile("qwen36-35b-nvfp4-mtp")


def test_prompt_set_fetches_from_the_inventorys_hub_only_where_the_cache_lacks_it():
    rec, prof = _published(), _mtp()
    head = _Head(True, "", ("/hf/speed_bench", ""))
    got = runner.prompt_set(head, rec, prof, "vllm-bench-serve", "http://198.18.0.1:3142")
    assert got == prompts.PromptSet(prompts.SPEED_BENCH, "throughput_8k", "/hf/speed_bench")
    assert head.hubs == [("throughput_8k", "http://198.18.0.1:3142")]
    cached = _Head(True, "/hf/speed_bench", ("", "not asked"))
    assert runner.prompt_set(cached, rec, prof, "vllm-bench-serve").path == "/hf/speed_bench" and not cached.hubs
    no_bench = _Head(False, "", ("/x", ""))  # the image's bench has no speed_bench: nothing fetched
    assert "no --dataset-name speed_bench" in runner.prompt_set(no_bench, rec, prof, "vllm-bench-serve").fallback
    assert not no_bench.hubs


def test_a_fetch_that_cannot_be_used_falls_back_to_random_and_the_decode_ratio_is_refused():
    why = "12 of 12 rows of nvidia/SPEED-Bench's throughput_8k are the hub's placeholder"
    got = runner.prompt_set(_Head(True, "", ("", why)), _published(), _mtp(), "vllm-bench-serve")
    assert not got.speed_bench and got.dataset == prompts.RANDOM
    assert f"from the hub: {why}" in got.fallback and "prepare.py" in got.fallback
    said = prompts.refusal("mtp", prompts.SPEED_BENCH, got.dataset, got.fallback)
    assert "decode figures" in said and "vllm#33497" in said and why in said


def test_a_parquet_file_is_a_reason_not_read(tmp_path, capsys):
    # the public hub's copy is Parquet (its card); the reader in the image takes JSON Lines only
    from sparkcluster.programs import speed_bench_fetch

    (tmp_path / "throughput_8k").mkdir()
    (tmp_path / "throughput_8k" / "test-00000-of-00001.parquet").write_bytes(b"PAR1")
    with pytest.raises(SystemExit):
        speed_bench_fetch.rows_of(str(tmp_path), "throughput_8k", prompts.SPEED_BENCH)
    assert "test-00000-of-00001.parquet is Parquet, which this reader does not read" in capsys.readouterr().out
