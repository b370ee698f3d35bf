"""Drift caught before it bites (issue 39) on the testbed: the trap facts read through the real
probes on stand-ins the testbed binds per host (its hosts share one kernel), and the known-good
record that `up` leaves.

- a node whose stand-in reports the 7.0 kernel with CmaTotal 0 (and CmaFree above it) FAILs
  host.kernel there only, with the fix (kho=off or the 6.17 kernel);
- an HCA whose PCIe link reads x2 on one node WARNs rdma.pcie there only;
- the 7.0 kernel with the 32 MiB cma= default kept and 9.3 GiB CmaFree (MiaAI-Lab #259) FAILs it too;
- the engine image carries NGC 26.05's environment (built for 595, CUDA 13.2.1:
  tests/testbed/images/Dockerfile.ngc-standin) on DGX OS 7.5's 580.142: image.driver WARNs on both
  nodes (compatibility mode), and FAILs only a worker whose stand-in driver is a 570 (a newer CUDA
  major than it runs), with a fix that exists (issue 51);
- a copy of the engine image with the pip NCCL wheel's 2.28.9 metadata is caught by the known-bad
  list (image.nccl, the entry's id, source and fix) on both nodes;
- after `up` served (the test double, profile testbed-standin), a second `doctor` after the kernel
  string changed on the worker says what drifted since that serve, on the worker only, and `status`
  says it too.

Each knob is undone in `finally` (and by `Testbed.reset()`); the module ends with the cluster down.
"""

from __future__ import annotations

import json

import pytest

from tests.integration.helpers import ours
from tests.testbed.artifacts import BASE_IMAGE

pytestmark = pytest.mark.testbed
HEAD, WORKER = "spark-head", "spark-worker"
KHO_KERNEL = "7.0.0-1019-nvidia"


def doctor(sc) -> dict[tuple[str, str], dict]:
    res = sc("doctor", "--json", timeout=120)
    assert res.returncode in (0, 1), f"doctor exited {res.returncode}\n{res.stdout}\n{res.stderr}"
    return {(c["id"], c["node"]): c for c in json.loads(res.stdout)["checks"]}


def worker_hca(testbed) -> str:
    from sparkcluster.config import inventory

    inv = inventory.load(testbed.inventory)
    return next(n for n in inv.nodes if n.name == WORKER).hcas[0]


@pytest.fixture(autouse=True)
def _reset_after(testbed):
    yield
    testbed.reset()


def test_kernel_7_with_cma_0_fails_on_that_node_only(testbed, sc):
    try:
        testbed.set_kernel(WORKER, KHO_KERNEL)
        testbed.set_cma(WORKER, total_kb=0, free_kb=940604)
        rows = doctor(sc)
    finally:
        testbed.set_cma(WORKER, None)
        testbed.set_kernel(WORKER, None)
    r = rows[("host.kernel", WORKER)]
    assert r["status"] == "fail", r
    assert KHO_KERNEL in r["detail"] and "kernel-7.0-kho-cma" in r["detail"], r
    assert "kho=off" in r["fix"] and "6.17" in r["fix"], r
    assert rows[("host.kernel", HEAD)]["status"] == "ok", rows[("host.kernel", HEAD)]


def test_kernel_7_with_cma_32mib_and_9_3gib_free_fails_on_that_node_only(testbed, sc):
    # MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark#259: CmaTotal 32 MiB (the cma= default kept),
    # CmaFree 9.3 GiB (tests/captured/gb10-meminfo-cma-kho-32mib.txt)
    try:
        testbed.set_kernel(WORKER, KHO_KERNEL)
        testbed.set_cma(WORKER, total_kb=32768, free_kb=9751757)
        rows = doctor(sc)
    finally:
        testbed.set_cma(WORKER, None)
        testbed.set_kernel(WORKER, None)
    r = rows[("host.kernel", WORKER)]
    assert r["status"] == "fail" and "kernel-7.0-kho-cma" in r["detail"], r
    assert "MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark#259" in r["detail"] and "kho=off" in r["fix"], r
    assert rows[("host.kernel", HEAD)]["status"] == "ok", rows[("host.kernel", HEAD)]


