"""Each lint rule broken on purpose; nemotron and the other seed profiles pass."""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path

import pytest

from sparkcluster import redact
from sparkcluster.config import inventory
from sparkcluster.config.lint import CLUSTER_RULES, lint
from sparkcluster.config.profile import Profile, available, load_profile
from sparkcluster.config.service_profile import is_service

REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data"
INV = inventory.load(DATA / "profile-cluster.toml")


def variant(base: str = "nemotron", **changes) -> Profile:
    """The seed profile with dotted-key changes; value None deletes the key."""
    data = tomllib.loads((REPO / "env-profiles" / f"{base}.toml").read_text())
    data = copy.deepcopy(data)
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


def rules(problems) -> list[str]:
    return [p.rule for p in problems]


@pytest.mark.parametrize("name", ["nemotron", "qwen3-30b", "qwen3-122b", "testbed"])
def test_seed_profiles_pass(name):
    assert name in available()
    p = load_profile(name)
    assert lint(p) == []
    assert lint(p, INV) == []


def test_gpu_memory_utilization_above_085():
    probs = lint(variant(serve__gpu_memory_utilization=0.9))
    assert rules(probs) == ["gpu-memory-utilization"]
    assert "0.9 is above 0.85 on unified memory" in probs[0].message
    assert "allow_high_gpu_memory_utilization" in probs[0].fix


def test_gpu_memory_utilization_override():
    assert lint(variant(serve__gpu_memory_utilization=0.9, allow_high_gpu_memory_utilization=True)) == []
    assert lint(variant(serve__gpu_memory_utilization=0.85)) == []


def test_tp_pp_must_equal_gpu_count():
    p = variant(serve__tensor_parallel_size=4)
    assert lint(p) == []  # cluster rule: skipped without an inventory
    probs = lint(p, INV)
    assert rules(probs) == ["tp-pp-gpus"]
    assert probs[0].message == (
        "tensor_parallel_size x pipeline_parallel_size = 4 x 1 = 4, but the cluster has 2 GPU(s)"
    )
    # as wide as one node: it runs there alone (`up --node`); on that one node it fits exactly
    single = variant(serve__tensor_parallel_size=1, serve__pipeline_parallel_size=1)
    assert rules(lint(single, INV)) == []
    assert rules(lint(single, INV.only([INV.nodes[1].name]))) == []
    assert rules(lint(variant(serve__tensor_parallel_size=2), INV.only([INV.nodes[0].name]))) == ["tp-pp-gpus"]
    assert lint(variant(serve__tensor_parallel_size=1, serve__pipeline_parallel_size=2), INV) == []


def test_cluster_rules_named():
    assert "tp-pp-gpus" in CLUSTER_RULES


def test_prefix_caching_on_hybrid_needs_aligned_block_size():
    probs = lint(variant(serve__enable_prefix_caching=True))  # default 2048 < 2128 (seed 004)
    assert rules(probs) == ["prefix-caching-hybrid"]
    assert "block_size 2128, above --max-num-batched-tokens 2048" in probs[0].message
    assert "8192" in probs[0].fix
    assert rules(lint(variant(serve__enable_prefix_caching=True, serve__max_num_batched_tokens=2048))) == [
        "prefix-caching-hybrid"
    ]
    assert lint(variant(serve__enable_prefix_caching=True, serve__max_num_batched_tokens=2128)) == []
    assert lint(variant(serve__enable_prefix_caching=True, serve__max_num_batched_tokens=8192)) == []
    # not hybrid: no rule
    assert lint(variant(hybrid=False, serve__enable_prefix_caching=True)) == []


