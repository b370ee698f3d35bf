"""The vLLM test double (tests/testbed/standins/vllm): the parts that need no Ray.

CLI surface, the driver-to-rank environment copy, NCCL interface/HCA selection over a fake sysfs,
the cluster checks and their exact messages, the knob file, and (in a subprocess, world size 1,
no Ray) the HTTP API with auth and graceful SIGTERM.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

STANDIN = Path(__file__).resolve().parents[1] / "testbed" / "standins" / "vllm"
sys.path.insert(0, str(STANDIN))

from vllm_standin import checks, knobs, nccl, network_utils, ray_env  # noqa: E402
from vllm_standin.arg_utils import human_readable_int, parse_args  # noqa: E402
from vllm_standin.cli import main  # noqa: E402

# -- CLI ---------------------------------------------------------------------------------------


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == "0.21.0"


@pytest.mark.parametrize("extra", [["--bogus-flag"], ["--swap-space", "16"], ["--swap-space=16"]])
def test_unknown_flags_exit_2_with_argparse_message(capsys, extra):
    with pytest.raises(SystemExit) as e:
        parse_args(["serve", "sparkcluster/testbed-tiny", *extra])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"vllm: error: unrecognized arguments: {' '.join(extra)}" in err


def test_vllm_serve_vllm_serve_is_unrecognized(capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(["serve", "vllm", "serve"])
    assert e.value.code == 2
    assert "vllm: error: unrecognized arguments: serve" in capsys.readouterr().err


def test_no_abbreviations(capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(["serve", "m", "--tensor-parallel", "2"])
    assert e.value.code == 2


def test_real_flags_accepted(monkeypatch):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    a = parse_args(
        [
            "serve",
            "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-NVFP4",
            "--host",
            "0.0.0.0",
            "--port",
            "8000",
            "-tp",
            "2",
            "-pp",
            "1",
            "-dp",
            "1",
            "--distributed-executor-backend",
            "ray",
            "--max-model-len",
            "1M",
            "--gpu-memory-utilization",
            "0.75",
            "--kv-cache-dtype",
            "fp8",
            "--dtype",
            "auto",
            "-q",
            "modelopt",
            "--moe-backend",
            "marlin",
            "--mamba-ssm-cache-dtype",
            "float32",
            "--max-num-batched-tokens",
            "8192",
            "--max-num-seqs",
            "8",
            "--no-enable-prefix-caching",
            "--enable-chunked-prefill",
            "--async-scheduling",
            "--max-cudagraph-capture-size",
            "128",
            "--trust-remote-code",
            "--reasoning-parser",
            "super_v3",
            "--reasoning-parser-plugin",
            "/root/.cache/huggingface/super_v3_reasoning_parser.py",
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            "qwen3_coder",
            "--speculative-config",
            '{"method": "mtp", "num_speculative_tokens": 1}',
            "--enforce-eager",
            "--served-model-name",
            "nemotron",
            "nemo",
            "--download-dir",
            "/models",
            "--load-format",
            "safetensors",
            "--api-key",
            "k",
            "--uvicorn-log-level",
            "warning",
            "--disable-log-requests",
            "--generation-config",
            "vllm",
        ]
    )
    assert a.model == "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-NVFP4"
    assert a.tensor_parallel_size == 2 and a.distributed_executor_backend == "ray"
    assert a.max_model_len == 2**20
    assert a.enable_prefix_caching is False and a.enable_chunked_prefill is True
    assert a.async_scheduling and a.enforce_eager and a.trust_remote_code
    assert a.speculative_config == {"method": "mtp", "num_speculative_tokens": 1}
    assert a.served_model_name == ["nemotron", "nemo"]
    assert a.quantization == "modelopt" and a.api_key == "k"


def test_underscore_flags_and_api_key_from_env(monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "from-env")
    a = parse_args(["serve", "m", "--max_model_len=8k", "--tensor_parallel_size", "2"])
    assert a.max_model_len == 8000 and a.tensor_parallel_size == 2
    assert a.api_key == "from-env"


def test_human_readable_int():
    assert human_readable_int("1k") == 1000 and human_readable_int("1K") == 1024
    assert human_readable_int("25.6k") == 25600 and human_readable_int("131072") == 131072
    assert human_readable_int("-1") == -1


def test_invalid_choice_exits_2(capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(["serve", "m", "--mamba-ssm-cache-dtype", "int4"])
    assert e.value.code == 2


def test_console_script_and_help():
    env = {**os.environ, "PYTHONPATH": str(STANDIN)}
    out = subprocess.run([str(STANDIN / "bin" / "vllm"), "--version"], capture_output=True, text=True, env=env)
    assert out.returncode == 0 and out.stdout.strip() == "0.21.0"
    out = subprocess.run(
        [sys.executable, "-m", "vllm_standin", "serve", "--help"], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0 and "--tensor-parallel-size" in out.stdout
    assert "--swap-space" not in out.stdout


# -- environment copy to the ranks -------------------------------------------------------------

DRIVER_ENV = {
    "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1",
    "VLLM_HOST_IP": "198.19.2.1",
    "VLLM_API_KEY": "k",
    "NCCL_SOCKET_IFNAME": "enp1s0f1np1",
    "NCCL_IB_HCA": "rocep1s0f1",
    "UCX_NET_DEVICES": "enp1s0f1np1",
    "HF_TOKEN": "t",
    "HF_HOME": "/hf",
    "GLOO_SOCKET_IFNAME": "enp1s0f1np1",
    "OMPI_MCA_x": "1",
    "FLASHINFER_DISABLE_VERSION_CHECK": "1",
    "CUTE_DSL_ARCH": "sm_121a",
    "CUDA_VISIBLE_DEVICES": "0",
    "PATH": "/usr/bin",
}


def test_env_copy_prefixes_and_exclusions():
    plan = ray_env.plan_env_copy(DRIVER_ENV, {"NCCL_SOCKET_IFNAME", "UCX_NET_DEVICES", "NOT_SET"})
    assert set(plan.copied) == {"VLLM_ALLOW_LONG_MAX_MODEL_LEN", "VLLM_API_KEY", "NCCL_IB_HCA", "HF_TOKEN", "HF_HOME"}
    assert plan.skipped_non_carry_over == ["NCCL_SOCKET_IFNAME", "UCX_NET_DEVICES"]
    assert plan.skipped_worker_specific == ["VLLM_HOST_IP"]
    for name in (
        "GLOO_SOCKET_IFNAME",
        "OMPI_MCA_x",
        "FLASHINFER_DISABLE_VERSION_CHECK",
        "CUTE_DSL_ARCH",
        "CUDA_VISIBLE_DEVICES",
        "PATH",
        "VLLM_HOST_IP",
    ):
        assert name not in plan.copied


def test_env_copy_reads_non_carry_over_file(tmp_path, capfd):
    (tmp_path / "ray_non_carry_over_env_vars.json").write_text(json.dumps(["NCCL_IB_HCA"]))
    env = {**DRIVER_ENV, "VLLM_CONFIG_ROOT": str(tmp_path)}
    plan = ray_env.get_env_vars_to_copy(env)
    assert "NCCL_IB_HCA" not in plan.copied and "NCCL_SOCKET_IFNAME" in plan.copied
    assert plan.file == str(tmp_path / "ray_non_carry_over_env_vars.json")
    err = capfd.readouterr().err
    assert "Copying the following environment variables to workers:" in err
    assert "Not copying environment variables listed in" in err and "NCCL_IB_HCA" in err


def test_non_carry_over_file_defaults_and_bad_json(tmp_path, monkeypatch):
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    assert ray_env.non_carry_over_file({}).endswith(os.path.join(".config", "vllm", "ray_non_carry_over_env_vars.json"))
    bad = tmp_path / "x.json"
    bad.write_text("[not json")
    assert ray_env.load_non_carry_over(str(bad)) == set()
    assert ray_env.load_non_carry_over(str(tmp_path / "missing.json")) == set()


# -- NCCL selection over a fake sysfs ----------------------------------------------------------


@pytest.fixture
def fake_sys(tmp_path):
    net = tmp_path / "class" / "net"
    for n in ("lo", "docker0", "enp1s0f0np0", "enp1s0f1np1", "enP2p1s0f0np0"):
        (net / n).mkdir(parents=True)
    ib = tmp_path / "class" / "infiniband"
    for hca, state in (("rocep1s0f0", "4: ACTIVE"), ("rocep1s0f1", "4: ACTIVE"), ("roceP2p1s0f0", "1: DOWN")):
        port = ib / hca / "ports" / "1"
        port.mkdir(parents=True)
        (port / "state").write_text(state + "\n")
        (port / "link_layer").write_text("Ethernet\n")
    dev = tmp_path / "dev" / "infiniband"
    dev.mkdir(parents=True)
    (dev / "uverbs0").touch()
    return tmp_path


def _ifaces(root: Path) -> dict[str, str | None]:
    addrs = {
        "lo": "127.0.0.1",
        "docker0": "172.17.0.1",
        "enp1s0f0np0": "198.19.1.1",
        "enp1s0f1np1": "198.19.2.1",
        "enP2p1s0f0np0": None,
    }
    return {n: addrs.get(n) for n in sorted(os.listdir(root / "class" / "net"))}


@pytest.mark.parametrize(
    "spec,expected",
    [
        ("enp1s0f1np1", ["enp1s0f1np1"]),
        ("enp", ["enp1s0f0np0", "enp1s0f1np1"]),  # prefix match
        ("=enp1s0f1np1", ["enp1s0f1np1"]),  # exact
        ("=enp1", []),  # exact, no such name
        ("eth9,enp1s0f0np0", ["enp1s0f0np0"]),  # comma list
        ("^lo,docker,enp1s0f0", ["enp1s0f1np1"]),  # exclusion
        ("enP2p1s0f0np0", []),  # exists but has no address
        ("eth0", []),  # not on this node
        (None, ["enp1s0f0np0", "enp1s0f1np1"]),  # default skips lo and docker
    ],
)
def test_socket_ifname_matching(fake_sys, spec, expected):
    assert [n for n, _ in nccl.select_socket_ifaces(spec, _ifaces(fake_sys))] == expected


def test_socket_ifname_missing_fails_like_nccl(fake_sys):
    rep = nccl.nccl_report({"NCCL_SOCKET_IFNAME": "eth0"}, _ifaces(fake_sys), {}, False)
    assert not rep.ok
    assert ("WARN", "Bootstrap : no socket interface found") in rep.lines
    assert "Bootstrap : no socket interface found" in rep.error


def test_ib_hca_selection_and_transport(fake_sys):
    hcas = nccl.collect_hcas(str(fake_sys / "class" / "infiniband"))
    ifs = _ifaces(fake_sys)
    uv = nccl.has_uverbs(str(fake_sys / "dev" / "infiniband"))
    assert uv and not nccl.has_uverbs(str(fake_sys / "nope"))
    env = {"NCCL_SOCKET_IFNAME": "enp1s0f1np1", "NCCL_IB_HCA": "rocep1s0f0,rocep1s0f1:1"}
    rep = nccl.nccl_report(env, ifs, hcas, uv)
    assert rep.ok and rep.transport == "IB"
    assert (
        "INFO",
        "NET/IB : Using [0]rocep1s0f0:1/RoCE [1]rocep1s0f1:1/RoCE [RO]; OOB enp1s0f1np1:198.19.2.1<0>",
    ) in rep.lines
    # exclusion list: everything active but the excluded one
    rep = nccl.nccl_report({**env, "NCCL_IB_HCA": "^rocep1s0f1"}, ifs, hcas, uv)
    assert rep.ok and any("Using [0]rocep1s0f0:1/RoCE [RO]" in t for _, t in rep.lines)
    # unset: every ACTIVE port (the DOWN one is skipped, as NCCL does)
    rep = nccl.nccl_report({"NCCL_SOCKET_IFNAME": "enp1s0f1np1"}, ifs, hcas, uv)
    assert any("[0]rocep1s0f0:1/RoCE [1]rocep1s0f1:1/RoCE [RO]" in t for _, t in rep.lines)


@pytest.mark.parametrize("spec", ["rocep9s0f0", "=rocep1s0f", "rocep1s0f0:2", "rocep1s0f0,mlx5_0"])
def test_ib_hca_not_present_fails(fake_sys, spec):
    hcas = nccl.collect_hcas(str(fake_sys / "class" / "infiniband"))
    rep = nccl.nccl_report({"NCCL_IB_HCA": spec}, _ifaces(fake_sys), hcas, True)
    assert not rep.ok
    assert ("WARN", "NET/IB : No device found.") in rep.lines
    assert "NET/IB : No device found." in rep.error


def test_ib_hca_port_not_active_fails(fake_sys):
    hcas = nccl.collect_hcas(str(fake_sys / "class" / "infiniband"))
    rep = nccl.nccl_report({"NCCL_IB_HCA": "=roceP2p1s0f0"}, _ifaces(fake_sys), hcas, True)
    assert not rep.ok and "1: DOWN" in rep.error and "4: ACTIVE" in rep.error


def test_silent_tcp_fallback_without_uverbs(fake_sys):
    hcas = nccl.collect_hcas(str(fake_sys / "class" / "infiniband"))
    env = {"NCCL_SOCKET_IFNAME": "enp1s0f1np1", "NCCL_IB_HCA": "rocep1s0f1"}
    rep = nccl.nccl_report(env, _ifaces(fake_sys), hcas, uverbs=False)
    assert rep.ok and rep.transport == "Socket"
    assert ("INFO", "NET/Socket : Using [0]enp1s0f1np1:198.19.2.1<0>") in rep.lines
    assert not [t for lvl, t in rep.lines if lvl == "WARN"]
    rep = nccl.nccl_report({**env, "NCCL_IB_DISABLE": "1"}, _ifaces(fake_sys), hcas, uverbs=True)
    assert rep.transport == "Socket"


# -- cluster checks ------------------------------------------------------------------------------


def _rep(rank, ip, node_ip=None, node="n", **env):
    return {
        "rank": rank,
        "ip": ip,
        "node_ip": node_ip or ip,
        "node_id": node,
        "hostname": f"h{rank}",
        "pid": 100 + rank,
        "env": env,
    }


def test_unique_ip_check_exact_message():
    reports = [_rep(0, "198.19.2.1", node="A"), _rep(1, "198.19.2.1", "198.19.2.2", node="B")]
    assert checks.unique_ip_error(reports, "198.19.2.1") == (
        "Every node should have a unique IP address. Got 2 nodes with 1 unique IP addresses. "
        "Please check your network configuration. If you set `VLLM_HOST_IP` environment variable, "
        "make sure it is unique for each node."
    )
    ok = [_rep(0, "198.19.2.1", node="A"), _rep(1, "198.19.2.2", node="B")]
    assert checks.unique_ip_error(ok, "198.19.2.1") is None
    # a driver whose VLLM_HOST_IP is none of the nodes' IPs: 3 IPs for 2 nodes
    assert "Got 2 nodes with 3 unique IP addresses" in checks.unique_ip_error(ok, "172.17.0.1")
    # two ranks on one node share its IP
    assert checks.unique_ip_error([_rep(0, "10.0.0.1", node="A"), _rep(1, "10.0.0.1", node="A")]) is None


def test_rank_ip_must_be_its_ray_node_ip():
    reports = [
        _rep(0, "198.19.2.1", node="A"),
        _rep(1, "169.254.3.7", "198.19.2.2", node="B", VLLM_HOST_IP="169.254.3.7"),
    ]
    msg = checks.ip_node_mismatch_error(reports)
    assert "rank 1" in msg and "169.254.3.7" in msg and "198.19.2.2" in msg and "VLLM_HOST_IP" in msg
    assert checks.ip_node_mismatch_error([_rep(0, "198.19.2.1"), _rep(1, "198.19.2.2")]) is None


def test_required_env_agreement():
    model = "sparkcluster/testbed-tiny"
    good = dict(VLLM_ALLOW_LONG_MAX_MODEL_LEN="1", FLASHINFER_DISABLE_VERSION_CHECK="1")
    assert checks.required_env_error(model, [_rep(0, "198.19.2.1", **good), _rep(1, "198.19.2.2", **good)]) is None
    r1 = _rep(1, "198.19.2.2", VLLM_ALLOW_LONG_MAX_MODEL_LEN="1")
    assert checks.required_env_error(model, [_rep(0, "198.19.2.1", **good), r1]) == (
        "rank 1 (198.19.2.2): FLASHINFER_DISABLE_VERSION_CHECK is unset while rank 0 has '1'; "
        "ranks selected different kernels and the first all-reduce failed"
    )
    r1 = _rep(1, "198.19.2.2", **{**good, "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "0"})
    assert "rank 1 (198.19.2.2): VLLM_ALLOW_LONG_MAX_MODEL_LEN='0' while rank 0 has '1'" in checks.required_env_error(
        model, [_rep(0, "198.19.2.1", **good), r1]
    )
    r0 = _rep(0, "198.19.2.1", FLASHINFER_DISABLE_VERSION_CHECK="1")
    assert checks.required_env_error(model, [r0, _rep(1, "198.19.2.2", **good)]).startswith(
        "rank 0 (198.19.2.1): VLLM_ALLOW_LONG_MAX_MODEL_LEN is unset while rank 1 has '1'"
    )
    none = [_rep(0, "198.19.2.1"), _rep(1, "198.19.2.2")]
    assert "unset on all 2 rank(s)" in checks.required_env_error(model, none)
    assert checks.required_env_error("some/other-model", none) is None
    assert len(checks.required_env("nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-NVFP4")) == 4


# -- knobs and IP discovery -----------------------------------------------------------------------


def test_knobs(tmp_path):
    env = {"HF_HOME": str(tmp_path)}
    assert knobs.load(env) == knobs.DEFAULTS
    (tmp_path / "standin-knobs.json").write_text(json.dumps({"hang_completions": True, "load_seconds": 0}))
    k = knobs.load(env)
    assert k["hang_completions"] is True and k["load_seconds"] == 0 and k["token_delay_seconds"] == 0.01
    (tmp_path / "standin-knobs.json").write_text("{broken")
    assert knobs.load(env) == knobs.DEFAULTS
    assert knobs.knobs_path({"HOME": "/x"}).endswith(os.path.join("huggingface", "standin-knobs.json"))


def test_knobs_from_the_image_environment_sit_under_the_file(tmp_path):
    """An image built FROM the double with `ENV VLLM_STANDIN_KNOBS=...` misbehaves whatever the cache holds."""
    env = {"HF_HOME": str(tmp_path), knobs.ENV: json.dumps({"garble_answers": True, "load_seconds": 5})}
    assert knobs.load(env)["garble_answers"] is True and knobs.load(env)["load_seconds"] == 5
    (tmp_path / "standin-knobs.json").write_text(json.dumps({"load_seconds": 0}))
    assert knobs.load(env)["garble_answers"] is True and knobs.load(env)["load_seconds"] == 0
    assert knobs.load({"HF_HOME": str(tmp_path), knobs.ENV: "{broken"})["garble_answers"] is False


def test_get_ip(tmp_path):
    assert network_utils.get_ip({"VLLM_HOST_IP": "198.19.2.2"}) == "198.19.2.2"
    route = tmp_path / "route"
    route.write_text(
        "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\tMTU\tWindow\tIRTT\n"
        "enp1s0f1np1\t0002130A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"
        "enp1s0f0np0\t00000000\t0102130A\t0003\t0\t0\t100\t00000000\t0\t0\t0\n"
        "enp1s0f1np1\t00000000\t0102130A\t0003\t0\t0\t50\t00000000\t0\t0\t0\n"
    )
    assert network_utils.default_route_iface(str(route)) == "enp1s0f1np1"
    assert network_utils.iface_ipv4("lo") == "127.0.0.1"


# -- the HTTP API, world size 1 without Ray, in a subprocess ---------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _req(url, data=None, headers=None, timeout=10):
    req = urllib.request.Request(
        url,
        data=json.dumps(data).encode() if data is not None else None,
        headers={"content-type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_http_api_auth_and_graceful_sigterm(tmp_path):
    (tmp_path / "standin-knobs.json").write_text(json.dumps({"load_seconds": 0.3}))
    port = _free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(STANDIN),
        "HF_HOME": str(tmp_path),
        "VLLM_API_KEY": "sek",
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1",
        "FLASHINFER_DISABLE_VERSION_CHECK": "1",
        "VLLM_HOST_IP": "127.0.0.1",
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vllm_standin",
            "serve",
            "sparkcluster/testbed-tiny",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--served-model-name",
            "tiny",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                if _req(base + "/health", timeout=1)[0] == 200:
                    break
            except OSError:
                time.sleep(0.1)
        else:
            pytest.fail("server never answered /health")
        auth = {"Authorization": "Bearer sek"}
        assert _req(base + "/health") == (200, b"")
        assert _req(base + "/v1/models") == (401, b'{"error": "Unauthorized"}')
        status, body = _req(base + "/v1/models", headers=auth)
        assert status == 200 and json.loads(body)["data"][0]["id"] == "tiny"
        status, body = _req(
            base + "/v1/chat/completions",
            {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
            auth,
        )
        j = json.loads(body)
        assert status == 200 and len(j["choices"][0]["message"]["content"].split()) == 4
        assert j["usage"]["completion_tokens"] == 4
        status, body = _req(
            base + "/v1/chat/completions",
            {"model": "tiny", "max_tokens": 3, "stream": True, "messages": [{"role": "user", "content": "hi"}]},
            auth,
        )
        events = [e[len("data: ") :] for e in body.decode().split("\n\n") if e.startswith("data: ")]
        assert status == 200 and events[-1] == "[DONE]"
        deltas = [json.loads(e)["choices"][0]["delta"].get("content") for e in events[1:-2]]
        assert len(deltas) == 3 and all(deltas)
        status, body = _req(base + "/metrics")
        text = body.decode()
        assert status == 200
        assert 'vllm:generation_tokens_total{engine="0",model_name="tiny"} 7.0' in text
        for name in (
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:prompt_tokens_total",
            "vllm:time_to_first_token_seconds_bucket",
        ):
            assert name + "{" in text
        (tmp_path / "standin-knobs.json").write_text(json.dumps({"hang_completions": True}))
        with pytest.raises(OSError):  # socket timeout: the engine is "stuck"
            _req(base + "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}, auth, timeout=1)
        assert _req(base + "/health")[0] == 200  # ... while /health still answers
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
    assert proc.returncode == 0, err
    assert f"Starting vLLM API server 0 on http://127.0.0.1:{port}" in err
    assert "Application startup complete." in err and "Shutting down" in err


def test_max_model_len_above_derived_needs_allow_long():
    m = "sparkcluster/testbed-tiny"
    assert checks.max_model_len_error(m, 4096, {}) is None
    assert checks.max_model_len_error(m, None, {}) is None
    assert checks.max_model_len_error(m, 8192, {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}) is None
    assert checks.max_model_len_error("some/other", 10**6, {}) is None
    msg = checks.max_model_len_error(m, 8192, {})
    assert msg.startswith("User-specified max_model_len (8192) is greater than the derived max_model_len")
    assert "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1" in msg


def test_the_knobs_of_an_upgrade_judge_change_numerics_only_or_break_tool_requests(tmp_path):
    """issue 58: `diverge_from` keeps an answer's first words and changes the rest (another image's
    numerics); `tools_error` answers every chat request carrying `tools` with HTTP 500 while the rest
    serves (NGC 26.07's broken tool-call path, docs/field-notes.md)."""
    from sparkcluster.node import canary

    (tmp_path / "standin-knobs.json").write_text(json.dumps({"load_seconds": 0.1, "token_delay_seconds": 0}))
    port = _free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(STANDIN),
        "HF_HOME": str(tmp_path),
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1",
        "FLASHINFER_DISABLE_VERSION_CHECK": "1",
        "VLLM_HOST_IP": "127.0.0.1",
    }
    argv = ["serve", "sparkcluster/testbed-tiny", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--served-model-name", "tiny", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm_standin", *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                if _req(base + "/health", timeout=1)[0] == 200:
                    break
            except OSError:
                time.sleep(0.1)
        else:
            pytest.fail("server never answered /health")

        def completion() -> canary.Answer:
            status, body = _req(base + "/v1/completions", canary.request_body("tiny", canary.PROMPTS[0]))
            assert status == 200
            return canary.answer_from(canary.PROMPTS[0], json.loads(body))

        before = completion()
        assert len(before.text.split()) == canary.MAX_TOKENS
        (tmp_path / "standin-knobs.json").write_text(json.dumps({"load_seconds": 0.1, "diverge_from": 12}))
        after = completion()
        assert after.text.split()[:12] == before.text.split()[:12] and after.text != before.text
        assert before.agreement(after) == 0.75

        status, body = _req(base + "/v1/chat/completions", canary.chat_body("tools", "tiny"))
        assert canary.chat_problem("tools", status, body.decode()) == ""  # the double's chat path is well-formed
        broken = "cannot import name 'normalize_tool_choice'"
        (tmp_path / "standin-knobs.json").write_text(json.dumps({"load_seconds": 0.1, "tools_error": broken}))
        status, body = _req(base + "/v1/chat/completions", canary.chat_body("tools", "tiny"))
        assert status == 500 and json.loads(body)["error"]["type"] == "InternalServerError"
        assert "HTTP 500" in canary.chat_problem("tools", status, body.decode())
        status, body = _req(base + "/v1/chat/completions", canary.chat_body("reasoning", "tiny"))
        assert canary.chat_problem("reasoning", status, body.decode()) == ""  # no tools: served
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
