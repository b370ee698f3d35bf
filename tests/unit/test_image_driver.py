"""image.driver as the field observes it (issue 51): `facts.image_nccl.judge_driver`, one row per case.

Sources of each row's values:
- NGC vLLM 26.05's CUDA 13.2.1 and 26.03's 13.2.0: NVIDIA's vLLM release notes (rel-26-05, rel-26-03,
  "Release 26.0x is based on CUDA 13.2.x").
- 26.03's driver 595.45.04 and the Spark's 580.142: tests/captured/ngc-vllm-26.03-spark-banner.txt.
- NGC's `NVIDIA_REQUIRE_CUDA=cuda>=9.0`: tests/captured/ngc-pytorch-25.10-arm64-env.txt (NGC's
  convention; 26.0x's own value was not found).
- eugr#266's 590.48 on 580.159.03 and its banner: tests/captured/eugr-266-refused-banner.txt; CUDA
  13.1.1 is the CUDA that 590.48's release shipped with (the existing eugr#266 test's reading).
- 570.124.06: a real 570 driver (CUDA 12.8: CUDA_MIN_DRIVER's 570.26).
- the minor version compatibility table: NVIDIA's CUDA Compatibility guide ("CUDA 13.x >= 580").
"""

from __future__ import annotations

import pytest
from conftest import cap

from sparkcluster.facts import image_nccl
from sparkcluster.facts.image_nccl import ImageNccl, judge_driver

IMG = "sha256:" + "e" * 64
NGC_26 = ImageNccl(IMG, "", "", "13.2.1", "595.45.04", "cuda>=9.0")  # 26.x's shape (module docstring)
EUGR_266 = ImageNccl(IMG, "", "", "13.1.1", "590.48.01", "")
REFUSED = cap("eugr-266-refused-banner.txt")
ENABLED = cap("ngc-vllm-26.03-spark-banner.txt")


@pytest.mark.parametrize(
    ("found", "driver", "status", "case"),
    [
        # the image's own branch, or a newer one: met
        (NGC_26, "595.58.03", "ok", "met"),
        # 26.x on DGX OS 7.5's 580: the same CUDA major, forward compatibility on a Spark: not failed
        (NGC_26, "580.142", "warn", "compat"),
        (NGC_26, "580.178.04", "warn", "compat"),
        # eugr#266's image by its environment alone: the same major, so compatibility mode
        (EUGR_266, "580.159.03", "warn", "compat"),
        # a CUDA 13 image on a 570 driver (CUDA 12.8): a newer CUDA major
        (NGC_26, "570.124.06", "fail", "newer-major"),
        # a CUDA base image requiring 13.1 on 580: compatibility; on 570: a newer major
        (ImageNccl(IMG, "", "", "", "", "cuda>=13.1"), "580.95.05", "warn", "compat"),
        (ImageNccl(IMG, "", "", "", "", "cuda>=13.1"), "570.124.06", "fail", "newer-major"),
        # a requirement newer than CUDA_MIN_DRIVER knows (13.2), compared as a CUDA release
        (ImageNccl(IMG, "", "", "", "", "cuda>=13.2"), "580.142", "warn", "compat"),
        # nothing said, or no driver seen: not judged
        (ImageNccl(IMG, "", "", "", "", ""), "580.142", "skip", "unknown"),
        (NGC_26, "", "skip", "unknown"),
    ],
)
def test_judge_driver_cases(found, driver, status, case):
    v = judge_driver(found, driver)
    assert (v.status, v.case) == (status, case), v


def test_each_case_names_its_source_and_a_fix_that_exists():
    v = judge_driver(NGC_26, "580.142")
    assert "CUDA_DRIVER_VERSION=595.45.04: driver branch 595 or later" in v.detail
    assert "vllm-project/vllm#47397" in v.detail and "Forward Compatibility mode ENABLED" in v.detail
    # what the container gets: the start-up kept, and read by `up` (judge_boot)
    assert "keeps the image's own start-up" in v.detail and "UNAVAILABLE before serving" in v.detail
    assert "595" not in v.fix  # no DGX OS package gives 595: the fix is never "update to 595"
    v = judge_driver(NGC_26, "570.124.06")
    assert "NVIDIA CUDA Compatibility guide" in v.detail
    assert "580 branch or later" in v.fix and "sudo apt full-upgrade" in v.fix and "CUDA 12.x" in v.fix
    # a major no table knows the branch of: only the image change is offered
    v = judge_driver(ImageNccl(IMG, "", "", "14.0.0", "610.10", ""), "580.142")
    assert v.status == "fail" and "apt" not in v.fix and "CUDA 13.x" in v.fix, v