def test_kernel_7_without_the_tell_is_only_named_as_different(testbed, sc):
    try:
        testbed.set_kernel(WORKER, KHO_KERNEL)
        testbed.set_cma(WORKER, total_kb=0, free_kb=0)  # booted with kho=off: CmaFree reads 0
        rows = doctor(sc)
    finally:
        testbed.set_cma(WORKER, None)
        testbed.set_kernel(WORKER, None)
    r = rows[("host.kernel", WORKER)]
    assert r["status"] == "warn" and "on its peers" in r["detail"], r
    assert rows[("host.kernel", HEAD)]["status"] == "ok"


def test_hca_at_x2_warns_on_that_node_only(testbed, sc):
    hca = worker_hca(testbed)
    try:
        testbed.set_hca_link_width(WORKER, hca, 2)
        rows = doctor(sc)
    finally:
        testbed.set_hca_link_width(WORKER, hca, 4)
    r = rows[("rdma.pcie", WORKER)]
    assert r["status"] == "warn" and f"{hca} at x2" in r["detail"] and "cx7-pcie-narrow" in r["detail"], r
    assert "fwupdmgr" in r["fix"], r
    assert rows[("rdma.pcie", HEAD)]["status"] == "ok", rows[("rdma.pcie", HEAD)]


def test_image_of_26x_runs_on_580_and_a_newer_cuda_major_fails(testbed, sc):
    """Issue 51: the engine image carries NGC 26.05's environment (CUDA 13.2.1, built for the 595
    branch: Dockerfile.ngc-standin) and the hosts DGX OS 7.5's 580.142: image.driver WARNs (the same
    CUDA major: compatibility mode, naming PTX JIT) and never FAILs; a worker whose stand-in driver is
    a 570 (CUDA 12.8) cannot start CUDA 13: FAIL there only, with a fix that exists."""

    def rows() -> dict[tuple[str, str], dict]:
        # testbed-mp serves the engine image as it is: the image doctor reads is on both nodes without an `up`
        res = sc("doctor", "--json", "--profile", "testbed-mp", timeout=120)
        assert res.returncode in (0, 1), f"doctor exited {res.returncode}\n{res.stdout}\n{res.stderr}"
        return {(c["id"], c["node"]): c for c in json.loads(res.stdout)["checks"]}

    env = testbed.docker(HEAD, "image inspect --format '{{json .Config.Env}}' " + BASE_IMAGE).stdout
    assert "CUDA_DRIVER_VERSION=595.45.04" in env and "CUDA_VERSION=13.2.1" in env, (
        f"the testbed's engine image predates Dockerfile.ngc-standin's 26.05 environment ({env.strip()}): "
        "make testbed-down && make testbed-up builds it once"
    )
    before = rows()
    for n in (HEAD, WORKER):
        r = before[("image.driver", n)]
        assert r["status"] == "warn", r
        assert "driver 580.142 is older than the image was built for (CUDA_DRIVER_VERSION=595.45.04" in r["detail"], r
        assert "Compatibility mode ENABLED" in r["detail"] and "vllm-project/vllm#47397" in r["detail"], r
        assert "keeps the image's own start-up" in r["detail"], r  # what the container gets
    try:
        testbed.set_driver_version(WORKER, "570.124.06")
        after = rows()
    finally:
        testbed.set_driver_version(WORKER)
    r = after[("image.driver", WORKER)]
    assert r["status"] == "fail", r
    assert "driver 570.124.06 runs CUDA 12.x at most, the image is CUDA 13" in r["detail"], r
    assert "580 branch or later" in r["fix"] and "CUDA 12.x" in r["fix"], r
    assert after[("image.driver", HEAD)]["status"] == "warn", after[("image.driver", HEAD)]


