"""The unified-memory arithmetic (node/memory_fit, issue 52) on tables, and lint's offline use of it."""

from __future__ import annotations

import pytest

from sparkcluster.config import model_memory
from sparkcluster.config.inventory import parse as parse_inventory
from sparkcluster.config.lint import memory_fit_check
from sparkcluster.config.profile import load_profile
from sparkcluster.node import memory_fit
from sparkcluster.node.memory_fit import GB, Fit, KvMin, kv_min, weight_bytes, weights_per_rank

# Qwen3-235B-A22B: 94 layers, 64 heads, 4 KV heads (config/lint's table, test_lint.py), head_dim 128
# (kv-channels 128 in zyzshishui/slime scripts/models/qwen3-235B-A22B.sh), bf16
QWEN3_235B = {
    "num_hidden_layers": 94,
    "num_attention_heads": 64,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "torch_dtype": "bfloat16",
}
# Qwen3-4B's config.json as published (akougkas/warpio-cli model_cards/qwen3:4b.md): its sliding
# window is off (sliding_window null, use_sliding_window false), so plain attention
QWEN3_4B = {
    "head_dim": 128,
    "hidden_size": 2560,
    "num_attention_heads": 32,
    "num_hidden_layers": 36,
    "num_key_value_heads": 8,
    "sliding_window": None,
    "use_sliding_window": False,
    "torch_dtype": "bfloat16",
}
# shapes only (the fields transformers' configs use for these kinds), not a real model's values
MLA = {**QWEN3_235B, "kv_lora_rank": 512}
HYBRID_PATTERN = {**QWEN3_235B, "hybrid_override_pattern": "M-M-M*-"}
LINEAR = {**QWEN3_235B, "layer_types": ["linear_attention", "full_attention"]}
SLIDING = {**QWEN3_235B, "layer_types": ["sliding_attention", "full_attention"]}
WINDOW = {**QWEN3_235B, "sliding_window": 4096}
MAMBA = {**QWEN3_235B, "mamba_num_heads": 128}


@pytest.mark.parametrize(
    "config, length, dtype, tp, pp, want",
    [
        # 2 x 94 x (4/2) x 128 x 2 B x 32768
        (QWEN3_235B, 32768, "auto", 2, 1, 2 * 94 * 2 * 128 * 2 * 32768),
        (QWEN3_235B, 32768, "fp8", 2, 1, 2 * 94 * 2 * 128 * 1 * 32768),
        (QWEN3_235B, 32768, "auto", 8, 1, 2 * 94 * 1 * 128 * 2 * 32768),  # KV heads replicated below TP
        (QWEN3_235B, 32768, "auto", 2, 2, 2 * 47 * 2 * 128 * 2 * 32768),  # a pipeline stage's layers
        (QWEN3_4B, 40960, "auto", 1, 1, 2 * 36 * 8 * 128 * 2 * 40960),
        ({**QWEN3_4B, "head_dim": None}, 1000, "auto", 1, 1, 2 * 36 * 8 * 80 * 2 * 1000),  # hidden/heads
        ({"text_config": QWEN3_4B}, 1000, "auto", 1, 1, 2 * 36 * 8 * 128 * 2 * 1000),  # multimodal
    ],
)
def test_kv_minimum_for_plain_attention(config, length, dtype, tp, pp, want):
    got = kv_min(config, length, dtype, tp, pp)
    assert got.bytes == want, got.how
    assert f"{length} tokens" in got.how


@pytest.mark.parametrize(
    "config, length, said",
    [
        (MLA, 32768, "MLA"),
        (HYBRID_PATTERN, 32768, "hybrid"),
        (LINEAR, 32768, "hybrid"),
        (SLIDING, 32768, "sliding-window"),
        (WINDOW, 32768, "sliding-window"),
        (MAMBA, 32768, "Mamba"),
        (None, 32768, "no config.json"),
        (QWEN3_235B, None, "max_model_len not set"),
        ({"num_hidden_layers": 4}, 32768, "lacks"),
        ({**QWEN3_4B, "torch_dtype": "int4"}, 32768, "lacks"),  # a dtype it does not know: not guessed
    ],
)
def test_kv_minimum_is_unknown_and_says_why_rather_than_a_guess(config, length, said):
    got = kv_min(config, length, "auto", 1)
    assert got.bytes is None and said in got.how


