"""The container contract on the testbed's stand-in of NGC's vLLM image, which starts as NGC's does
(tests/testbed/images/ngc-startup: the loader, the driver check, shinit_v2 through BASH_ENV, the compat
driver only in compat/lib.real, its link removed at build) and whose engine fails its first kernel with
the PTX toolchain error where a process got the host's libcuda while the image was built for a newer
driver branch (the nvidia-smi stand-in's 580.142 against the image's 595.45.04), as a Spark does.

- main's start (the entrypoint emptied, `vllm serve` spawned without a shell) fails there, and the
  failed serve's reader names the cause;
- a one-node `up` (no Ray) serves the base image as pulled, builds nothing, reads the start-up's
  banner, and its engine runs on the image's own driver, again after Docker restarts the container;
- an image whose start-up prints "UNAVAILABLE" fails `up` in the probe stage, before `vllm serve`,
  naming the driver it was built for.

The TP=2 Ray profile's ranks are checked where that deployment already serves (test_up.py).
"""

from __future__ import annotations

import json
import shlex

import pytest

from sparkcluster.node import engine_failure
from sparkcluster.node.contract import JOURNAL_PATH, RECORD_PATH
from tests.integration.helpers import HEAD, HEAD_C, hf_cache, ours, wait_for
from tests.testbed import PROFILES as TESTBED_PROFILES

pytestmark = pytest.mark.testbed
IMAGE = "nvcr.io/nvidia/vllm:26.05.post1-py3"
NO_COMPAT = "sparkcluster-testbed/vllm-no-compat:26.05"  # the stand-in without its compat driver
PTX = "the provided PTX was compiled with an unsupported toolchain"


def environ(testbed, pid: str) -> dict[str, str]:
    out = testbed.sh(HEAD, f"docker exec {HEAD_C} cat /proc/{pid}/environ", check=False).stdout
    return dict(x.split("=", 1) for x in out.split("\0") if "=" in x)


def libcuda(testbed, pid: str) -> str:
    return testbed.sh(HEAD, f"docker exec {HEAD_C} grep -m1 libcuda /proc/{pid}/maps", check=False).stdout


def server_pid(testbed) -> str | None:
    out = testbed.sh(HEAD, f"docker exec {HEAD_C} cat {RECORD_PATH}", check=False).stdout
    try:
        return str(json.loads(out)["pid"])
    except (ValueError, KeyError):
        return None