def test_drift_between_two_doctors_after_the_kernel_changes(testbed, sc):
    res = sc("up", "--profile", "testbed-standin", "--replace", timeout=900)
    assert res.returncode == 0, f"{res.stdout}\n{res.stderr}"
    try:
        history = json.loads((sc.state_dir / "sparkcluster" / "known-good-testbed.json").read_text())["records"]
        last = history[-1]
        assert last["deployment"] == f"testbed-standin@{HEAD}+{WORKER}", last
        assert set(last["nodes"]) == {HEAD, WORKER} and all(n["kernel"] for n in last["nodes"].values())
        assert last["profile_hash"] and last["model_revision"] and last["image"]

        before = doctor(sc)
        assert before[("drift.since_good", WORKER)]["status"] == "ok", before[("drift.since_good", WORKER)]
        real = last["nodes"][WORKER]["kernel"]
        try:
            testbed.set_kernel(WORKER, KHO_KERNEL)
            after = doctor(sc)
            status = sc("status", timeout=60)
        finally:
            testbed.set_kernel(WORKER, None)
        r = after[("drift.since_good", WORKER)]
        assert r["status"] == "warn", r
        assert f"kernel {real} -> {KHO_KERNEL} on {WORKER} since the serve of {last['at'][5:10]}" in r["detail"], r
        assert after[("drift.since_good", HEAD)]["status"] == "ok", after[("drift.since_good", HEAD)]
        assert f"kernel {real} -> {KHO_KERNEL} on {WORKER}" in status.stdout, status.stdout
    finally:
        sc("down", timeout=300)
    assert ours(testbed, HEAD) == [] and ours(testbed, WORKER) == []


def test_the_known_bad_list_catches_an_image_whose_nccl_is_on_it(testbed, sc, tmp_path):
    """A copy of the engine image carrying the pip NCCL wheel's metadata at 2.28.9 (a Spark pair's
    CUDA-graph replay deadlocks on any 2.28.9 build: vllm#52504; only the wheel's METADATA, which is what the probe reads: the CPU build
    loads no NCCL), served by a profile of its own: image.nccl WARNs (the entry's severity) on it, with
    its source and fix; the engine image as it is has no NCCL build to judge (SKIP)."""
    from sparkcluster.config.profile import find

    tag = "26.05.post1-py3-ncclpip"
    ref = BASE_IMAGE.rsplit(":", 1)[0] + ":" + tag
    dockerfile = (
        f"FROM {BASE_IMAGE}\n"
        "RUN d=$(python3 -c 'import site; print(site.getsitepackages()[0])')/nvidia_nccl_cu13-2.28.9.dist-info"
        ' && mkdir -p "$d" && printf "Metadata-Version: 2.1\\nName: nvidia-nccl-cu13\\nVersion: 2.28.9\\n"'
        ' > "$d/METADATA"\n'
    )
    prof = tmp_path / "testbed-mp-ncclpip.toml"
    prof.write_text(find("testbed-mp").read_text().replace('tag = "26.05.post1-py3"', f'tag = "{tag}"', 1))
    try:
        for host in (HEAD, WORKER):
            testbed.sh(host, f"docker build -q -t {ref} -", input=dockerfile, timeout=300)
        res = sc("doctor", "--json", "--profile", str(prof), timeout=180)
        assert res.returncode in (0, 1), f"doctor exited {res.returncode}\n{res.stdout}\n{res.stderr}"
        rows = {(c["id"], c["node"]): c for c in json.loads(res.stdout)["checks"]}
        for host in (HEAD, WORKER):
            r = rows[("image.nccl", host)]
            assert r["status"] == "warn", r  # the entry's severity (config/known_bad.toml): a hang in minutes
            assert "known bad: nccl-2.28.9-graph-hang" in r["detail"] and "vllm-project/vllm#52504" in r["detail"], r
            assert "2.30.4" in r["fix"], r
    finally:
        for host in (HEAD, WORKER):
            testbed.docker(host, f"image rm -f {ref}", check=False)


def test_a_fatal_cx7_pcie_error_fails_doctor_on_that_node_only(testbed, sc):
    """Issue 59: the stand-in's AER counters (sysfs aer_dev_* of each HCA's PCI function) count one
    fatal error on the worker: rdma.aer FAILs there, naming the HCA and the Spark head soft-lock it
    led to (MiaAI-Lab DSV4 #146), and the head stays OK."""
    hca = worker_hca(testbed)
    try:
        testbed.set_hca_aer(WORKER, hca, fatal=1)
        rows = doctor(sc)
    finally:
        testbed.set_hca_aer(WORKER, hca)
    r = rows[("rdma.aer", WORKER)]
    assert r["status"] == "fail" and hca in r["detail"] and "fatal 1" in r["detail"], r
    assert "#146" in r["detail"] and "journalctl -k" in r["fix"], r
    assert rows[("rdma.aer", HEAD)]["status"] == "ok", rows[("rdma.aer", HEAD)]
