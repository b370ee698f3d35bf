"""Issue 26 on the testbed: `doctor --fabric` measures the fabric between the nodes in containers of
the cluster image (the `testbed` profile's: the real engine's image, which carries PyTorch) with the
ranks' own environment, devices and flags, and judges it; each fault is caught on the node it is on.

The testbed has no GPU, so no NCCL: the same probe runs through torch.distributed's gloo backend over
the real links between the hosts (the real launcher, real containers, the real bandwidth
arithmetic). NCCL's log parser and its verdicts are unit-tested on real NCCL logs
(tests/unit/test_fabric_*.py, tests/captured/nccl/). The figures the testbed is held to are its
inventory's `[fabric]` (tests/testbed: gloo over veths), not a real pair's.
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.integration.helpers import BASE

pytestmark = pytest.mark.testbed
HEAD, WORKER = "spark-head", "spark-worker"
CONTROL_IF = "enp1s0f1np1"  # the testbed's control link: gloo's traffic (GLOO_SOCKET_IFNAME)


def fabric(sc) -> dict[tuple[str, str], dict]:
    res = sc("doctor", "--fabric", "--json", "--profile", "testbed", timeout=180)
    doc = json.loads(res.stdout)
    return {(c["id"], c["node"]): c for c in doc["checks"] if c["id"].startswith("fabric.")}


def nothing_left(testbed) -> None:
    for h in (HEAD, WORKER):
        names = testbed.docker(h, "ps -a --format '{{.Names}}'").stdout.split()
        assert not [n for n in names if n.endswith("-fabric")], (h, names)
        assert "fabric_probe" not in testbed.sh(h, "ps -eo args").stdout, h


@pytest.fixture(scope="module")
def down_with_image(testbed, sc):
    """The `testbed` profile's cluster image on both nodes (an `up` makes it when missing: that `up`
    runs the fabric stage too), then nothing serving."""
    ref = "sparkcluster/vllm-ray:26.05.post1-py3-ray2.60.0"
    if not (testbed.image_id(HEAD, ref) and testbed.image_id(WORKER, ref)):
        res = sc("up", "--profile", "testbed", timeout=900)
        assert res.returncode == 0, res.stdout + res.stderr
        assert "✓ fabric" in res.stderr, res.stderr
    yield
    for h in (HEAD, WORKER):
        testbed.unshape_egress(h)
        testbed.show_uverbs(h)


def test_refused_while_a_server_runs(testbed, sc, down_with_image):
    res = sc("up", "--profile", "testbed", timeout=900)  # a no-op where the previous module left it serving
    assert res.returncode == 0, res.stdout + res.stderr
    got = fabric(sc)
    run = got[("fabric.run", f"{HEAD}+{WORKER}")]
    assert run["status"] == "fail" and "vllm serve" in run["detail"], got
    assert "sparkcluster down" in run["fix"]
    assert httpx.get(f"{BASE}/health", timeout=10).status_code == 200  # still serving
    nothing_left(testbed)


def test_healthy_fabric_passes_in_throwaway_containers(testbed, sc, down_with_image):
    sc("down")
    got = fabric(sc)
    assert {k: c["status"] for k, c in got.items()} == {
        ("fabric.transport", HEAD): "ok",
        ("fabric.transport", WORKER): "ok",
        ("fabric.bandwidth", f"{HEAD}+{WORKER}"): "ok",
        # the decode-size all-reduce is timed beside the bandwidth; gloo's time is not NCCL's (issue 59)
        ("fabric.latency", f"{HEAD}+{WORKER}"): "skip",
        ("fabric.direction", HEAD): "ok",
        ("fabric.direction", WORKER): "ok",
        ("fabric.gpu_speed", HEAD): "ok",
        ("fabric.gpu_speed", WORKER): "ok",
    }, got
    assert "gloo" in got[("fabric.transport", WORKER)]["detail"]
    assert "48 KiB" in got[("fabric.latency", f"{HEAD}+{WORKER}")]["detail"]
    assert "all_gather busbw" in got[("fabric.bandwidth", f"{HEAD}+{WORKER}")]["detail"]
    nothing_left(testbed)


def test_a_slow_egress_is_named_on_its_node(testbed, sc, down_with_image):
    testbed.shape_egress(WORKER, CONTROL_IF, "150mbit")
    try:
        got = fabric(sc)
    finally:
        testbed.unshape_egress(WORKER, CONTROL_IF)
    assert got[("fabric.direction", WORKER)]["status"] == "fail", got
    assert f"{WORKER} -> {HEAD}" in got[("fabric.direction", WORKER)]["detail"]
    assert got[("fabric.direction", HEAD)]["status"] == "ok", got
    assert got[("fabric.bandwidth", f"{HEAD}+{WORKER}")]["status"] in ("fail", "warn"), got
    nothing_left(testbed)


def test_a_container_without_rdma_devices_fails_on_that_node(testbed, sc, down_with_image):
    testbed.hide_uverbs(WORKER)
    try:
        got = fabric(sc)
    finally:
        testbed.show_uverbs(WORKER)
    worker = got[("fabric.transport", WORKER)]
    assert worker["status"] == "fail" and "no /dev/infiniband in the container" in worker["detail"], got
    assert "--device=/dev/infiniband" in worker["fix"]
    assert got[("fabric.transport", HEAD)]["status"] == "ok", got
    nothing_left(testbed)


def test_a_slow_gpu_is_named_on_its_node(testbed, sc, down_with_image):
    """Issue 39 item 3: the fixed GPU workload timed on each node, one at a time; the worker's GPU
    stand-in made slow (its containers get a quarter of a CPU) is named there only."""
    testbed.set_gpu_slow(WORKER, 0.25)
    try:
        got = fabric(sc)
    finally:
        testbed.set_gpu_slow(WORKER, None)
    worker = got[("fabric.gpu_speed", WORKER)]
    assert worker["status"] == "warn" and "the median node's" in worker["detail"], got
    assert "nvidia-smi -q -d PERFORMANCE" in worker["fix"], worker
    assert got[("fabric.gpu_speed", HEAD)]["status"] == "ok", got
    nothing_left(testbed)
