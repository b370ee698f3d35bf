"""Seed 000's and seed 004's one-model-per-Spark profiles: they load, lint clean, and serve the
seeds' own command lines; the lint rules their traps call for, both sides."""

from __future__ import annotations

import pytest
from test_lint import DATA, rules, variant

from sparkcluster.config import inventory
from sparkcluster.config.flags import Gate, serve_argv
from sparkcluster.config.lint import failures, lint, memory_sum_problems
from sparkcluster.config.profile import available, load_profile

INV = inventory.load(DATA / "profile-cluster.toml")
SINGLE = ("qwen36-35b-fp8-single", "qwen36-35b-nvfp4-mtp", "gemma4-26b-fp8-mtp")

# sparkcluster always passes both sizes; at 1 they are vLLM's defaults, which seed 004 leaves implicit
# and seed 000 states for TP only
ALWAYS_TP1 = ["--tensor-parallel-size", "1", "--pipeline-parallel-size", "1"]


def pairs(argv: list[str]) -> list[tuple[str, str | None]]:
    """(flag, value or None) pairs, sorted: vLLM does not care about flag order. Numbers compare
    as numbers: the seeds write 0.70, the argv 0.7."""
    out, i = [], 0
    while i < len(argv):
        flag, value = argv[i], None
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            value, i = argv[i + 1], i + 1
        out.append((flag, _num(value)))
        i += 1
    return sorted(out, key=lambda fv: (fv[0], fv[1] or ""))


def _num(v: str | None) -> str | None:
    try:
        return repr(float(v)) if v is not None else None
    except ValueError:
        return v


@pytest.mark.parametrize("name", SINGLE)
def test_loads_and_lints_clean(name):
    assert name in available()
    p = load_profile(name)
    assert p.serve.tensor_parallel_size == 1 and p.world_size == 1
    assert p.serve.distributed_executor_backend is None
    # seed 004's Gemma forwards VLLM_DISABLE_COMPILE_CACHE=1, kept with its warning (the profile says why)
    warned = ["compile-cache-defeated"] if name == "gemma4-26b-fp8-mtp" else []
    assert rules(lint(p)) == warned and failures(lint(p)) == []
    # on the pair (2 GPUs) a TP=1 profile runs on one node (`up --node`), and lints clean there too
    assert rules(lint(p, INV)) == warned
    assert rules(lint(p, INV.only([INV.nodes[1].name]))) == warned


def test_seed_000_command_line():
    argv = serve_argv(load_profile("qwen36-35b-fp8-single"))
    # seed 000, "compose.yml", command: vllm serve Qwen/Qwen3.6-35B-A3B-FP8 ...
    seed = [
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--tensor-parallel-size",
        "1",
        "--gpu-memory-utilization",
        "0.70",
        "--max-model-len",
        "32768",
        "--kv-cache-dtype",
        "fp8",
        "--max-num-batched-tokens",
        "8192",
        "--enable-prefix-caching",
        "--trust-remote-code",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "qwen3_coder",
        "--reasoning-parser",
        "qwen3",
    ]
    assert argv[:3] == ["vllm", "serve", "Qwen/Qwen3.6-35B-A3B-FP8"]
    assert pairs(argv[3:]) == pairs(seed + ["--pipeline-parallel-size", "1"])


def test_seed_004_qwen_command_line():
    argv = serve_argv(load_profile("qwen36-35b-nvfp4-mtp"))
    # seed 004, vllm-qwen36 unit, ExecStart after the image nvcr.io/nvidia/vllm:26.04-py3
    seed = [
        "--tokenizer",
        "Qwen/Qwen3.6-35B-A3B",
        "--quantization",
        "compressed-tensors",
        "--kv-cache-dtype",
        "fp8",
        "--trust-remote-code",
        "--max-model-len",
        "131072",
        "--gpu-memory-utilization",
        "0.55",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "qwen3_coder",
        "--reasoning-parser",
        "qwen3",
        "--speculative-config",
        '{"method":"mtp","num_speculative_tokens":2}',
        "--enable-prefix-caching",
        "--max-num-batched-tokens",
        "8192",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
    ]
    assert argv[:3] == ["vllm", "serve", "RedHatAI/Qwen3.6-35B-A3B-NVFP4"]
    assert pairs(argv[3:]) == pairs(seed + ALWAYS_TP1)


def test_seed_004_gemma_command_line():
    p = load_profile("gemma4-26b-fp8-mtp")
    argv = serve_argv(p)
    # seed 004, vllm-gemma4 unit, ExecStart after the image vllm/vllm-openai:gemma4-0505-arm64-cu130,
    # whose entrypoint is `vllm serve`: the model comes first, no prefix
    seed = [
        "--quantization",
        "fp8",
        "--kv-cache-dtype",
        "fp8",
        "--trust-remote-code",
        "--max-model-len",
        "65536",
        "--gpu-memory-utilization",
        "0.80",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
        "--speculative-config",
        '{"method":"mtp","model":"google/gemma-4-26B-A4B-it-assistant","num_speculative_tokens":4}',
        "--enable-prefix-caching",
        "--host",
        "0.0.0.0",
        "--max-num-batched-tokens",
        "8192",
        "--port",
        "8000",
    ]
    assert p.image.kind == "vllm-openai"
    assert argv[0] == "google/gemma-4-26B-A4B-it"
    assert pairs(argv[1:]) == pairs(seed + ALWAYS_TP1)


