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
import os
import re
import signal
from pathlib import Path

import pytest

from tests.integration.helpers import inventory_variant, ours, popen_sc, wait_for, worker_block_edit

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


def test_a_rank_killed_by_sigill_while_up_waits_is_named_and_its_logs_kept(testbed, sc, env_file):
    """Issue 62: the real engine's worker rank dies of SIGILL (sent here; on the issue's CPU vLLM's CPU
    attention kernel raised it) while `up` waits for the server: the error names the failure and the
    rank's node, not the shutdown noise after it; every node's logs are kept on the controller before
    the rollback removes the containers; `logs` and `events` point to them."""
    sc("down")
    proc = popen_sc(testbed, sc, env_file, "up", "--profile", "testbed")
    try:
        pids = wait_for(lambda: testbed.sh(WORKER, "pgrep -f '[R]ayWorkerProc' || true").stdout.split() or None, 300)
        assert pids, "no worker rank started within 300 s"
        testbed.sh(WORKER, "kill -ILL " + " ".join(pids))
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            proc.communicate(timeout=120)
    text = out + err
    assert proc.returncode == 1, text
    failed = next(line for line in text.splitlines() if "stage 'serve' failed" in line)
    assert "SIGILL" in text or "Illegal instruction" in text, text
    assert "spark-worker" in failed, failed
    m = re.search(r"the engine's logs are kept in (\S+)", text)
    assert m, text
    kept = Path(m.group(1))
    assert (kept / "spark-head.log").is_file() and (kept / "spark-worker.log").is_file()
    assert not ours(testbed, HEAD) and not ours(testbed, WORKER)  # rolled back
    logs = sc("logs")
    assert f"the last failed start's logs are kept in {kept}" in logs.stdout, logs.stdout + logs.stderr
