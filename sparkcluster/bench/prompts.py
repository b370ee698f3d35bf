"""Which prompts a run sends, and what a speculative-decoding profile's figures mean on them (issue 58).
Pure; `probe` is the line runner.Head.speed_bench runs in the head container.

The facts:
- Every shipped record was measured on nvidia/SPEED-Bench, its `throughput_8k` subset (NVIDIA's
  performance.yaml: `workload.dataset`, `workload.profile`); `vllm bench serve` sends random token IDs
  unless told otherwise (bench/sweep.py's `--dataset-name=random`).
- Without speculative decoding, prompts of the same lengths cost the same compute whatever their
  tokens, to first order: random prompts stand in for the record's, the dataset is flagged
  (bench/against.py) and ranked last among the causes (bench/causes.py).
- With speculative decoding (`serve.speculative_config`) a decode step emits as many tokens as the
  target accepts of the drafts, and acceptance follows the text: an MTP profile measured with
  `--dataset-name random` reports a low acceptance rate (vllm#33497). Its decode figures on random
  prompts say nothing about the record's.

The rule: a speculative profile compared with a record measured on SPEED-Bench is measured on the
record's dataset where the head's image can (`vllm bench serve --dataset-name speed_bench`, vllm PR
#36029; its options `--dataset-path`, `--speed-bench-dataset-subset`, `--speed-bench-output-len` per
https://docs.vllm.ai/en/latest/cli/bench/serve/) and the prepared dataset lies in the head's HF cache
folder, `<hf_cache>/speed_bench` (PREPARED), or can be made there from the hub the inventory names
(`hf_endpoint`, else the public hub: `fetch_command`); else the run sends random prompts and every
figure decode decides is refused beside the record's, saying why.

Prepared, not downloaded: the hub's nvidia/SPEED-Bench holds a placeholder where a source dataset does
not permit redistribution, and NVIDIA-NeMo/Skills' `nemo_skills/dataset/speed-bench/prepare.py` fetches
those rows (vLLM's benchmarking docs, docs.vllm.ai/en/latest/benchmarking/cli: `--config`,
`--output_dir`, then `--dataset-path <output>/data/speed_bench`; aiperf's SPEED-Bench loader says the
same of the placeholders). So the owner runs it once on the head, into the HF cache (every container
mounts it at the same path): `PREPARE_HINT`.

From the hub, where its rows are whole: `fetch_command` downloads the subset's files of the dataset
repository (huggingface_hub's snapshot_download, `repo_type="dataset"`, into the HF cache like the
weights) in the head container, reads them (JSON Lines; the hub's own files are Parquet, which needs
pyarrow, a package no source says a vLLM image has, so a Parquet file is a reason to fall back), and
writes `<hf_cache>/speed_bench/<subset>.jsonl`, one row a line with the dataset's own columns (its
card's `dataset_info`: question_id, category, sub_category, turns, source, src_id, difficulty,
multiturn), the form the prepared files take (aiperf PR #855: "predownload the data, then use it as
JSONL files", as nemo-skills and vllm bench do; sgl-project/sglang
`python/sglang/benchmark/datasets/speed_bench.py`, commit f111248, reads such a file's `turns`, a list
of strings, the first as the prompt). A row whose turns hold the hub's placeholder, "FULL BENCHMARK DATA
SHOULD BE FETCHED FROM THE SOURCE USING SPECDEC_BENCH" (the text later SGLang SPEED-Bench loaders refuse
as `SPEED_BENCH_DATA_PLACEHOLDER`; found in public code whose repository the index did not name), is not
a prompt: then nothing is written and the run falls back, naming prepare.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkcluster import programs

SPEED_BENCH = "nvidia/SPEED-Bench"  # the dataset's name on the hub, as records write it
VLLM_DATASET = "speed_bench"  # its --dataset-name in vLLM's bench (PR #36029)
SUBSETS = ("qualitative", "throughput_1k", "throughput_2k", "throughput_8k", "throughput_16k", "throughput_32k")
RANDOM = "random"
# the figures decode speed decides (refused for a speculative profile on random prompts); prefill and
# the time to the first token are left: no draft runs before the first token
DECODE_BOUND = ("decode_tok_s", "output_tok_s", "e2e_latency_ms_mean", "itl_ms_p50", "itl_ms_p99")
WHY_RANDOM = (
    "draft acceptance collapses on random tokens (vllm#33497), so a speculative profile's decode speed "
    "on random prompts says nothing about the record's"
)

PREPARED = "speed_bench"  # the prepared dataset's folder in the HF cache (prepare.py's --output_dir)
# what the hub's copy holds where a source may not be redistributed (the module's note)
PLACEHOLDER = "FULL BENCHMARK DATA SHOULD BE FETCHED FROM THE SOURCE USING SPECDEC_BENCH"
PREPARE_HINT = (
    "on the head, run NVIDIA-NeMo/Skills' nemo_skills/dataset/speed-bench/prepare.py "
    f"--config SUBSET --output_dir <the inventory's hf_cache>/{PREPARED}"
)


def probe(subset: str) -> str:
    """The shell line, run in the head container, that says whether its vLLM's bench knows speed_bench
    and where the prepared subset is: `speed_bench=yes|no`, `speed_bench_path=<folder>` ("" when
    absent). prepare.py writes `<output_dir>/<subset>.jsonl` (as runners that call it check); vLLM's
    docs name `<output>/data/speed_bench` as the path: either folder holding `<subset>.jsonl` is taken."""
    if subset not in SUBSETS:
        raise ValueError(f"not a SPEED-Bench subset: {subset!r}")
    home = "${HF_HOME:-$HOME/.cache/huggingface}"
    return (
        "if { vllm bench serve --help=all 2>&1 || vllm bench serve --help 2>&1; } "
        "| grep -q -- --speed-bench-dataset-subset; "
        # its loader reads the JSON Lines with pandas (vLLM 0.32 benchmarks/datasets/datasets.py,
        # SpeedBench.load_data: pd.read_json), a package vLLM's bench imports only if it is there
        "then if python3 -c 'import pandas' >/dev/null 2>&1; then echo speed_bench=yes; "
        "else echo speed_bench=no-pandas; fi; "
        'else echo speed_bench=no; fi; p=""; '
        f'for d in "{home}/{PREPARED}" "{home}/{PREPARED}/data/speed_bench"; do '
        f'[ -s "$d/{subset}.jsonl" ] && {{ p="$d"; break; }}; done; echo "speed_bench_path=$p"'
    )


FETCH = "sparkcluster.programs.speed_bench_fetch"  # run by the head container's python (vLLM's)


def fetch_command(subset: str) -> list[str]:
    """The argv, run in the head container with HF_ENDPOINT set to the inventory's hub, that makes the
    prepared subset from the hub's copy (the module's note; the program is FETCH); its output is read
    by `parse_fetch`."""
    if subset not in SUBSETS:
        raise ValueError(f"not a SPEED-Bench subset: {subset!r}")
    return ["sh", "-c", programs.command(FETCH, subset, SPEED_BENCH, PLACEHOLDER, PREPARED)]


@dataclass(frozen=True)
class PromptSet:
    """The prompts one run sends: vLLM bench's random tokens, or a dataset folder in the head container."""

    dataset: str = RANDOM  # as a record writes it: "random" or SPEED_BENCH
    subset: str | None = None
    path: str = ""  # speed_bench's --dataset-path, inside the head container
    # why the run sends random prompts where the record's were asked for ("" when nothing was asked)
    fallback: str = ""

    @property
    def speed_bench(self) -> bool:
        return self.dataset == SPEED_BENCH

    def argv(self, input_len: int, output_len: int) -> list[str]:
        """The dataset's part of `vllm bench serve`'s argv (every value in --flag=value form)."""
        if not self.speed_bench:
            return [
                "--dataset-name=random",  # synthetic prompts: no dataset download, no hub
                f"--random-input-len={int(input_len)}",
                f"--random-output-len={int(output_len)}",
            ]
        return [
            f"--dataset-name={VLLM_DATASET}",
            f"--dataset-path={self.path}",
            f"--speed-bench-dataset-subset={self.subset}",
            f"--speed-bench-output-len={int(output_len)}",
        ]


