"""Profile models, loading, search path and per-node environment."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sparkcluster.config import inventory
from sparkcluster.config.profile import (
    PER_HOST_VARS,
    available,
    container_env,
    container_files,
    find,
    load_profile,
    non_carry_over_file,
    parse,
    per_host_env,
    reasoning_plugin,
    required_env_names,
    search_path,
    secret_env_names,
)
from sparkcluster.errors import InputError
from tests.testbed import PROFILES as TESTBED_PROFILES

REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data"
INV = inventory.load(DATA / "profile-cluster.toml")

MINIMAL = """
model = "org/model"
[image]
base = "nvcr.io/nvidia/vllm"
tag = "26.05.post1-py3"
vllm_version = "0.21.0"
"""


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SPARKCLUSTER_PROFILES", str(TESTBED_PROFILES))  # the testbed's, nothing of yours


def test_nemotron_values_from_seed():
    p = load_profile("nemotron")
    assert p.name == "nemotron"
    assert p.model == "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-NVFP4"
    assert p.image.ref == "nvcr.io/nvidia/vllm:26.05.post1-py3"
    assert p.image.kind == "ngc"
    assert p.image.vllm_version == "0.21.0"
    assert p.forwarded_env() == {
        "VLLM_NVFP4_GEMM_BACKEND": "marlin",
        "VLLM_FLASHINFER_ALLREDUCE_BACKEND": "trtllm",
        "VLLM_USE_FLASHINFER_MOE_FP4": "0",
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1",
    }
    assert p.serve.tensor_parallel_size == 2
    assert p.serve.gpu_memory_utilization == 0.75
    assert p.serve.max_model_len == 262144
    assert p.checkpoint_format == "modelopt" and p.hybrid
    assert p.secrets == ["HF_TOKEN", "VLLM_API_KEY"]


def test_testbed_profile():
    # the real engine: the testbed's stand-in of the NGC image holds vLLM 0.32.0 (CPU build)
    p = load_profile("testbed")
    assert p.model == "sparkcluster/testbed-tiny"
    assert p.served_name == "testbed-tiny"
    assert p.image.ref == "nvcr.io/nvidia/vllm:26.05.post1-py3"
    assert p.image.vllm_version == "0.32.0"
    assert p.forwarded_env() == {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "TORCHDYNAMO_DISABLE": "1"}
    assert p.serve.tensor_parallel_size == 2
    assert p.serve.gpu_memory_utilization == 0.2  # the testbed is one 24 GiB machine seen whole by both hosts
    assert p.serve.max_model_len == 1024
    assert p.serve.enforce_eager


def test_testbed_standin_profile():
    # the test double of vLLM 0.21, in an image of its own
    p = load_profile("testbed-standin")
    assert p.image.ref == "sparkcluster-testbed/vllm-standin:0.21"
    assert p.image.vllm_version == "0.21.0" and p.image.kind == "ngc"
    assert p.forwarded_env() == {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1", "FLASHINFER_DISABLE_VERSION_CHECK": "1"}
    assert p.serve.max_model_len == 4096
    assert p.serve.enforce_eager
    assert p.serve.reasoning_parser_plugin_url is None
    assert reasoning_plugin(p) is None


def test_qwen_profiles_fp8_tp2():
    for name in ("qwen3-30b", "qwen3-122b"):
        p = load_profile(name)
        assert p.checkpoint_format == "fp8"
        assert p.serve.quantization is None
        assert p.world_size == 2


def test_qwen3_30b_parsers_are_seed_002_launchers():
    # TechPreacher/dgx-spark-vllm-cluster qwen/launch-qwen-30b.sh (seed 002's repository) serves
    # Qwen3-30B-A3B-Thinking-2507-FP8 with --reasoning-parser deepseek_r1 --tool-call-parser hermes
    from sparkcluster.config.flags import serve_argv

    p = load_profile("qwen3-30b")
    assert p.model == "Qwen/Qwen3-30B-A3B-Thinking-2507-FP8"
    assert (p.serve.reasoning_parser, p.serve.tool_call_parser) == ("deepseek_r1", "hermes")
    argv = serve_argv(p)
    assert argv[argv.index("--reasoning-parser") + 1] == "deepseek_r1"
    assert argv[argv.index("--tool-call-parser") + 1] == "hermes"
    assert "--enable-auto-tool-choice" in argv


def test_min_driver_is_optional_and_checked_for_shape():
    from sparkcluster.checks.preflight import expectations
    from sparkcluster.config.profile import parse

    base = load_profile("testbed").path.read_text()
    assert parse(base, "t").min_driver is None
    p = parse('min_driver = "590.44"\n' + base, "t")
    assert p.min_driver == "590.44" and expectations(INV, p).min_driver == "590.44"
    with pytest.raises(InputError):
        parse('min_driver = "latest"\n' + base, "t")


def test_image_tag():
    p = load_profile("nemotron")
    assert p.image_tag("2.60.0") == "26.05.post1-py3-ray2.60.0"
    with pytest.raises(InputError):
        p.image_tag("latest; rm -rf /")


def test_per_host_env_from_inventory():
    p = load_profile("nemotron")
    head, worker = INV.nodes
    assert per_host_env(p, INV, head) == {
        "VLLM_HOST_IP": "192.168.100.10",
        "NCCL_SOCKET_IFNAME": "enp1s0f1np1",
        "GLOO_SOCKET_IFNAME": "enp1s0f1np1",
        "NCCL_IB_HCA": "rocep1s0f0,roceP2p1s0f0",
        "UCX_NET_DEVICES": "enp1s0f1np1",
        "OMPI_MCA_btl_tcp_if_include": "enp1s0f1np1",
    }
    w = per_host_env(p, INV, "spark-b")
    assert w["VLLM_HOST_IP"] == "192.168.100.11"
    assert w["NCCL_IB_HCA"] == "roceP2p1s0f1,rocep1s0f1"  # inventory order kept
    assert w["NCCL_SOCKET_IFNAME"] == "enp1s0f0np0"
    with pytest.raises(InputError):
        per_host_env(p, INV, "nope")


def test_container_env():
    p = load_profile("nemotron")
    env = container_env(p, INV, "spark-b")
    assert env["VLLM_NVFP4_GEMM_BACKEND"] == "marlin"
    assert env["VLLM_HOST_IP"] == "192.168.100.11"
    assert env["RAY_memory_usage_threshold"] == "1.0"  # seed 003
    assert env["VLLM_CONFIG_ROOT"] == "/etc/sparkcluster/vllm"
    assert "HF_TOKEN" not in env and "VLLM_API_KEY" not in env
    # shared part equal on every node
    a, b = (container_env(p, INV, n) for n in INV.nodes)
    assert {k: a[k] for k in required_env_names(p)} == {k: b[k] for k in required_env_names(p)}


def test_required_env_names():
    p = load_profile("nemotron")
    names = required_env_names(p)
    assert set(p.forwarded_env()) <= set(names)
    assert "RAY_memory_usage_threshold" in names and "VLLM_CONFIG_ROOT" in names
    assert not set(PER_HOST_VARS) & set(names)


def test_non_carry_over_file():
    p = load_profile("nemotron")
    path, text = non_carry_over_file(p)
    assert path == "/etc/sparkcluster/vllm/ray_non_carry_over_env_vars.json"
    names = json.loads(text)
    assert set(names) == set(PER_HOST_VARS) | {"HF_TOKEN", "VLLM_API_KEY"}
    assert container_files(p) == {path: text}
    assert path.startswith(container_env(p, INV, "spark-a")["VLLM_CONFIG_ROOT"] + "/")


def test_reasoning_plugin_path():
    p = load_profile("nemotron")
    url, path = reasoning_plugin(p, "/root/.cache/huggingface")
    assert url.endswith("/super_v3_reasoning_parser.py")
    assert path == "/root/.cache/huggingface/super_v3_reasoning_parser.py"


def test_secret_env_names():
    assert secret_env_names(load_profile("nemotron")) == ["HF_TOKEN", "VLLM_API_KEY"]


def test_minimal_profile_defaults():
    p = parse(MINIMAL, name="mini")
    assert p.image.kind == "ngc"
    assert p.serve.tensor_parallel_size == 2
    assert p.serve.gpu_memory_utilization == 0.75
    assert p.serve.distributed_executor_backend == "ray"
    assert p.shm_size == "16g"
    assert not p.drop_page_cache
    assert p.env.ray_memory_usage_threshold == 1.0
    assert p.served_model_name == "org/model"


def test_int_values_in_forward_become_strings():
    p = parse(MINIMAL + "[env.forward]\nVLLM_USE_FLASHINFER_MOE_FP4 = 0\n", name="mini")
    assert p.forwarded_env() == {"VLLM_USE_FLASHINFER_MOE_FP4": "0"}


def test_bad_fields_one_line_each_no_values_echoed():
    text = (
        MINIMAL.replace('model = "org/model"', 'model = "org/model"\nbogus = 1\nshm_size = "lots"')
        + "[serve]\ngpu_memory_utilization = 1.5\ntensor_parallel_size = 0\n"
        '[env.forward]\n"BAD NAME" = "hf_supersecretvaluexyz123"\n'
    )
    with pytest.raises(InputError) as ei:
        parse(text, name="mini", source="mini.toml")
    err = ei.value
    assert err.exit_code == 2
    d = "\n".join(err.details)
    assert "mini.toml: bogus: unknown key" in d
    assert "mini.toml: shm_size:" in d
    assert "mini.toml: serve.gpu_memory_utilization:" in d
    assert "mini.toml: serve.tensor_parallel_size:" in d
    assert "mini.toml: env.forward:" in d
    assert len(err.details) == 5
    assert "hf_supersecret" not in d and "hf_supersecret" not in err.message


def test_name_key_refused():
    with pytest.raises(InputError) as ei:
        parse('name = "other"\n' + MINIMAL, name="mini", source="mini.toml")
    assert ei.value.details == ["mini.toml: name: set from the file name/location, remove it"]


def test_bad_toml():
    with pytest.raises(InputError) as ei:
        parse("model = ", name="x")
    assert "not valid TOML" in ei.value.message


def test_unknown_image_kind_needs_kind():
    with pytest.raises(InputError) as ei:
        parse(MINIMAL.replace("nvcr.io/nvidia/vllm", "registry.example/vllm"), name="x", source="x.toml")
    assert "image" in ei.value.details[0] and "kind" in ei.value.details[0]


def test_search_path_and_shadowing(monkeypatch, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "nemotron.toml").write_text(MINIMAL)
    (mine / "extra.toml").write_text(MINIMAL)
    monkeypatch.setenv("SPARKCLUSTER_PROFILES", str(mine))
    assert search_path()[0] == mine
    # yours before the shipped ones: a copy of a shipped profile under its own name is the one used
    assert search_path()[1] == Path(os.environ["HOME"]) / ".config/sparkcluster/profiles"
    assert search_path()[2] == REPO / "env-profiles"
    found = available()
    assert found["nemotron"] == mine / "nemotron.toml"
    assert found["qwen3-30b"] == REPO / "env-profiles" / "qwen3-30b.toml"
    assert load_profile("extra").model == "org/model"


def test_a_profile_of_yours_with_a_shipped_name_wins_and_says_which_file_it_hides(monkeypatch):
    from sparkcluster.config.profile import shadow_notice, shadowed

    d = Path(os.environ["HOME"]) / ".config/sparkcluster/profiles"
    d.mkdir(parents=True)
    shipped_one = REPO / "env-profiles" / "nemotron.toml"
    text = shipped_one.read_text().replace('tag = "', 'tag = "9', 1)  # another image tag, as an owner would
    (d / "nemotron.toml").write_text(text)
    assert available()["nemotron"] == d / "nemotron.toml"
    prof = load_profile("nemotron")
    assert prof.path == (d / "nemotron.toml").resolve()
    assert prof.image.ref != load_profile(str(shipped_one)).image.ref
    assert shadowed("nemotron") == [shipped_one]
    assert shadow_notice(prof.path, "nemotron") == (
        f"note: profile 'nemotron' is {prof.path}, which overrides {shipped_one} "
        "(the first on the search path wins: sparkcluster profile list)"
    )
    assert shadowed("qwen3-30b") == [] and shadow_notice(REPO / "env-profiles" / "qwen3-30b.toml", "qwen3-30b") is None


def test_where_to_edit_names_a_file_the_owner_can_edit(monkeypatch):
    from sparkcluster.config.profile import where_to_edit

    home_copy = Path(os.environ["HOME"]) / ".config/sparkcluster/profiles/nemotron.toml"
    shipped_advice = where_to_edit(load_profile("nemotron"))
    assert shipped_advice == (
        f"`sparkcluster profile copy nemotron` writes {home_copy}, which overrides the shipped one: edit that file"
    )
    home_copy.parent.mkdir(parents=True)
    home_copy.write_text((REPO / "env-profiles" / "nemotron.toml").read_text())
    assert where_to_edit(load_profile("nemotron")) == f"edit {home_copy.resolve()}"


def test_user_profiles_dir(monkeypatch, tmp_path):
    d = Path(os.environ["HOME"]) / ".config/sparkcluster/profiles"
    d.mkdir(parents=True)
    (d / "mine.toml").write_text(MINIMAL)
    assert load_profile("mine").name == "mine"


def test_load_by_path(tmp_path):
    f = tmp_path / "custom.toml"
    f.write_text(MINIMAL)
    assert load_profile(str(f)).name == "custom"


def test_unknown_profile():
    with pytest.raises(InputError) as ei:
        find("does-not-exist")
    assert "no profile named 'does-not-exist'" in ei.value.message
    # no list of every profile (issue 56: 900 characters), the command that shows them; a close name is named
    assert ei.value.fix.endswith("sparkcluster profile list") and "nemotron" not in ei.value.fix
    with pytest.raises(InputError, match="did you mean 'nemotron'") as ei:
        find("nemotrom")
    assert ei.value.replace == ("nemotrom", "nemotron")
    with pytest.raises(InputError):
        find("../etc/passwd;")
