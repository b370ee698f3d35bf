"""A stand-in for nvidia/SPEED-Bench, the dataset every shipped performance record was measured on
(issue 58): the testbed's hub serves it as a dataset repository, so `bench --compare` of a speculative
profile can make the record's subset in the head's HF cache (sparkcluster/bench/prompts.fetch_command)
without the public hub.

What is the real dataset's (its card, https://huggingface.co/datasets/nvidia/SPEED-Bench, README
`dataset_info`): the subsets (`qualitative`, `throughput_1k` ... `throughput_32k`), the one split
(`test`), and every row's columns and types: question_id, category, sub_category (strings), turns (a
list of strings), source, src_id, difficulty (strings), multiturn (bool). The categories are the real
ones: the qualitative split's eleven domains (NVIDIA's aiperf SPEED-Bench tutorial: coding,
humanities, math, multilingual, qa, rag, reasoning, roleplay, stem, summarization, writing) and the
throughput splits' entropy tiers (sgl-project/sglang PR #24149 and its speed_bench.py: low_entropy,
mixed, high_entropy). The placeholder a row of the hub's copy holds where its source may not be
redistributed is the text later SGLang loaders refuse (sparkcluster/bench/prompts.py says where).

What is not: the files are JSON Lines (`<subset>/test.jsonl`), where the hub's are Parquet (its card:
"Formats: parquet"), because the testbed carries no Parquet writer; the product reads JSON Lines only
(sparkcluster/programs/speed_bench_fetch.py), so against the public hub it names the Parquet file as
its reason to fall back. The rows
are few and short, written here: the testbed's tiny model has a short context, so `throughput_8k`'s
prompts are not 8k tokens; a run on them says the path works, not what a Spark decodes. And
`throughput_1k` holds only placeholders, standing for a subset of the hub's copy that has to be
prepared from its sources (NVIDIA-NeMo/Skills' prepare.py) before any run can use it.
"""

from __future__ import annotations

import json
from pathlib import Path

REPO = "nvidia/SPEED-Bench"
WHOLE = "throughput_8k"  # the subset the shipped records name, served whole
HELD = "throughput_1k"  # served as placeholders only
PLACEHOLDER = "FULL BENCHMARK DATA SHOULD BE FETCHED FROM THE SOURCE USING SPECDEC_BENCH"
FEATURES = (
    ("question_id", "dtype: string"),
    ("category", "dtype: string"),
    ("sub_category", "dtype: string"),
    ("turns", "list: string"),
    ("source", "dtype: string"),
    ("src_id", "dtype: string"),
    ("difficulty", "dtype: string"),
    ("multiturn", "dtype: bool"),
)
TIERS = ("low_entropy", "mixed", "high_entropy")
PROMPTS = {
    "low_entropy": (
        "Count from one to twenty in words, separated by commas.",
        "Write the English alphabet in capital letters, one letter per line.",
        "List the days of the week in order, starting with Monday.",
        "Repeat the sentence 'the cluster is serving' five times.",
    ),
    "mixed": (
        "Summarize in three sentences why a tensor-parallel model needs fast links between its GPUs.",
        "Explain what a key-value cache holds during text generation, for a new engineer.",
        "Describe how to check that two machines can reach each other over a network.",
        "Give four tips for keeping a shared server's disk from filling up.",
    ),
    "high_entropy": (
        "Write a short poem about a lighthouse keeper who collects lost umbrellas.",
        "Invent a recipe that uses only ingredients whose names start with the letter P.",
        "Tell a story in which a river decides to flow uphill for one afternoon.",
        "Describe an imaginary city where every street is named after a musical chord.",
    ),
}


def rows(subset: str) -> list[dict]:
    """The subset's rows, as the stand-in serves them."""
    out = []
    for tier in TIERS:
        for i, text in enumerate(PROMPTS[tier]):
            out.append(
                {
                    "question_id": f"{subset}-{tier}-{i}",
                    "category": tier,
                    "sub_category": "",
                    "turns": [PLACEHOLDER if subset == HELD else text],
                    "source": "sparkcluster-testbed",
                    "src_id": f"{tier}-{i}",
                    "difficulty": "",
                    "multiturn": False,
                }
            )
    return out


def card() -> str:
    """The README: the real card's `dataset_info` for the two subsets served, and a stand-in note."""
    lines = ["---", "license: other", "dataset_info:"]
    for subset in (HELD, WHOLE):
        lines += [f"  - config_name: {subset}", "    features:"]
        for name, kind in FEATURES:
            lines += [f"      - name: {name}", f"        {kind}"]
        lines += ["    splits:", "      - name: test", f"        num_examples: {len(rows(subset))}"]
    lines += ["configs:"]
    for subset in (HELD, WHOLE):
        lines += [
            f"  - config_name: {subset}",
            "    data_files:",
            "      - split: test",
            f"        path: {subset}/test.jsonl",
        ]
    lines += [
        "---",
        "",
        "A stand-in for nvidia/SPEED-Bench served by the sparkcluster testbed's hub (tests/testbed/hub/speed_bench.py).",
    ]
    return "\n".join(lines) + "\n"


def standin(dest: Path) -> Path:
    """The dataset repository's folder, written (again) under `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "README.md").write_text(card())
    for subset in (HELD, WHOLE):
        (dest / subset).mkdir(exist_ok=True)
        (dest / subset / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(subset)))
    return dest
