"""The real vLLM engine's own failure modes on the testbed (vLLM 0.32.0, CPU build, TP=2 over Ray),
each caught by sparkcluster with a clear message:

- rank 1's worker process stopped (SIGSTOP): vLLM's /health stays 200 (it does no round trip to the
  engine) while completions hang: `status` is not healthy, `up` does not call it serving and
  restarts the server;
- rank 1's worker killed: the API server exits with status 0, yet `status` reports it not running;
- a wrong control interface on the worker (GLOO_SOCKET_IFNAME and VLLM_HOST_IP follow it) is caught
  by preflight before `vllm serve` starts.
(An unknown flag rejected by the real parser: tests/integration/test_traps.py.)
"""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.integration.helpers import API_KEY, inventory_variant, worker_block_edit

pytestmark = pytest.mark.testbed
HEAD, WORKER = "spark-head", "spark-worker"
BASE = "http://198.18.0.2:8000"


@pytest.fixture
def serving(testbed, sc):
    res = sc("up", "--profile", "testbed", timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr
    yield res


def rank1_pids(testbed) -> list[str]:
    """The rank actor's process on the worker (Ray names it after the actor class)."""
    out = testbed.sh(WORKER, "pgrep -f 'RayWorkerProc' || true").stdout.split()
    assert out, testbed.sh(WORKER, "ps -eo pid,args").stdout
    return out


def status(sc) -> dict:
    return json.loads(sc("status", "--json").stdout)


def test_rank1_stopped_is_wedged_not_healthy_and_up_restarts_it(testbed, sc, serving):
    pids = rank1_pids(testbed)
    try:
        testbed.sh(WORKER, "kill -STOP " + " ".join(pids))
        assert httpx.get(BASE + "/health", timeout=5).status_code == 200  # what vLLM says
        st = status(sc)
        assert st["state"] == "degraded"
        assert any(p.startswith("engine wedged: /health is 200 but") for p in st["problems"]), st["problems"]
        res = sc("up", "--profile", "testbed", timeout=600)
        assert "nothing to do" not in res.stdout
        assert "is wedged" in res.stdout + res.stderr, res.stdout + res.stderr
    finally:
        testbed.sh(WORKER, "kill -CONT " + " ".join(pids) + " 2>/dev/null || true", check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    st = status(sc)
    assert st["state"] == "healthy" and st["engine_responds"] is True, st["problems"]


def test_rank1_killed_is_reported_dead_although_vllm_exits_0(testbed, sc, serving):
    rec = json.loads(testbed.sh(HEAD, "docker exec sparkcluster-testbed-head cat /run/sparkcluster/serve.json").stdout)
    testbed.sh(WORKER, "kill -KILL " + " ".join(rank1_pids(testbed)))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and testbed.sh(HEAD, f"kill -0 {rec['pid']}", check=False).returncode == 0:
        time.sleep(1)
    # the API server process is gone: vLLM logs the dead rank and exits (with status 0)
    log = testbed.sh(HEAD, "docker exec sparkcluster-testbed-head cat /var/log/sparkcluster/vllm-serve.log").stdout
    assert "died" in log or "EngineCore" in log, log[-2000:]
    st = status(sc)
    assert st["state"] == "degraded"
    assert any(p.startswith("vllm serve is not running") for p in st["problems"]), st["problems"]
    res = sc("up", "--profile", "testbed", timeout=600)  # brings it back
    assert res.returncode == 0, res.stdout + res.stderr
    r = httpx.post(BASE + "/v1/chat/completions", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60,
                   json={"model": "testbed-tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200


def test_wrong_worker_control_interface_caught_before_serve(testbed, sc, tmp_path):
    sc("down")
    # the worker's other cabled twin: GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME would name it
    inv = inventory_variant(testbed, tmp_path, worker_block_edit('control_if = "enp1s0f1np1"',
                                                                 'control_if = "enP2p1s0f1np1"'))
    res = sc("up", "--profile", "testbed", inventory=inv, timeout=120)
    assert res.returncode != 0
    assert "net.control_ip" in res.stderr and "spark-worker" in res.stderr, res.stderr
    assert "▸ serve" not in res.stderr
