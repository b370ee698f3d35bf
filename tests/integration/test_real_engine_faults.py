"""The real vLLM engine's own failure modes on the testbed (vLLM 0.32.0, CPU build, TP=2 over Ray),
each caught by sparkcluster with a clear message:

- rank 1's worker stopped (SIGSTOP) or killed: tests/integration/test_supervisor.py, where the
  supervisor on the head catches and restarts it (and `status` names the wedge first);
- a wrong control interface on the worker (GLOO_SOCKET_IFNAME and VLLM_HOST_IP follow it) is caught
  by preflight before `vllm serve` starts.
(An unknown flag rejected by the real parser: tests/integration/test_traps.py.)
"""

from __future__ import annotations

import json

import pytest

from tests.integration.helpers import inventory_variant, worker_block_edit

pytestmark = pytest.mark.testbed
HEAD, WORKER = "spark-head", "spark-worker"


def status(sc) -> dict:
    return json.loads(sc("status", "--json").stdout)


def test_wrong_worker_control_interface_caught_before_serve(testbed, sc, tmp_path):
    sc("down")
    # the worker's other cabled twin: GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME would name it
    inv = inventory_variant(
        testbed, tmp_path, worker_block_edit('control_if = "enp1s0f1np1"', 'control_if = "enP2p1s0f1np1"')
    )
    res = sc("up", "--profile", "testbed", inventory=inv, timeout=120)
    assert res.returncode != 0
    assert "net.control_ip" in res.stderr and "spark-worker" in res.stderr, res.stderr
    assert "▸ serve" not in res.stderr