def test_tool_choice_needs_parser_and_vice_versa():
    probs = lint(variant(serve__tool_call_parser=None))
    assert rules(probs) == ["tool-choice-pair"]
    assert probs[0].message.startswith("--enable-auto-tool-choice without --tool-call-parser")
    probs = lint(variant(serve__enable_auto_tool_choice=False))
    assert rules(probs) == ["tool-choice-pair"]
    assert probs[0].message.startswith("--tool-call-parser without --enable-auto-tool-choice")
    # both given through extra flags: the pair is complete (only the duplicate-flag rule speaks)
    probs = lint(
        variant(
            serve__enable_auto_tool_choice=False,
            serve__tool_call_parser=None,
            serve__extra_flags=["--enable-auto-tool-choice", "--tool-call-parser", "hermes"],
        )
    )
    assert rules(probs) == ["duplicate-flag", "duplicate-flag"]


def test_modelopt_needs_quantization_modelopt():
    probs = lint(variant(serve__quantization="fp4"))
    assert rules(probs) == ["quantization"]
    assert probs[0].message == "ModelOpt NVFP4 checkpoint needs --quantization modelopt (profile has fp4)"
    probs = lint(variant(serve__quantization=None))
    assert probs[0].message.endswith("(profile has none)")


def test_compressed_tensors_must_not_pass_quantization():
    probs = lint(variant(checkpoint_format="compressed-tensors"))
    assert rules(probs) == ["quantization"]
    assert "must not pass --quantization" in probs[0].message
    assert lint(variant(checkpoint_format="compressed-tensors", serve__quantization=None)) == []


def test_vllm_serve_prefix_in_extra_flags():
    probs = lint(variant(serve__extra_flags=["vllm", "serve"]))
    assert rules(probs) == ["image-kind"]
    assert "unrecognized arguments" in probs[0].message


def test_image_kind_mismatch():
    probs = lint(variant(image__kind="vllm-openai"))
    assert rules(probs) == ["image-kind"]
    assert probs[0].fix == 'set image.kind = "ngc"'


def test_api_key_flag_refused():
    probs = lint(variant(serve__extra_flags=["--api-key", "whatever"]))
    assert "secret-on-command-line" in rules(probs)
    assert probs[0].message.startswith("--api-key in serve.extra_flags")


def test_secret_value_in_extra_flags():
    probs = lint(variant(serve__extra_flags=["--foo", "hf_abcdefghijklmnopqrstuvwxyz"]))
    assert rules(probs) == ["secret-on-command-line"]
    assert "hf_abc" not in probs[0].message  # never echo the value


def test_registered_secret_value_in_extra_flags():
    redact.register("s3cr3t-value-registered")
    probs = lint(variant(serve__extra_flags=["--foo", "s3cr3t-value-registered"]))
    assert rules(probs) == ["secret-on-command-line"]