def test_the_cuda_a_driver_runs():
    assert image_nccl.driver_cuda("580.142") == (13, 0)
    assert image_nccl.driver_cuda("570.124.06") == (12, 8)
    assert image_nccl.driver_cuda_major("580.142") == 13 and image_nccl.driver_cuda_major("570.124.06") == 12
    assert image_nccl.driver_cuda_major("[N/A]") is None


# ---- judge_boot: what a started container got from its image's start-up ----------------------------
# the 26.x stand-in's environment (CUDA 13.2.1, built for 595.45.04) and eugr#266's (built for 590.48)
ENV_26 = {"CUDA_VERSION": "13.2.1", "CUDA_DRIVER_VERSION": "595.45.04"}
ENV_266 = {"CUDA_VERSION": "13.1.1", "CUDA_DRIVER_VERSION": "590.48.01"}
AGENT_OK = "sparkcluster agent: _CUDA_COMPAT_STATUS=CUDA Driver OK\n"
# the minor version compatibility line, as NVIDIA's 52-gpu-driver-version-check.sh prints it (a copy:
# gbxu/EnvDeployment system_check/52-gpu-driver-version-check.sh; Triton 26.01 printed it on 580.95.05)
MINOR = "WARNING: CUDA Minor Version Compatibility mode ENABLED.\n"


@pytest.mark.parametrize(
    ("output", "env", "driver", "kept", "status", "case"),
    [
        # 26.03's banner on 580.142, and the agent's environment saying the same
        (ENABLED + AGENT_OK, ENV_26, "580.142", True, "ok", "forward"),
        (ENABLED, ENV_26, "580.142", True, "ok", "forward"),
        (AGENT_OK, ENV_26, "580.142", True, "ok", "forward"),
        # eugr#266's refusal: fails before vllm serve, whatever the agent's line says
        (REFUSED + "sparkcluster agent: _CUDA_COMPAT_STATUS=\n", ENV_266, "580.159.03", True, "fail", "refused"),
        (MINOR, ENV_26, "580.142", True, "warn", "minor"),
        # the image's own branch or newer: nothing printed, nothing needed
        ("", ENV_26, "595.58.03", True, "ok", "native"),
        # older driver, nothing printed: the start-up did not switch (an entrypoint emptied, or not NGC's)
        ("sparkcluster agent: _CUDA_COMPAT_STATUS=\n", ENV_26, "580.142", True, "warn", "silent"),
        ("", ENV_26, "580.142", False, "warn", "bypassed"),
    ],
)
def test_judge_boot_cases(output, env, driver, kept, status, case):
    v = image_nccl.judge_boot(image_nccl.read_boot(output), env, driver, kept)
    assert (v.status, v.case) == (status, case), v


def test_the_refusal_names_the_driver_the_image_needs_and_its_source():
    boot = image_nccl.read_boot("some line\n" + REFUSED + "       [[CUDA Driver UNAVAILABLE]]\nray start\n")
    assert boot.built_for == "590.48"
    v = image_nccl.judge_boot(boot, ENV_266, "580.159.03")
    assert "built for NVIDIA Driver Release 590.48 or later" in v.detail and "580.159.03" in v.detail
    assert "eugr/spark-vllm-docker#266" in v.detail
    assert "590 branch or later" in v.fix and "CUDA 13.x" in v.fix and "nvidia/cuda" in v.fix
    assert "update" not in v.fix  # no driver package is promised: the image is what the owner changes


def test_the_agents_last_line_is_this_boots():
    out = "sparkcluster agent: _CUDA_COMPAT_STATUS=\n" + AGENT_OK
    assert image_nccl.read_boot(out).compat == "CUDA Driver OK"
    assert image_nccl.read_boot("no agent yet").compat is None
