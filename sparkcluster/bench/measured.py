"""A `sparkcluster bench` run written as a performance record (`record.perf.toml` in its run folder),
in the same format as a published one, its provenance filled from the cluster's own facts: the image
and its ID on every node, the driver and kernel, NCCL's version and the transport the engine chose, the
model's revision in the HF cache, the profile and its hash. Pure: the caller gathers the facts.

Levels measured more than once (`--repeat`) become one run each: the mean of every figure, the count,
and the spread (relative standard deviation, in percent) so a later comparison can tell noise from a fall.
"""

from __future__ import annotations

import datetime as dt
import re
import statistics
from dataclasses import dataclass, field

from sparkcluster import __version__
from sparkcluster.bench.perf_record import UNKNOWN, PerfRecord
from sparkcluster.bench.prompts import PromptSet

# the prompts each harness sends: vLLM bench's random tokens, llama-benchy's book (its --book-url default),
# aiperf's synthetic prompts (its default corpus, Shakespeare's sonnets)
DATASETS = {
    "vllm-bench-serve": "random",
    "llama-benchy": "gutenberg:1661 (llama-benchy's default book)",
    "aiperf": "synthetic (aiperf's default corpus)",
}
# NVIDIA's GPUs name themselves in nvidia-smi's first column; a node without one (the testbed) is a CPU
_NCCL_VERSION = re.compile(r"NCCL version ([0-9]+\.[0-9]+\.[0-9]+)")


@dataclass(frozen=True)
class Provenance:
    """What the cluster says about itself while the run is measured (all from facts, none typed in)."""

    cluster: str
    nodes: dict[str, dict] = field(default_factory=dict)  # node -> runner.parse_facts output
    image: str = ""
    image_ids: dict[str, str] = field(default_factory=dict)  # node -> image ID of its container
    image_digest: str = ""  # a registry digest of the head's image, when it has one
    vllm_version: str = ""
    model: str = ""
    model_revision: str = ""
    profile: str = ""
    profile_hash: str = ""
    nccl_texts: dict[str, str] = field(default_factory=dict)  # node -> the engine's NCCL lines
    nccl_transport: dict[str, str] = field(default_factory=dict)  # node -> engine_nccl's summary
    all_reduce: str = ""  # the backend the ranks named for the TP all-reduce (deployment/engine_ranks)
    topology: str | None = None
    gpus: int = 0
    prompts: PromptSet | None = None  # what the run sent (bench/prompts.choose); None: the harness's own
    speculative: str = ""  # bench/prompts.speculative(profile)


def figures_of(row: dict) -> dict[str, float]:
    """One level's CSV row (results.row_from_result) as a record's figures."""
    out: dict[str, float] = {}
    tpot, ttft, n_in = row.get("tpot_mean_ms"), row.get("ttft_mean_ms"), row.get("input_len")
    if tpot:
        out["decode_tok_s"] = 1000.0 / tpot
    if row.get("prefill_tok_s"):  # a harness that measures it itself (llama-benchy, aiperf)
        out["prefill_tok_s"] = float(row["prefill_tok_s"])
    elif ttft and n_in:
        out["prefill_tok_s"] = n_in * 1000.0 / ttft
    for fig, col in (
        ("output_tok_s", "output_tok_s"),
        ("e2e_latency_ms_mean", "e2el_mean_ms"),
        ("ttft_ms_p50", "ttft_p50_ms"),
        ("ttft_ms_p99", "ttft_p99_ms"),
        ("itl_ms_p50", "itl_p50_ms"),
        ("itl_ms_p99", "itl_p99_ms"),
    ):
        v = row.get(col)
        if v:
            out[fig] = float(v)
    return out