@pytest.mark.parametrize("name", ["HF_TOKEN", "VLLM_API_KEY", "OTHER_TOKEN"])
def test_secret_names_in_forwarded_vars(name):
    probs = lint(variant(env__forward={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1", name: "x"}))
    assert rules(probs) == ["secret-in-forwarded-vars"]
    assert probs[0].message.startswith(f"env.forward.{name}: a secret")


def test_secret_value_in_forwarded_vars():
    probs = lint(variant(env__forward={"SOMETHING": "sk-abcdefghijklmnopqrstuvwxyz"}))
    assert rules(probs) == ["secret-in-forwarded-vars"]
    assert "sk-abc" not in probs[0].message


def test_per_host_var_forwarded():
    probs = lint(variant(env__forward={"NCCL_IB_HCA": "rocep1s0f0"}))
    assert rules(probs) == ["managed-var-forwarded"]


def test_typed_flag_in_extra_flags():
    probs = lint(variant(serve__extra_flags=["--tensor-parallel-size=2"]))
    assert rules(probs) == ["duplicate-flag"]
    assert "serve.tensor_parallel_size" in probs[0].message


def test_plugin_without_parser():
    probs = lint(variant(serve__reasoning_parser=None))
    assert rules(probs) == ["reasoning-plugin"]


def test_executor_backend_must_be_ray():
    probs = lint(variant(serve__distributed_executor_backend="mp"))
    assert rules(probs) == ["executor-backend"]


def test_port_mismatch_with_inventory():
    assert lint(variant(serve__port=9000)) == []
    probs = lint(variant(serve__port=9000), INV)
    assert rules(probs) == ["port-mismatch"]


def test_flags_rejected_by_ngc_25_11():
    probs = lint(
        variant(
            image__tag="25.11-py3", image__vllm_version="0.11.0", env__forward={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}
        )
    )
    assert set(rules(probs)) == {"flag-version"}
    items = sorted(p.message.split(":", 1)[0] for p in probs)
    assert items == sorted(
        [
            "--moe-backend",
            "--max-cudagraph-capture-size",
            "--async-scheduling",
            "--reasoning-parser-plugin",
            "--reasoning-parser super_v3",
        ]
    )
    moe = next(p for p in probs if p.message.startswith("--moe-backend"))
    assert "nvcr.io/nvidia/vllm:25.11-py3 (vLLM 0.11.0)" in moe.message
    assert "absent from NGC 25.11 and older" in moe.message


def test_mamba_float16_rejected_by_25_11():
    p = variant(
        image__tag="25.11-py3",
        image__vllm_version="0.11.0",
        serve__moe_backend=None,
        serve__max_cudagraph_capture_size=None,
        serve__async_scheduling=False,
        serve__reasoning_parser="qwen3",
        serve__reasoning_parser_plugin_url=None,
        serve__mamba_ssm_cache_dtype="float16",
    )
    probs = lint(p)
    assert rules(probs) == ["flag-version"]
    assert probs[0].message.startswith("--mamba-ssm-cache-dtype float16: image nvcr.io/nvidia/vllm:25.11-py3")
    assert lint(variant(serve__mamba_ssm_cache_dtype="float16")) == []  # fine on 26.05.post1


def test_swap_space_gone_from_26_05():
    probs = lint(variant(serve__extra_flags=["--swap-space", "0"]))
    assert rules(probs) == ["flag-version"]
    assert probs[0].message.startswith("--swap-space: image nvcr.io/nvidia/vllm:26.05.post1-py3 (vLLM 0.21.0)")
    # a vllm-openai image at 0.21.0 refuses it by version too
    probs = lint(
        variant(
            image__base="vllm/vllm-openai",
            image__tag="v0.21.0",
            image__kind="vllm-openai",
            serve__extra_flags=["--swap-space", "0"],
        )
    )
    assert rules(probs) == ["flag-version"]
    assert "gone from vLLM 0.21.0" in probs[0].message
    # an older NGC image still takes it
    assert (
        lint(variant(image__tag="26.04-py3", image__vllm_version="0.19.0", serve__extra_flags=["--swap-space", "0"]))
        == []
    )


def test_flashinfer_moe_env_ignored_from_023():
    probs = lint(
        variant(
            image__base="vllm/vllm-openai",
            image__tag="nightly",
            image__kind="vllm-openai",
            image__vllm_version="0.23.1",
        )
    )
    assert rules(probs) == ["env-version"]
    assert probs[0].message.startswith("env.forward.VLLM_USE_FLASHINFER_MOE_FP4: vLLM 0.23.1 ignores it")
    assert "--moe-backend" in probs[0].fix


def test_every_problem_at_once():
    probs = lint(
        variant(
            serve__gpu_memory_utilization=0.95,
            serve__tool_call_parser=None,
            serve__quantization="fp4",
            serve__tensor_parallel_size=4,
        ),
        INV,
    )
    assert set(rules(probs)) == {"gpu-memory-utilization", "tp-pp-gpus", "tool-choice-pair", "quantization"}


def test_no_shipped_profile_can_call_its_own_long_prefill_a_wedge():
    """Issue 25: stall_s covers one scheduler step (max_num_batched_tokens) at the profile's slowest
    prefill rate, twice over, for every shipped profile."""
    for name in available():
        prof = load_profile(name, service=True)
        if is_service(prof):  # issue 60: a service has no engine, no prefill and no stall bound
            continue
        assert not [x for x in lint(prof) if x.rule == "supervisor-stall"], name


def test_a_stall_bound_under_one_prefill_step_is_refused_with_the_bound_to_set():
    prof = variant("nemotron", supervisor={"stall_s": 10})
    (problem,) = [x for x in lint(prof) if x.rule == "supervisor-stall"]
    assert "8192 tokens at 500 tok/s = 16 s" in problem.message and "raise [supervisor] stall_s to 33" in problem.fix


def test_settings_that_need_root_are_named():
    """The SSH user of a Spark is an ordinary account in `docker`: an HF cache only root may write,
    or a root login, is named by lint with the fix; the default needs neither."""
    from conftest import inventory_dict, make_inventory

    prof = load_profile("testbed")
    assert not [x for x in lint(prof, make_inventory()) if x.rule == "needs-root"]
    d = inventory_dict()
    d["cluster"]["hf_cache"] = "/root/.cache/huggingface"
    got = [x for x in lint(prof, make_inventory(d)) if x.rule == "needs-root"]
    assert len(got) == 1
    assert "/root/.cache/huggingface" in got[0].message and "~/.cache/huggingface" in got[0].fix
    for n in d["nodes"]:
        n["ssh"] = f"root@{n['name']}"
    assert not [x for x in lint(prof, make_inventory(d)) if x.rule == "needs-root"]


# --- the model's shape against TP x PP (issue 27): read from the staged snapshot's config.json -----

TINY = {"num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2}  # the testbed's tiny Llama
# Qwen3-235B-A22B's config.json (public, hub): 64 heads, 4 KV heads, 94 layers
QWEN3_235B = {"num_attention_heads": 64, "num_key_value_heads": 4, "num_hidden_layers": 94}


@pytest.mark.parametrize(
    "cfg, tp, pp, rules",
    [
        (TINY, 2, 2, []),
        (TINY, 4, 1, []),
        (TINY, 3, 1, ["tp-heads", "tp-kv-heads"]),
        (TINY, 1, 4, ["pp-layers"]),
        (QWEN3_235B, 4, 2, []),
        (QWEN3_235B, 2, 4, ["pp-layers"]),
        (QWEN3_235B, 8, 1, []),  # KV heads replicated: 8 is a multiple of 4
        ({"text_config": {"num_attention_heads": 6}}, 4, 1, ["tp-heads"]),
    ],
)
def test_model_shape(cfg, tp, pp, rules):
    from sparkcluster.config.lint import model_shape

    assert [p.rule for p in model_shape(cfg, tp, pp)] == rules


def test_model_shape_leaves_an_uneven_split_by_hand_alone():
    from sparkcluster.config.lint import model_shape

    assert model_shape(QWEN3_235B, 2, 4, {"VLLM_PP_LAYER_PARTITION": "24,24,23,23"}) == []
    assert [p.rule for p in model_shape(TINY, 1, 3, {"VLLM_PP_LAYER_PARTITION": "1,1,0"})] == ["pp-layers"]


def test_every_rule_is_registered_once_with_one_function_an_id_and_a_doc_line():
    """Issue 54: lint's rules are registered like the checks; each registered function makes the
    problems of its own rule only, at its declared severity, and every problem lint.py makes
    belongs to a registered rule (the docs list the registry: docs/reference/lint.md)."""
    import ast
    import inspect
    import textwrap

    from sparkcluster.config import lint as lint_module

    made = set()
    for r in lint_module.RULES.values():
        assert r.doc and "\n" not in r.doc and r.when in ("profile", "plan", "model"), r.id
        tree = ast.parse(textwrap.dedent(inspect.getsource(r.check)))
        own = [
            n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "Problem" and n.args
        ]
        for call in own:
            assert call.args[0].value == r.id, (r.id, call.args[0].value)
            sev = next((k.value.value for k in call.keywords if k.arg == "severity"), "fail")
            assert sev == r.severity, (r.id, sev)
        made |= {c.args[0].value for c in own}
    everywhere = {
        n.args[0].value
        for n in ast.walk(ast.parse(inspect.getsource(lint_module)))
        if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "Problem" and n.args
    }
    assert everywhere == set(lint_module.RULES)
    assert CLUSTER_RULES == tuple(r.id for r in lint_module.RULES.values() if r.cluster)


# --- forwarded variables with nothing left to read them, or that turn a kept cache off --------------

CAPTURED = Path(__file__).resolve().parents[1] / "captured"


def test_vllm_use_v1_is_unread_from_vllm_0_11_and_ngc_26_01():
    """vLLM 0.11.0 removed the V0 engine and vllm#28204 the variable; a later vLLM says so itself
    (llm-d-fast-model-actuation#597's line); NGC 26.01 ships vLLM 0.11.1 (its release notes)."""
    said = (CAPTURED / "vllm-unknown-env-use-v1-597.txt").read_text()
    name = said.split("Unknown vLLM environment variable detected: ")[1].strip()
    assert name == "VLLM_USE_V1"
    # seed 004's own line, on its image (NGC 26.04), before the profile dropped it
    probs = lint(variant("qwen36-35b-nvfp4-mtp", env__forward={name: "1"}))
    assert rules(probs) == ["env-unread"] and probs[0].severity == "warn"
    assert probs[0].message.startswith("env.forward.VLLM_USE_V1: it chose between the V0 and V1 engines")
    assert "NGC image 26.04-py3" in probs[0].message and "vllm-project/vllm#28204" in probs[0].message
    assert probs[0].fix == "remove VLLM_USE_V1 from env.forward"
    # by vLLM version, and not before V0 went
    on = dict(image__base="vllm/vllm-openai", image__kind="vllm-openai", env__forward={name: "1"})
    assert rules(lint(variant("qwen36-35b-nvfp4-mtp", image__tag="v0.11.0", image__vllm_version="0.11.0", **on))) == [
        "env-unread"
    ]
    assert lint(variant("qwen36-35b-nvfp4-mtp", image__tag="v0.10.2", image__vllm_version="0.10.2", **on)) == []
    assert lint(variant("qwen36-35b-nvfp4-mtp", image__tag="25.11-py3", env__forward={name: "1"})) == []


def test_turning_off_a_kept_cache_is_warned_where_sparkcluster_keeps_it():
    # seed 004's Gemma line (-e VLLM_DISABLE_COMPILE_CACHE=1): the shipped profile keeps it, warned
    probs = lint(load_profile("gemma4-26b-fp8-mtp"))
    assert rules(probs) == ["compile-cache-defeated"] and probs[0].severity == "warn"
    assert probs[0].message.startswith("env.forward.VLLM_DISABLE_COMPILE_CACHE=1 turns off vLLM's torch.compile cache")
    assert "every start compiles again" in probs[0].message
    # the CUDA driver's JIT cache likewise (CUDA Programming Guide: CUDA_CACHE_DISABLE=1 disables it)
    probs = lint(variant("qwen36-35b-nvfp4-mtp", env__forward={"CUDA_CACHE_DISABLE": "1"}))
    assert rules(probs) == ["compile-cache-defeated"] and "CUDA_CACHE_PATH" in probs[0].message
    # 0 (vLLM's own default, and the CUDA driver's) turns nothing off
    assert lint(variant("qwen36-35b-nvfp4-mtp", env__forward={"CUDA_CACHE_DISABLE": "0"})) == []
    # compile_cache = "image": nothing of sparkcluster's is mounted, nothing is lost
    assert lint(variant("gemma4-26b-fp8-mtp", compile_cache="image")) == []
