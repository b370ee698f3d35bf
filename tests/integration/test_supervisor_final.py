"""The supervisor's final states on the real engine (TP=2 over Ray), late in the serving tail
(tests/conftest.py SERVING_TAIL: after test_guide, on the cluster the modules before it leave serving,
whatever restarts they counted):

- a node's MemAvailable below the floor (a stand-in at the OS boundary, as lxcfs does: the worker
  container's /proc/meminfo): the server stopped and not restarted, the reason in `status`;
- `down` leaves nothing (no container, no listener on Ray's or the engine's port, no vLLM process; a
  second `down` says it is down already), and after a reboot nothing comes back.

Its restarts and their limit are test_supervisor.py's, earlier in the tail, going on from
test_monitor's wedge.
"""

from __future__ import annotations

import time

import pytest

from tests.integration import helpers
from tests.integration.helpers import HEAD, WORKER, journal, listeners, ours, sup_state
from tests.integration.test_supervisor import WORKER_C, answers, looks_since, status, wait_for

pytestmark = pytest.mark.testbed


@pytest.fixture(scope="module")
def serving(testbed, sc):
    """What the tail leaves serving, used as it is (`up` only where nothing serves)."""
    helpers.up_unless_serving(testbed, sc)


def test_memory_below_the_floor_stops_the_server_for_good(testbed, sc, serving):
    assert answers()
    t = time.time()
    try:
        testbed.set_meminfo(WORKER, WORKER_C, 4 * 1024 * 1024)  # 4 GiB, below the default 6 GiB floor
        wait_for("stopped for memory", lambda: sup_state(testbed).get("state") == "stopped: memory floor", 60, testbed)
        looks_since(testbed, time.time())  # past a backoff: nothing is started again
        assert not answers()
        code, st = status(sc)
        assert code != 0
        said = [p for p in st["problems"] if p.startswith("supervisor: vllm serve stopped and not restarted")]
        assert said and "spark-worker 4.0 GiB" in said[0] and "gpu_memory_utilization" in said[0], st["problems"]
    finally:
        testbed.set_meminfo(WORKER, WORKER_C, None)
    assert [e for e in journal(testbed) if (e["event"], e.get("kind")) == ("verdict", "memory") and e["ts"] > t]


def test_down_leaves_nothing_and_nothing_comes_back_after_a_reboot(testbed, sc, serving):
    res = sc("down")
    assert res.returncode == 0, res.stdout + res.stderr
    for host in (HEAD, WORKER):
        assert ours(testbed, host) == []
        assert listeners(testbed, host, 6379) == "" and listeners(testbed, host, 8000) == ""
        assert "vllm" not in testbed.sh(host, "ps -eo args").stdout
    again = sc("down")
    assert again.returncode == 0 and "already down" in again.stdout
    testbed.reboot(HEAD)
    testbed.reboot(WORKER)
    time.sleep(5)
    assert ours(testbed, HEAD) == [] and ours(testbed, WORKER) == []