def said(conditions) -> str:
    """A run's prompts as flags and causes say them: the dataset and, where it has parts, the part."""
    c = conditions
    return f"{c.dataset} ({c.dataset_subset})" if c.dataset_subset else c.dataset


def speculative(prof) -> str:
    """The profile's speculative method ("mtp", "eagle3", ...), "speculative" when it names none, "" without."""
    spec = getattr(getattr(prof, "serve", None), "speculative_config", None) or {}
    return str(spec.get("method") or "speculative") if spec else ""


NO_PANDAS = (
    f"the head image's `vllm bench serve` knows {VLLM_DATASET} but its python lacks pandas, which that "
    "dataset's loader reads it with (vLLM 0.32, benchmarks/datasets/datasets.py: SpeedBench.load_data)"
)


def parse_probe(text: str) -> tuple[bool, str, str]:
    """PROBE's output: (the image's bench can run speed_bench, the dataset's folder or "", why it
    cannot where it knows the dataset but lacks what loads it, else "")."""
    vals = _values(text)
    said = vals.get("speed_bench", "").strip()
    return said == "yes", vals.get("speed_bench_path", "").strip(), NO_PANDAS if said == "no-pandas" else ""


def parse_fetch(text: str) -> tuple[str, str]:
    """`fetch_command`'s output: (the prepared folder, "") or ("", why not)."""
    vals = _values(text)
    path = vals.get("speed_bench_path", "").strip()
    return path, "" if path else (vals.get("speed_bench_error", "").strip() or "the fetch said nothing")