def _spread(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    mean = statistics.fmean(values)
    return statistics.stdev(values) / mean * 100.0 if mean else 0.0


def _first(nodes: dict[str, dict], key: str) -> str | None:
    vals = [v.get(key) for v in nodes.values() if v.get(key)]
    return vals[0] if vals else None


def nccl_version(texts: dict[str, str]) -> str | None:
    for t in texts.values():
        m = _NCCL_VERSION.search(t or "")
        if m:
            return m.group(1)
    return None


def accelerator(nodes: dict[str, dict]) -> str:
    gpu = _first(nodes, "gpu") or ""
    name = gpu.split(",")[0].strip()
    return name or "CPU (no NVIDIA GPU seen)"


def driver(nodes: dict[str, dict]) -> str | None:
    gpu = _first(nodes, "gpu") or ""
    parts = [p.strip() for p in gpu.split(",")]
    return parts[1] if len(parts) > 1 and parts[1] else None


def memory_gb(nodes: dict[str, dict]) -> float | str:
    """The hosts' memory for the record (issue 52): the smallest node's MemTotal in GB (10^9), one
    decimal, from bench's node facts (`mem_total_kb`, /proc/meminfo's kB being KiB); "unknown" where none read."""
    kbs = [int(v["mem_total_kb"]) for v in nodes.values() if str(v.get("mem_total_kb", "")).strip().isdigit()]
    kbs = [k for k in kbs if k > 0]
    return round(min(kbs) * 1024 / 1e9, 1) if kbs else UNKNOWN


def build(
    rows: list[dict],
    prov: Provenance,
    *,
    harness_version: str,
    argv: list[str],
    harness: str = "vllm-bench-serve",
    measured_at: dt.date,
    source: str,
) -> PerfRecord | None:
    """The run as a measured record; None when no level measured anything."""
    by_level: dict[tuple[int, int, int], list[dict]] = {}
    for r in rows:
        if not r.get("completed") or r.get("concurrency") is None:
            continue
        key = (int(r["input_len"]), int(r["output_len"]), int(r["concurrency"]))
        by_level.setdefault(key, []).append(r)
    runs = []
    sent_dataset = prov.prompts is not None and prov.prompts.speed_bench
    for (n_in, n_out, c), group in by_level.items():
        figs = [figures_of(r) for r in group]
        names = sorted({k for f in figs for k in f})
        mean = {k: statistics.fmean([f[k] for f in figs if k in f]) for k in names}
        if not mean:
            continue
        run = {
            "id": f"c{c}-{n_in}-{n_out}",
            "conditions": {
                "input_tokens": n_in,
                "output_tokens": n_out,
                "concurrency": c,
                "dataset": prov.prompts.dataset if sent_dataset else DATASETS.get(harness, "random"),
                "dataset_subset": prov.prompts.subset if sent_dataset else None,
                "requests": int(group[0].get("num_prompts") or 0) or None,
            },
            "figures": mean,
            "repetitions": len(group),
        }
        if len(group) > 1:
            run["spread_pct"] = {k: round(_spread([f[k] for f in figs if k in f]), 2) for k in names}
        runs.append(run)
    if not runs:
        return None
    nodes = prov.nodes
    kernels = sorted({v["kernel"] for v in nodes.values() if v.get("kernel")})
    return PerfRecord.model_validate(
        {
            "kind": "measured",
            "source": {"url": source, "measured_at": measured_at, "publisher": f"sparkcluster bench on {prov.cluster}"},
            "hardware": {
                "nodes": max(len(nodes), 1),
                "gpus": max(prov.gpus, 1),
                "accelerator": accelerator(nodes),
                "label": f"cluster {prov.cluster}",
                "topology": prov.topology,
                "memory_gb": memory_gb(nodes),
            },
            "harness": {"name": harness, "version": harness_version or "unknown", "argv": argv},
            "software": {
                "backend": "vllm",
                "backend_version": prov.vllm_version or None,
                "image": prov.image or None,
                "image_digest": prov.image_digest or None,
                "image_ids": prov.image_ids,
                "driver": driver(nodes),
                "kernel": ", ".join(kernels) or None,
                "nccl": nccl_version(prov.nccl_texts),
                "nccl_transport": prov.nccl_transport,
                "all_reduce": prov.all_reduce or None,
                "model": prov.model or None,
                "model_revision": prov.model_revision or None,
                "profile": prov.profile or None,
                "profile_hash": prov.profile_hash or None,
                "sparkcluster_version": _version(),
                "speculative": prov.speculative or None,
            },
            "runs": runs,
        }
    )


def _version() -> str:
    return __version__
