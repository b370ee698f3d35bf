"""A host's memory size as a fact (issue 52), on the testbed: a host made to read as a 64 GB Spark
(Testbed.set_memory: one meminfo view per host, for its facts and every container on it) fails a
profile sized for 128 GB (`testbed-large`: 75 GB of listed weights, one rank at 0.8) in `doctor`,
`profile lint` and `up`, with the arithmetic, before anything is pulled or started; the same profile
passes on a host reading as 128 GB; and the containers (the supervisor's and the metrics' reading)
see the memory `doctor` sees.

Needs a testbed rebuilt with this branch's hub (its `sparkcluster/testbed-large` repository, hashed
once on the hub's first start) and standin_bin/testbed-meminfo-view."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.integration.helpers import CONTAINERS, inventory_variant, ours
from tests.testbed import hub as testbed_hub

pytestmark = pytest.mark.testbed
HEAD, WORKER = "spark-head", "spark-worker"
LARGE = "testbed-large"
GB = 10**9


@pytest.fixture(autouse=True)
def _reset_after(testbed):
    yield
    for h in (HEAD, WORKER):
        testbed.set_memory(h, None)
    testbed.reset()


def _doctor(sc, profile: str = LARGE, inventory: Path | None = None) -> dict[tuple[str, str], dict]:
    res = sc("doctor", "--json", "--profile", profile, inventory=inventory, timeout=180)
    assert res.returncode in (0, 1), res.stdout + res.stderr
    return {(c["id"], c["node"]): c for c in json.loads(res.stdout)["checks"]}


def _memory_gb_inventory(testbed, tmp_path: Path, gb: float) -> Path:
    """The testbed's inventory with every node's memory_gb as `init` writes it (after its `gpus`,
    else at the end of each [[nodes]] block)."""

    def edit(text: str) -> str:
        return re.sub(r"(?m)^(\[\[nodes\]\])$", rf"\1\nmemory_gb = {gb}", text)

    return inventory_variant(testbed, tmp_path, edit)


def test_a_64_gb_host_fails_a_profile_sized_for_128_gb_in_doctor_and_a_128_gb_one_passes(testbed, sc):
    testbed.set_memory(HEAD, 64)
    testbed.set_memory(WORKER, 128)
    rows = _doctor(sc)
    head, worker = rows[("mem.fit", HEAD)], rows[("mem.fit", WORKER)]
    assert head["status"] == "fail", head
    assert "weights per rank 75.0 GB" in head["detail"] and "x MemTotal 64.0 GB = 51.2 GB" in head["detail"]
    assert "short" in head["detail"] and testbed_hub.LARGE in head["detail"]
    assert worker["status"] == "ok" and "MemTotal 128.0 GB" in worker["detail"], worker
    # nodes of two sizes in one cluster: said
    assert rows[("mem.size", HEAD)]["status"] == "warn" or rows[("mem.size", WORKER)]["status"] == "warn"


def test_lint_offline_judges_the_listing_doctor_read_against_memory_gb(testbed, sc, tmp_path):
    _doctor(sc)  # reads and remembers the hub's listing of testbed-large
    res = sc("profile", "lint", LARGE, inventory=_memory_gb_inventory(testbed, tmp_path, 64.0))
    assert res.returncode == 1, res.stdout + res.stderr
    assert "[memory-fit]" in res.stdout and "memory_gb 64 from the inventory" in res.stdout
    assert "weights per rank 75.0 GB" in res.stdout
    res = sc("profile", "lint", LARGE, inventory=_memory_gb_inventory(testbed, tmp_path, 128.0))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "memory_gb 128 from the inventory" in res.stderr


def test_up_refuses_in_preflight_on_a_64_gb_host_before_anything_is_pulled(testbed, sc):
    testbed.set_memory(HEAD, 64)
    before = ours(testbed, HEAD)
    res = sc("up", "--profile", LARGE, "--node", HEAD, timeout=600)
    out = res.stdout + res.stderr
    assert res.returncode != 0, out
    assert "mem.fit" in out and "weights per rank 75.0 GB" in out and "51.2 GB" in out, out
    assert ours(testbed, HEAD) == before  # no container started
    blobs = testbed.sh(HEAD, "ls ~/.cache/huggingface/hub/models--sparkcluster--testbed-large/blobs 2>/dev/null; true")
    assert not blobs.stdout.strip(), blobs.stdout  # nothing pulled


@pytest.mark.long
def test_the_containers_see_the_memory_doctor_sees(testbed, sc):
    testbed.set_memory(HEAD, 64)
    rows = _doctor(sc, profile="testbed-single")
    assert "MemTotal 64.0 GB" in rows[("mem.size", HEAD)]["detail"], rows[("mem.size", HEAD)]
    res = sc("up", "--profile", "testbed-single", "--node", HEAD, timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr
    try:
        container = next(c for c in ours(testbed, HEAD) if "single" in c or c == CONTAINERS[HEAD])
        # the supervisor and the memory reports read the container's /proc/meminfo
        inside = testbed.sh(HEAD, f"docker exec {container} grep ^MemTotal /proc/meminfo").stdout
        assert int(inside.split()[1]) * 1024 == 64 * GB // 1024 * 1024, inside
        # the node's metrics (the agent's /metrics on the control address)
        # the agent listens on the node's control address, where Prometheus scrapes it; the controller has
        # no route to the control network (as an owner's laptop has none to the QSFP link): curl on the head
        from sparkcluster.config import inventory

        ip = inventory.load(testbed.inventory).head.control_ip
        text = testbed.sh(HEAD, f"curl -sS --fail -m 10 http://{ip}:8297/metrics", timeout=30).stdout
        got = [ln for ln in text.splitlines() if ln.startswith("sparkcluster_node_mem_total_bytes")]
        assert got and abs(float(got[0].split()[-1]) - 64 * GB) < 1024, got
    finally:
        sc("down", "--node", HEAD, timeout=300)
