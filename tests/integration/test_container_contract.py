"""The container contract on the testbed's stand-in of NGC's vLLM image, which starts as NGC's does
(tests/testbed/images/ngc-startup: the loader, the driver check, shinit_v2 through BASH_ENV, the compat
driver only in compat/lib.real, its link removed at build) and whose engine fails its first kernel with
the PTX toolchain error where a process got the host's libcuda while the image was built for a newer
driver branch (the nvidia-smi stand-in's 580.142 against the image's 595.45.04), as a Spark does.

- main's start (the entrypoint emptied, `vllm serve` spawned without a shell) fails there, and the
  failed serve's reader names the cause;
- a one-node `up` (no Ray) serves the base image as pulled, builds nothing, reads the start-up's
  banner, and its engine runs on the image's own driver, again after Docker restarts the container
  (tests/integration/contract_case.py, on test_colocated's first `up`: no engine start of its own);
- an image whose start-up prints "UNAVAILABLE" fails `up` in the probe stage, before `vllm serve`,
  naming the driver it was built for.

The TP=2 Ray profile's ranks are checked where that deployment already serves (test_up.py).
"""

from __future__ import annotations

import shlex

import pytest

from sparkcluster.node import engine_failure
from tests.integration.helpers import HEAD, hf_cache, ours
from tests.testbed import PROFILES as TESTBED_PROFILES

pytestmark = pytest.mark.testbed
IMAGE = "nvcr.io/nvidia/vllm:26.05.post1-py3"
NO_COMPAT = "sparkcluster-testbed/vllm-no-compat:26.05"  # the stand-in without its compat driver
PTX = "the provided PTX was compiled with an unsupported toolchain"


def test_with_the_entrypoint_emptied_the_first_kernel_fails_with_the_ptx_error(testbed, sc):
    """main's start, by hand: the image's entrypoint emptied and `vllm serve` run without a shell, on the
    weights `weights pull` leaves in the SSH user's cache (in place already where an earlier module
    served them; `--mount` never creates a missing folder, as `-v` would, as root)."""
    pulled = sc("weights", "pull", "--profile", "testbed-single", timeout=600)
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
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