@pytest.fixture(scope="module")
def single(testbed, sc):
    sc("down")
    res = sc("up", "--profile", "testbed-single", "--node", HEAD, timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr
    yield res
    sc("down")


def test_with_the_entrypoint_emptied_the_first_kernel_fails_with_the_ptx_error(testbed, single):
    """main's start, by hand: the image's entrypoint emptied and `vllm serve` run without a shell, on the
    weights the one-node `up` left in the SSH user's cache (`--mount` never creates a missing folder, as
    `-v` would, as root)."""
    cache = shlex.quote(hf_cache())
    run = (
        f"docker run --rm --gpus all --network none --shm-size 1g --entrypoint '' "
        f"--mount type=bind,source={cache},target=/hf -e HF_HOME=/hf "
        "-e HF_HUB_OFFLINE=1 -e VLLM_CPU_KVCACHE_SPACE=1 -e TORCHDYNAMO_DISABLE=1 "
        f"{IMAGE} vllm serve sparkcluster/testbed-tiny --enforce-eager --max-model-len 512 --port 8099"
    )
    res = testbed.sh(HEAD, run, check=False, timeout=300)
    out = res.stdout + res.stderr
    assert res.returncode != 0 and PTX in out, out[-3000:]
    failure = engine_failure.read(out)
    assert failure is not None and failure.cause() is not None and failure.cause().id == "ptx-toolchain", out[-3000:]
    # the same image, the workload under bash (BASH_ENV runs NGC's shinit_v2): the image's own driver
    probe = (
        'python3 -c \'import ctypes; ctypes.CDLL("libcuda.so.1"); '
        'print([x.split()[-1] for x in open("/proc/self/maps") if "libcuda" in x][0])\''
    )
    got = testbed.sh(HEAD, f"docker run --rm --gpus all --entrypoint '' {IMAGE} bash -c {shlex.quote(probe)}")
    assert got.stdout.strip().startswith("/usr/local/cuda/compat/lib"), got.stdout


def test_one_node_serves_the_image_as_pulled_through_its_start_up(testbed, single):
    err = single.stderr
    # nothing built, nothing sent: the base image, which the head holds, as it is
    assert "✓ image 0.0s  in place on every node" in err or "in place on every node" in err, err
    assert "built on" not in err and "docker build" not in err
    inspect = testbed.sh(HEAD, f"docker inspect {HEAD_C}").stdout
    c = json.loads(inspect)[0]
    assert c["Config"]["Image"] == IMAGE and c["Config"]["Labels"]["org.sparkcluster.executor"] == "uni"
    # the image's entrypoint kept, the agent its command
    assert c["Path"] in ("/sbin/docker-init", "/opt/nvidia/nvidia_entrypoint.sh"), c["Path"]
    assert c["Config"]["Entrypoint"] == ["/opt/nvidia/nvidia_entrypoint.sh"], c["Config"]["Entrypoint"]
    # the start-up's banner read before serving
    assert "start-up: forward" in err, err
    # the engine inherited the start-up's environment and loaded the image's own libcuda
    pid = server_pid(testbed)
    assert pid, testbed.sh(HEAD, f"docker exec {HEAD_C} ls /run/sparkcluster", check=False).stdout
    env = environ(testbed, pid)
    assert env.get("_CUDA_COMPAT_STATUS") == "CUDA Driver OK", env
    assert env["LD_LIBRARY_PATH"].startswith("/usr/local/cuda/compat/lib.real:"), env["LD_LIBRARY_PATH"]


def test_after_docker_restarts_the_container_the_engine_still_gets_the_start_up(testbed, single):
    before = server_pid(testbed)
    testbed.sh(HEAD, f"docker restart {HEAD_C}", timeout=120)
    # the supervisor in the restarted container starts a new engine (its record names the new process)
    pid = wait_for(lambda: (p := server_pid(testbed)) and p != before and environ(testbed, p) and p, 120, 0.5)
    assert pid, testbed.sh(HEAD, f"docker logs --tail 30 {HEAD_C}", check=False).stdout
    assert environ(testbed, pid).get("_CUDA_COMPAT_STATUS") == "CUDA Driver OK"
    # and the agent said so in the journal, at each start
    journal = testbed.sh(HEAD, f"docker exec {HEAD_C} cat {JOURNAL_PATH}").stdout
    starts = [json.loads(x) for x in journal.splitlines() if '"agent started"' in x]
    assert len(starts) >= 2 and all(e.get("cuda_compat") == "CUDA Driver OK" for e in starts[-2:]), starts


def test_an_image_whose_start_up_says_unavailable_fails_before_vllm_serve(testbed, sc, tmp_path):
    # the stand-in without its compat driver: NGC's probe cannot run it, the driver check refuses
    build = f"printf 'FROM {IMAGE}\\nRUN rm -rf /usr/local/cuda/compat/lib.real\\n' | docker build -q -t {NO_COMPAT} -"
    testbed.sh(HEAD, build, timeout=300)
    text = (TESTBED_PROFILES / "testbed-single.toml").read_text()
    assert 'base = "nvcr.io/nvidia/vllm"' in text and 'tag = "26.05.post1-py3"' in text
    variant = text.replace('base = "nvcr.io/nvidia/vllm"', 'base = "sparkcluster-testbed/vllm-no-compat"')
    variant = variant.replace('tag = "26.05.post1-py3"', 'tag = "26.05"')
    (tmp_path / "testbed-no-compat.toml").write_text(variant)
    env = {"SPARKCLUSTER_PROFILES": str(tmp_path)}
    try:
        sc("down")
        res = sc("up", "--profile", "testbed-no-compat", "--node", HEAD, env=env, timeout=600)
        assert res.returncode != 0, res.stdout + res.stderr
        err = res.stderr
        assert "stage 'probe' failed on spark-head" in err, err
        assert "built for NVIDIA Driver Release 595.45 or later" in err and "UNAVAILABLE" in err, err
        assert "595 branch or later" in err, err
        assert "▸ serve" not in err  # nothing served: the run stopped before the serve stage
        assert not ours(testbed, HEAD)  # and what it created was rolled back
    finally:
        sc("down", env=env)
        testbed.sh(HEAD, f"docker rmi -f {NO_COMPAT}", check=False)
