"""`up` end to end on the testbed with the REAL vLLM engine (0.32.0, CPU build, the tiny Llama with
tensor parallel 2 over Ray across both hosts): bare to serving, chat with and without the key,
streaming, the model list and metrics status reads, idempotence, a new key restarting only the server.
It leaves the cluster serving (with the rotated key: test_bench's `up` brings the suite's key back, a
server restart); `down` leaving nothing behind is checked where the tail ends it
(test_supervisor_final.py)."""

from __future__ import annotations

import json
import re

import httpx
import openai
import pytest

from tests.integration.helpers import (
    API_KEY,
    HF_TOKEN,
    LAN_BASE,
    account,
    debug_log_lines,
    hf_cache,
    listeners,
    ours,
    reached,
)
from tests.testbed.testbed import SPECS

pytestmark = pytest.mark.testbed
HEAD, WORKER = "spark-head", "spark-worker"


def printed_endpoint(out: str) -> str:
    """The endpoint `up` prints: where the engine listens (the head's control address by default)."""
    m = re.search(r"endpoint: (\S+)", out)
    assert m, out
    return m.group(1)


def endpoint(out: str) -> str:
    """The printed endpoint as the tests reach it (the controller has no route to the control network)."""
    return reached(printed_endpoint(out))


@pytest.fixture(scope="module")
def serving(testbed, sc):
    """From bare (`down --purge-gcs` first); left serving for the serving tail's next module
    (tests/conftest.py SERVING_TAIL): what `down` leaves is test_supervisor_final's to check."""
    sc("down", "--purge-gcs")
    res = sc("up", "--profile", "testbed", timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr
    return res


def server_pid_and_start(testbed) -> tuple[str, str]:
    name = ours(testbed, HEAD)
    rec = testbed.sh(HEAD, f"docker exec {name[0]} cat /run/sparkcluster/serve.json").stdout
    pid = json.loads(rec)["pid"]
    # the PID is the head container's own: the supervisor in it started the server
    start = testbed.sh(HEAD, f"docker exec {name[0]} cut -d' ' -f22 /proc/{pid}/stat").stdout.strip()
    return str(pid), start


def test_up_serves_tp2_across_both_hosts(testbed, serving):
    out = serving.stdout
    assert "serving 'testbed-tiny' with tensor parallel 2" in out
    ctl = SPECS[HEAD].control_ip
    assert printed_endpoint(out) == f"http://{ctl}:8000/v1"  # the cluster's side only, by default (issue 70)
    assert f"-L 8000:{ctl}:8000 spark-head" in out and "sparkcluster gateway up" in out  # how to reach it
    # one container per node, the image identical on both
    assert len(ours(testbed, HEAD)) == 1 and len(ours(testbed, WORKER)) == 1
    ref = "sparkcluster/vllm-ray:26.05.post1-py3-ray2.60.0"
    assert testbed.image_id(HEAD, ref) == testbed.image_id(WORKER, ref)
    # a rank runs in the worker's container: its Ray worker process is there
    assert "ray::" in testbed.sh(WORKER, "ps -eo args").stdout
    for stage in ("preflight", "image", "containers", "ray", "fabric", "probe", "serve"):
        assert f"✓ {stage}" in serving.stderr
    # the fabric was measured in the new containers before anything was served (issue 26)
    assert re.search(r"✓ fabric .*all_gather busbw [0-9.]+ GB/s", serving.stderr), serving.stderr
    # each container's start-up was NGC's, read before serving: forward compatibility on both
    assert "start-up: forward" in serving.stderr, serving.stderr


def test_every_rank_runs_on_the_images_own_cuda_driver(testbed, serving):
    """NGC's start-up (the image's entrypoint, kept) exported the forward-compatibility environment to
    the agent, and so to its `ray start`, the raylet and the rank Ray spawned on the worker: the rank's
    process has it and mapped the image's own libcuda (the stand-in's first kernel would have failed
    otherwise: test_container_contract.py)."""
    c = ours(testbed, WORKER)[0]
    pids = testbed.sh(WORKER, f"docker exec {c} pgrep -f 'ray::RayWorkerProc'", check=False).stdout.split()
    assert pids, testbed.sh(WORKER, f"docker exec {c} ps -eo pid,args").stdout
    for pid in pids:
        raw = testbed.sh(WORKER, f"docker exec {c} cat /proc/{pid}/environ").stdout
        env = dict(x.split("=", 1) for x in raw.split("\0") if "=" in x)
        assert env.get("_CUDA_COMPAT_STATUS") == "CUDA Driver OK", env
        assert env["LD_LIBRARY_PATH"].startswith("/usr/local/cuda/compat/lib.real:"), env["LD_LIBRARY_PATH"]
        maps = testbed.sh(WORKER, f"docker exec {c} grep -m1 libcuda /proc/{pid}/maps", check=False).stdout
        assert "/usr/local/cuda/compat/lib.real/libcuda.so.1" in maps, maps


def test_chat_completion_with_key(serving):
    client = openai.OpenAI(base_url=endpoint(serving.stdout), api_key=API_KEY, timeout=30)
    # the tiny model's weights are random: its 8 tokens may decode to nothing printable, so the
    # proof is the token count, through both ranks, and a response of the right shape
    r = client.chat.completions.create(
        model="testbed-tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=8, temperature=0
    )
    assert r.usage.completion_tokens == 8 and r.choices[0].finish_reason == "length"
    assert r.choices[0].message.content is not None
    chunks = list(
        client.chat.completions.create(
            model="testbed-tiny",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].usage.completion_tokens == 8
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    # greedy decoding: streamed and whole answers agree
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == r.choices[0].message.content


def test_rank_1_runs_on_the_worker(testbed, serving):
    # vLLM's own log: the rank actors, one on each host's control address
    log = testbed.sh(HEAD, "docker exec sparkcluster-testbed-head cat /var/log/sparkcluster/vllm-serve.log").stdout
    assert "ip=198.19.2.2" in log, log[-3000:]
    assert (
        "RayWorkerProc" in testbed.sh(WORKER, "ps -eo args").stdout
        or "ray::" in testbed.sh(WORKER, "ps -eo args").stdout
    )


def test_models_and_the_metrics_status_reads(serving):
    from sparkcluster.deployment.endpoint import METRICS

    base = endpoint(serving.stdout).removesuffix("/v1")
    models = httpx.get(base + "/v1/models", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10)
    assert models.status_code == 200 and [m["id"] for m in models.json()["data"]] == ["testbed-tiny"]
    text = httpx.get(base + "/metrics", timeout=10).text
    for name in METRICS:
        assert re.search(rf"^{re.escape(name)}[{{ ]", text, re.M), name


def test_status_healthy_with_serving_figures(sc, serving):
    res = sc("status", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    st = json.loads(res.stdout)
    assert st["state"] == "healthy", st["problems"]
    assert st["engine_responds"] is True and st["models"] == ["testbed-tiny"]
    assert st["metrics"]["generation_tokens_total"] > 0  # the warm-up and the chats above
    assert set(st["metrics"]) >= {"requests_running", "requests_waiting", "kv_cache_usage"}


def test_chat_without_key_is_401(serving):
    r = httpx.post(
        endpoint(serving.stdout) + "/chat/completions",
        timeout=10,
        json={"model": "testbed-tiny", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status_code == 401


def test_the_engine_answers_nothing_from_the_lan_without_the_key(testbed, serving):
    """From a LAN address (the controller, 198.18.0.1, on the head's LAN), neither the key's routes nor
    those vLLM's key leaves open (its security guide: only /v1, /v2, /inference and /cohere are
    checked; /invocations runs the same chat, /pause stops the engine) answer: the engine listens only
    on the head's control address (issue 70). On that side, the key is there: no chat without it."""
    chat = {"model": "testbed-tiny", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
    for host in (HEAD, WORKER):  # every engine: the head's API server; the worker runs ranks only
        held = listeners(testbed, host, 8000)
        assert "0.0.0.0:8000" not in held and "*:8000" not in held and "[::]:8000" not in held, (host, held)
    assert f"{SPECS[HEAD].control_ip}:8000" in listeners(testbed, HEAD, 8000)
    for path, body in (("/v1/chat/completions", chat), ("/invocations", chat), ("/pause", None), ("/health", None)):
        with pytest.raises(httpx.ConnectError):  # refused: nothing listens on the LAN's address
            httpx.post(LAN_BASE + path, json=body, timeout=5)
    # the cluster's side (the worker, on the control network): the key's routes want it
    code = testbed.sh(
        WORKER,
        f"curl -s -o /dev/null -w '%{{http_code}}' -m 10 -H 'Content-Type: application/json' "
        f"-d '{json.dumps(chat)}' http://{SPECS[HEAD].control_ip}:8000/v1/chat/completions",
        check=False,
    ).stdout
    assert code == "401", code
    # the engine still serves (nothing above paused it)
    assert httpx.get(endpoint(serving.stdout).removesuffix("/v1") + "/health", timeout=10).status_code == 200


def test_up_again_changes_nothing(testbed, sc, serving):
    before = server_pid_and_start(testbed)
    ids_before = {h: testbed.sh(h, "docker ps -q --no-trunc").stdout.split() for h in (HEAD, WORKER)}
    res = sc("up", "--profile", "testbed")
    assert res.returncode == 0, res.stderr
    assert "nothing to do" in res.stdout
    assert server_pid_and_start(testbed) == before
    assert {h: testbed.sh(h, "docker ps -q --no-trunc").stdout.split() for h in (HEAD, WORKER)} == ids_before


def test_secrets_never_on_a_command_line(testbed, sc, serving):
    for host in (HEAD, WORKER):
        ps = testbed.sh(host, "ps -eo args").stdout
        assert API_KEY not in ps and HF_TOKEN not in ps
        inspect = testbed.sh(host, "docker inspect $(docker ps -aq)").stdout
        assert API_KEY not in inspect and HF_TOKEN not in inspect
    for text in (serving.stdout, serving.stderr, sc("up", "--profile", "testbed", "--dry-run").stdout):
        assert API_KEY not in text and HF_TOKEN not in text
    log = "\n".join(debug_log_lines(sc))
    assert API_KEY not in log and HF_TOKEN not in log


def test_hf_token_reaches_every_node_as_a_private_file(testbed, serving):
    for host in (HEAD, WORKER):
        token = f"{hf_cache()}/token"
        mode, owner, content = testbed.sh(host, f"stat -c '%a %u' {token}; cat {token}").stdout.split()
        assert (mode, owner, content) == ("600", str(account()["uid"]), HF_TOKEN)  # the SSH user's own


def test_a_new_api_key_restarts_only_the_server(testbed, sc, serving, tmp_path):
    containers = {h: testbed.sh(h, "docker ps -q --no-trunc").stdout.split() for h in (HEAD, WORKER)}
    pid, _ = server_pid_and_start(testbed)
    env = tmp_path / ".env"
    env.write_text(f"VLLM_API_KEY=sk-rotated-0123456789\nHF_TOKEN={HF_TOKEN}\n")
    env.chmod(0o600)
    res = sc("up", "--profile", "testbed", env={"SPARKCLUSTER_ENV_FILE": str(env)})
    assert res.returncode == 0, res.stderr
    assert "nothing to do" not in res.stdout
    assert server_pid_and_start(testbed)[0] != pid
    assert {h: testbed.sh(h, "docker ps -q --no-trunc").stdout.split() for h in (HEAD, WORKER)} == containers
    client = openai.OpenAI(base_url=endpoint(res.stdout), api_key="sk-rotated-0123456789", timeout=30)
    assert (
        client.chat.completions.create(
            model="testbed-tiny", max_tokens=4, messages=[{"role": "user", "content": "hi"}]
        ).usage.completion_tokens
        == 4
    )
    old = httpx.post(
        endpoint(res.stdout) + "/chat/completions",
        headers={"Authorization": f"Bearer {API_KEY}"},
        json={"model": "testbed-tiny", "messages": [{"role": "user", "content": "hi"}]},
        timeout=10,
    )
    assert old.status_code == 401