def _values(text: str) -> dict[str, str]:
    return dict(line.partition("=")[::2] for line in (text or "").splitlines() if "=" in line)


def wanted(record) -> tuple[str, str | None] | None:
    """The record's SPEED-Bench subset where its runs were measured on it: (dataset, subset), else None.
    A record that names no subset gets the one its input length names (throughput_8k for 8192)."""
    if record is None:
        return None
    for run in record.runs:
        c = run.conditions
        if c.dataset == SPEED_BENCH:
            if c.dataset_subset in SUBSETS:
                return SPEED_BENCH, c.dataset_subset
            k = {1024: "1k", 2048: "2k", 8192: "8k", 16384: "16k", 32768: "32k"}.get(c.input_tokens)
            return SPEED_BENCH, f"throughput_{k}" if k else "qualitative"
    return None


def choose(record, spec_method: str, harness: str, has_speed_bench: bool, path: str, hub: str = "") -> PromptSet:
    """The prompts this run sends (the module's rule). Only vLLM's bench runs speed_bench here. `hub`:
    why the hub's copy could not be made the prepared one, where that was tried, or why the image's
    bench cannot run the dataset it knows."""
    want = wanted(record)
    if not spec_method or want is None:
        return PromptSet()
    if harness != "vllm-bench-serve":
        return PromptSet(fallback=f"{harness} sends its own prompts, not {SPEED_BENCH}'s")
    if not has_speed_bench:
        return PromptSet(
            fallback=hub or f"the head image's `vllm bench serve` has no --dataset-name {VLLM_DATASET} (vLLM PR #36029)"
        )
    if not path:
        tried = f"; from the hub: {hub}" if hub else ""
        return PromptSet(fallback=f"no prepared {SPEED_BENCH} in the head's HF cache{tried} ({PREPARE_HINT})")
    return PromptSet(SPEED_BENCH, want[1], path)


def refusal(spec_method: str, record_dataset: str, ours: str, fallback: str = "") -> str:
    """Why a speculative profile's decode figures on `ours` prompts are not set beside `record_dataset`'s."""
    why = f" ({fallback})" if fallback else ""
    return (
        f"decode figures ({', '.join(DECODE_BOUND)}): this profile decodes speculatively ({spec_method}) and "
        f"this run sent {ours} prompts{why}, the record {record_dataset}'s: {WHY_RANDOM}; "
        f"prepare {SPEED_BENCH} ({PREPARE_HINT}) and measure again"
    )
