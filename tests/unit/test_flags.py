"""serve_argv and the version gates."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from sparkcluster import redact
from sparkcluster.config.flags import (
    FLAGS,
    Gate,
    flag_names,
    flag_value,
    ngc_release,
    parse_version,
    refusals,
    serve_argv,
    supervised_argv,
)
from sparkcluster.config.profile import Profile, load_profile

REPO = Path(__file__).resolve().parents[2]
# the one-model-per-Spark profiles of seeds 000 and 004 (issue 20)
SINGLE = ("qwen36-35b-fp8-single", "qwen36-35b-nvfp4-mtp", "gemma4-26b-fp8-mtp")


def variant(base: str = "nemotron", **changes) -> Profile:
    """The seed profile with dotted-key changes (a__b = [a][b]); value None deletes the key."""
    data = tomllib.loads((REPO / "env-profiles" / f"{base}.toml").read_text())
    for key, value in changes.items():
        *parents, leaf = key.split("__")
        d = data
        for p in parents:
            d = d.setdefault(p, {})
        if value is None:
            d.pop(leaf, None)
        else:
            d[leaf] = value
    return Profile.model_validate({**data, "name": "variant"})


def test_parse_version():
    assert parse_version("0.21.0") == (0, 21, 0)
    assert parse_version("0.23.1rc1") == (0, 23, 1)
    assert parse_version("0.18.2-dev") == (0, 18, 2)
    assert parse_version("v0.20.0") == (0, 20, 0)
    assert parse_version("0.19") == (0, 19, 0)
    with pytest.raises(ValueError):
        parse_version("nightly")


def test_ngc_release():
    assert ngc_release("26.05.post1-py3") == (26, 5)
    assert ngc_release("25.11-py3") == (25, 11)
    assert ngc_release("nightly") is None
    assert ngc_release("v0.20.0") is None


def test_nemotron_argv_ngc_has_prefix():
    p = load_profile("nemotron")
    argv = serve_argv(p)
    assert argv[:3] == ["vllm", "serve", "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-NVFP4"]
    assert flag_value(argv, "--tensor-parallel-size") == "2"
    assert flag_value(argv, "--gpu-memory-utilization") == "0.75"
    assert flag_value(argv, "--max-model-len") == "262144"
    assert flag_value(argv, "--distributed-executor-backend") == "ray"
    assert flag_value(argv, "--moe-backend") == "marlin"
    assert flag_value(argv, "--reasoning-parser") == "super_v3"
    assert flag_value(argv, "--reasoning-parser-plugin") == "/root/.cache/huggingface/super_v3_reasoning_parser.py"
    for f in ("--async-scheduling", "--enable-chunked-prefill", "--trust-remote-code", "--enable-auto-tool-choice"):
        assert f in argv
    assert "--api-key" not in argv
    assert "--swap-space" not in argv


def test_vllm_openai_has_no_prefix():
    p = load_profile("nemotron")
    argv = serve_argv(p, "vllm-openai")
    assert argv[0] == p.model
    assert "vllm" not in argv and "serve" not in argv
    assert serve_argv(p, "ngc")[2:] == argv


def test_default_kind_from_image():
    p = variant(image__base="vllm/vllm-openai", image__tag="v0.21.0", image__kind=None)
    assert p.image.kind == "vllm-openai"
    assert serve_argv(p)[0] == p.model


def test_port_and_hf_cache():
    p = load_profile("nemotron")
    argv = serve_argv(p, port=8123, hf_cache="/data/hf")
    assert flag_value(argv, "--port") == "8123"
    assert flag_value(argv, "--reasoning-parser-plugin") == "/data/hf/super_v3_reasoning_parser.py"
    assert flag_value(serve_argv(variant(serve__port=9000), port=8123), "--port") == "9000"


def test_testbed_argv():
    argv = serve_argv(load_profile("testbed"))
    assert argv == [
        "vllm",
        "serve",
        "sparkcluster/testbed-tiny",
        "--served-model-name",
        "testbed-tiny",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--tensor-parallel-size",
        "2",
        "--pipeline-parallel-size",
        "1",
        "--distributed-executor-backend",
        "ray",
        "--max-model-len",
        "1024",
        "--gpu-memory-utilization",
        "0.2",
        "--enforce-eager",
    ]


def test_optional_bools_and_json():
    p = variant(
        serve__enable_prefix_caching=False, serve__speculative_config={"method": "mtp", "num_speculative_tokens": 2}
    )
    argv = serve_argv(p)
    assert "--no-enable-prefix-caching" in argv
    assert flag_value(argv, "--speculative-config") == '{"method":"mtp","num_speculative_tokens":2}'


def test_argv_never_holds_secrets(monkeypatch):
    redact.register("hf_thisisasecretvaluexyz")
    for name in ("nemotron", "qwen3-30b", "qwen3-122b", "testbed", *SINGLE):
        argv = serve_argv(load_profile(name))
        assert redact.mask(" ".join(argv)) == " ".join(argv)
        assert not any(a.startswith("--api-key") for a in argv)


def test_flag_names_and_value():
    argv = ["m", "--a", "1", "--b=2", "--c"]
    assert flag_names(argv) == ["--a", "--b", "--c"]
    assert flag_value(argv, "--a") == "1"
    assert flag_value(argv, "--b") == "2"
    assert flag_value(argv, "--c") is None


def test_every_typed_field_has_a_flag():
    from sparkcluster.config.profile import Serve

    mapped = {f.field for f in FLAGS if f.field}
    handled = {"host", "port", "extra_flags", "reasoning_parser_plugin_url"}
    assert set(Serve.model_fields) == mapped | handled


def test_gate_messages():
    g = Gate(since=(0, 20, 0), source="seed X")
    assert g.refusal("0.19.0", "vllm-openai", "v0.19.0") == "vLLM 0.19.0 rejects it (needs vLLM >= 0.20.0; seed X)"
    assert g.refusal("0.20.0", "vllm-openai", "v0.20.0") is None


def test_refusals_empty_for_seed_profiles():
    for name in ("nemotron", "qwen3-30b", "qwen3-122b", "testbed", *SINGLE):
        assert refusals(load_profile(name)) == []


def test_exec_argv_always_prefixed():
    p = variant(image__base="vllm/vllm-openai", image__tag="v0.21.0", image__kind="vllm-openai")
    assert serve_argv(p)[0] == p.model
    assert supervised_argv(p)[:3] == ["vllm", "serve", p.model]