def test_seed_004_container_settings():
    for name in ("qwen36-35b-nvfp4-mtp", "gemma4-26b-fp8-mtp"):
        p = load_profile(name)
        assert p.ulimit_stack == 67108864  # seed 004: --ulimit stack=67108864
        assert p.drop_page_cache  # seed 004: ExecStartPre drop_caches
        assert p.image.vllm_version is None  # seed 004 names no vLLM version
        assert p.secrets == []  # seed 004 passes no HF_TOKEN or VLLM_API_KEY
    # seed 004's VLLM_USE_V1=1 is dropped: NGC 26.04's vLLM has no V0 engine (lint rule env-unread)
    assert load_profile("qwen36-35b-nvfp4-mtp").forwarded_env() == {"VLLM_FLASHINFER_MOE_BACKEND": "latency"}
    assert load_profile("gemma4-26b-fp8-mtp").forwarded_env() == {"VLLM_DISABLE_COMPILE_CACHE": "1"}


# ---- schema ------------------------------------------------------------------------------------


def test_single_rank_has_no_executor_flag_unless_named():
    p = variant("qwen36-35b-fp8-single")
    assert "--distributed-executor-backend" not in serve_argv(p)
    p = variant("qwen36-35b-fp8-single", serve__distributed_executor_backend="mp")
    assert "--distributed-executor-backend" in serve_argv(p)
    assert variant("nemotron").serve.distributed_executor_backend == "ray"  # the pair keeps Ray


def test_tokenizer_and_attention_backend_flags():
    p = variant("gemma4-26b-fp8-mtp", serve__attention_backend="TRITON_ATTN", serve__tokenizer="org/tok")
    argv = serve_argv(p)
    assert argv[argv.index("--attention-backend") + 1] == "TRITON_ATTN"
    assert argv[argv.index("--tokenizer") + 1] == "org/tok"
    for bad in ({"serve__attention_backend": "triton attn"}, {"serve__tokenizer": "a b"}, {"ulimit_stack": 0}):
        with pytest.raises(ValueError):
            variant("gemma4-26b-fp8-mtp", **bad)


def test_gate_without_a_vllm_version_judges_only_the_ngc_release():
    g = Gate(since=(0, 20, 0), ngc_absent_through=(25, 11), source="seed X")
    assert g.refusal(None, "ngc", "26.04-py3") is None
    assert g.refusal(None, "ngc", "25.11-py3").startswith("NGC image 25.11-py3 rejects it")
    assert g.refusal("0.19.0", "ngc", "26.04-py3").startswith("vLLM 0.19.0 rejects it")


# ---- lint: the seeds' traps --------------------------------------------------------------------


def test_prefix_caching_hybrid_on_qwen36():
    # seed 004: "block_size (2128) must be <= max_num_batched_tokens (2048)"
    for mnbt in (None, 2048, 2127):
        probs = lint(variant("qwen36-35b-nvfp4-mtp", serve__max_num_batched_tokens=mnbt))
        assert rules(probs) == ["prefix-caching-hybrid"]
        assert "8192" in probs[0].fix
    assert lint(variant("qwen36-35b-nvfp4-mtp", serve__max_num_batched_tokens=2128)) == []
    assert (
        lint(variant("qwen36-35b-nvfp4-mtp", serve__max_num_batched_tokens=None, serve__enable_prefix_caching=False))
        == []
    )


def test_compressed_tensors_may_name_its_own_format():
    # seed 004 passes --quantization compressed-tensors to a compressed-tensors checkpoint
    assert lint(variant("qwen36-35b-nvfp4-mtp", serve__quantization=None)) == []
    probs = lint(variant("qwen36-35b-nvfp4-mtp", serve__quantization="modelopt"))
    assert rules(probs) == ["quantization"]
    assert probs[0].message == "compressed-tensors checkpoint must not pass --quantization modelopt"


def test_draft_model_method_for_a_drafter():
    spec = {"method": "draft_model", "model": "google/gemma-4-26B-A4B-it-assistant", "num_speculative_tokens": 4}
    probs = lint(variant("gemma4-26b-fp8-mtp", serve__speculative_config=spec))
    assert rules(failures(probs)) == ["speculative-method"]
    assert "google/gemma-4-26B-A4B-it-assistant" in probs[0].message
    assert 'method = "mtp"' in probs[0].fix


def test_mtp_with_or_without_a_drafter_passes():
    # seed 004 runs both: Qwen3.6's own MTP layers (no model) and Gemma 4's MTP drafter (model given)
    assert lint(variant("qwen36-35b-nvfp4-mtp")) == []
    assert failures(lint(variant("gemma4-26b-fp8-mtp"))) == []
    assert failures(lint(variant("gemma4-26b-fp8-mtp", serve__speculative_config=None))) == []


def test_memory_sum_on_one_node():
    gemma = load_profile("gemma4-26b-fp8-mtp")  # 0.80
    qwen = load_profile("qwen36-35b-nvfp4-mtp")  # 0.55
    assert memory_sum_problems([gemma]) == []
    assert memory_sum_problems([]) == []
    # seed 004's Spark 1 before the clean-up: Qwen3.6 at 0.55 plus a Nano sidecar at 0.20
    sidecar = variant("qwen36-35b-fp8-single", serve__gpu_memory_utilization=0.20)
    assert memory_sum_problems([qwen, sidecar]) == []
    assert (
        memory_sum_problems(
            [
                variant("qwen36-35b-fp8-single", serve__gpu_memory_utilization=0.45),
                variant("gemma4-26b-fp8-mtp", serve__gpu_memory_utilization=0.40),
            ]
        )
        == []
    )
    probs = memory_sum_problems([gemma, qwen])
    assert rules(probs) == ["memory-sum"]
    assert probs[0].message.startswith(
        "--gpu-memory-utilization on one node sums to 1.35 (gemma4-26b-fp8-mtp 0.8 + qwen36-35b-nvfp4-mtp 0.55)"
    )
    assert "another node" in probs[0].fix