def test_weights_are_the_listed_weight_files_split_over_the_ranks():
    files = [("model-00001-of-00002.safetensors", 40 * GB), ("model-00002-of-00002.safetensors", 35 * GB)]
    files += [("config.json", 5000), ("tokenizer.json", 11 * 10**6)]
    assert weight_bytes(files) == 75 * GB
    assert weight_bytes([("model.gguf", 10), ("README.md", 3)]) == 10
    assert weight_bytes([("a.onnx_data", 7), ("README.md", 3)]) == 10  # no weight file: every file
    assert weights_per_rank(75 * GB, 2, 1) == 37.5 * GB
    assert weights_per_rank(75 * GB, 2, 2) == 18.75 * GB
    assert weights_per_rank(10, 3, 1) == 4  # rounded up


# a 128 GB Spark reads MemTotal 125276348 kB (tests/unit/test_checks.py's capture); a 64 GB one half
M128, M64 = 125276348 * 1024, 62638174 * 1024


@pytest.mark.parametrize(
    "weights, kv, util, total, fits",
    [
        (75 * GB, KvMin(None, "hybrid"), 0.8, M128, True),  # nemotron3-super-nvfp4-single on 128 GB
        (75 * GB, KvMin(None, "hybrid"), 0.8, M64, False),  # ... on 64 GB
        (40 * GB, KvMin(3 * GB, "..."), 0.8, M64, True),
        (48 * GB, KvMin(4 * GB, "..."), 0.8, M64, False),  # the KV minimum tips it
        (None, KvMin(None, "?"), 0.8, M64, None),  # no listing: not judged
        (40 * GB, KvMin(None, "?"), 0.8, None, None),  # no MemTotal: not judged
    ],
)
def test_the_fit_and_its_arithmetic(weights, kv, util, total, fits):
    f = Fit(weights, kv, util, total)
    assert f.fits is fits
    text = f.arithmetic()
    assert f"gpu_memory_utilization {util:g} x MemTotal" in text
    assert ("short" in text) is (fits is False)


def test_the_arithmetic_reads_as_the_sum():
    f = Fit(75 * GB, KvMin(None, "hybrid layers (hybrid_override_pattern)"), 0.8, 64 * GB)
    assert f.arithmetic() == (
        "weights per rank 75.0 GB + KV for one max_model_len sequence unknown (hybrid layers "
        "(hybrid_override_pattern)) against gpu_memory_utilization 0.8 x MemTotal 64.0 GB = 51.2 GB: 23.8 GB short"
    )


def test_memory_sizes():
    assert memory_fit.same_size({"a": M128, "b": M128 - 2 * GB})
    assert not memory_fit.same_size({"a": M128, "b": M64})
    assert memory_fit.same_size({})


# --- lint, offline --------------------------------------------------------------------------------

INVENTORY = """
[cluster]
name = "sparks"
[[nodes]]
name = "spark-a"
role = "head"
ssh = "spark@192.168.1.11"
control_if = "enP7s7"
control_ip = "192.168.1.11"
data_plane = [{ netdev = "enp1s0f0np0", hca = "rocep1s0f0" }]
{mem}
"""


def _inv(mem: str):
    return parse_inventory(INVENTORY.replace("{mem}", mem), source="test")


def test_lint_judges_a_remembered_listing_against_memory_gb_or_128_gb_and_says_which():
    prof = load_profile("nemotron3-super-nvfp4-single")  # about 75 GB of weights, one rank at 0.8
    size = {"weights": 75 * GB, "source": "the hub's listing of it", "config": None}
    probs, notes = memory_fit_check(prof, _inv("memory_gb = 64.1"), size)
    assert [p.rule for p in probs] == ["memory-fit"]
    assert "spark-a: weights per rank 75.0 GB" in probs[0].message
    assert "memory_gb 64.1 from the inventory" in probs[0].message and "short" in probs[0].message
    probs, notes = memory_fit_check(prof, _inv(""), size)
    assert probs == [] and "128 GB assumed: the inventory states no memory_gb" in notes[0]
    probs, notes = memory_fit_check(prof, _inv("memory_gb = 128.3"), size)
    assert probs == [] and "memory_gb 128.3 from the inventory" in notes[0]
    probs, notes = memory_fit_check(prof, None, None)
    assert probs == [] and "not judged" in notes[0]


def test_lint_reads_what_doctor_remembered(monkeypatch):
    from sparkcluster.config.lint import lint

    prof = load_profile("nemotron3-super-nvfp4-single")
    assert "memory-fit" not in [p.rule for p in lint(prof, _inv("memory_gb = 64.1"))]
    model_memory.remember(prof.model, prof.revision, 75 * GB, "a" * 40, "the hub's listing", {"kv_lora_rank": 1})
    assert model_memory.get(prof.model, prof.revision)["config"] == {"kv_lora_rank": 1}
    assert "memory-fit" in [p.rule for p in lint(prof, _inv("memory_gb = 64.1"))]
