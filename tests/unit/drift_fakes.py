"""A healthy Spark's drift facts (issue 39) and one break per drift check, for test_checks' cases.

Where the text is real output it comes from tests/captured (sources in its README); the rest is in
the documented shape of its source, said beside each (no GB10 was at hand to capture them).
"""

from __future__ import annotations

import dataclasses

from conftest import LINKS, cap

from sparkcluster.facts import image_nccl, parsers

# kernels as the public reports print them (MiaAI-Lab GLM-5.3-Flash-EXL3-2x-DGX-Sparks#47: 6.17.0-1031-nvidia;
# MiaAI-Lab DeepSeek-v4.1-Flash-DGX-Sparks#23 and DeepSeek-v4-Flash-DSpark-2x-DGX-Spark#259: 7.0.0-1019-nvidia)
KERNEL_GOOD = "6.17.0-1031-nvidia"
KERNEL_KHO = "7.0.0-1019-nvidia"
# documented shape: Linux Documentation/ABI/testing/sysfs-bus-pci (current_link_speed "32.0 GT/s PCIe",
# current_link_width a lane count); firmware as ibstat prints it on a GB10 (geerlingguy/sbc-reviews#92)
FW = "28.45.4028"


def hca_link_text(width: int = 4, only: str | None = None, fw: str = FW) -> str:
    """What the hca_link probe prints for the pair's HCAs: every link x4 at Gen5, or `only` at `width`."""
    lines = []
    for _, hca, _ in LINKS:
        w = width if only in (None, hca) else 4
        lines.append(f"{hca}|{w}|32.0 GT/s PCIe|4|32.0 GT/s PCIe|{fw}\n")
    return "".join(lines)


def hca_aer_text(fatal: int = 0, nonfatal: int = 0, only: str | None = None) -> str:
    """What the hca_aer probe prints for the pair's HCAs (documented shape: the TOTAL_ERR_* lines of
    aer_dev_correctable/fatal/nonfatal, Linux Documentation/ABI/testing/sysfs-bus-pci-devices-aer_stats;
    GB10's CX7 functions at 0000:01:00.0-1 and 0002:01:00.0-1, its root ports 0000:00:00.0 and
    0002:00:00.0 as MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark#146's kernel log names them)."""
    lines = []
    for _, hca, _ in LINKS:
        dom = "0002" if hca.startswith("roceP2") else "0000"
        fn = hca[-1]
        f, nf = (fatal, nonfatal) if only in (None, hca) else (0, 0)
        dev = f"/sys/devices/platform/{dom}/pci{dom}:00/{dom}:00:00.0/{dom}:01:00.{fn}"
        lines.append(f"{hca}|function|{dev}|0|{f}|{nf}\n")
        lines.append(f"{hca}|port|{dev.rsplit('/', 1)[0]}|0|0|0\n")
    return "".join(lines)


def ngc_env() -> dict[str, str]:
    """The CUDA part of an NGC image's environment (real: nvcr.io/nvidia/pytorch:25.10-py3, arm64)."""
    return dict(x.split("=", 1) for x in cap("ngc-pytorch-25.10-arm64-env.txt").splitlines() if "=" in x)


def healthy_image_nccl(image_id: str) -> image_nccl.ImageNccl:
    """The pip NCCL 2.30.4 wheel (the build vllm#52504 and vllm#40969 found free of 2.28.9's CUDA-graph
    hang) in an NGC image, built for the 580 driver (the real NGC 25.10 environment's CUDA lines)."""
    env = ngc_env()
    return image_nccl.parse(
        f"id {image_id}\npip 2.30.4\ncuda {env['CUDA_VERSION']}\n"
        f"driver {env['CUDA_DRIVER_VERSION']}\nrequire {env['NVIDIA_REQUIRE_CUDA']}\n"
    )


def healthy_traits() -> parsers.Traits:
    cma = parsers.meminfo_kib("CmaTotal:              0 kB\nCmaFree:               0 kB\nSwapTotal:      16777212 kB\n")
    return parsers.Traits(
        kernel=KERNEL_GOOD,
        cma_total_kb=cma["CmaTotal"],
        cma_free_kb=cma["CmaFree"],
        swap_total_kb=cma["SwapTotal"],
        # documented shape: SMBIOS type 0 as /sys/class/dmi/id shows it (bios_date MM/DD/YYYY)
        bios_vendor="NVIDIA",
        bios_version="5.36_0ACUM018",
        bios_date=parsers.dmi_date("05/12/2026"),
        hca_links=parsers.hca_link_lines(hca_link_text()),
        hca_aer=parsers.hca_aer_lines(hca_aer_text()),
        # real: nvidia-smi on an H100 (tests/captured/h100-nvidia-smi-clocks.csv): idle, the GpuIdle reason only
        gpu_clocks=parsers.gpu_clocks_csv(cap("h100-nvidia-smi-clocks.csv")),
        # sparkrun's thresholds (spark-arena/sparkrun#77) as /proc/PID/cmdline reads with its NULs made spaces
        earlyoom=parsers.earlyoom_args("earlyoom -m 2 -s 80 --prefer (^|/)(vllm|ray)$ --avoid (^|/)(sshd|dockerd)$ "),
        dgx_os="7.2.3",
        toolkit=parsers.toolkit_version("NVIDIA Container Toolkit CLI version 1.17.8\ncommit: 1b8f2a1\n"),
    )


# --- one break per drift check (test_checks.CASES) ------------------------------------------------


def kernel_7_kho(s):
    s.facts["spark-worker"].traits.kernel = KERNEL_KHO
    tell = parsers.meminfo_kib(cap("gb10-meminfo-cma-kho.txt"))  # real: CmaTotal 0, CmaFree 940604 kB
    s.facts["spark-worker"].traits.cma_total_kb = tell["CmaTotal"]
    s.facts["spark-worker"].traits.cma_free_kb = tell["CmaFree"]


def kernel_differs(s):
    s.facts["spark-worker"].traits.kernel = "6.17.0-1032-nvidia"


def bios_before_2026_04(s):
    s.facts["spark-worker"].traits.bios_date = parsers.dmi_date("01/20/2026")


def bios_differs(s):
    s.facts["spark-worker"].traits.bios_version = "5.36_0ACUM020"


def docker_differs(s):
    d = s.facts["spark-worker"].docker
    s.facts["spark-worker"].docker = parsers.DockerInfo(
        "29.0.1", d.root_dir, d.runtimes, d.default_runtime, d.driver_status
    )


def hca_at_x2(s):
    hca = LINKS[-1][1]
    s.facts["spark-worker"].traits.hca_links = parsers.hca_link_lines(hca_link_text(width=2, only=hca))


def firmware_differs(s):
    s.facts["spark-worker"].traits.hca_links = parsers.hca_link_lines(hca_link_text(fw="28.43.1014"))


def aer_fatal(s):
    s.facts["spark-worker"].traits.hca_aer = parsers.hca_aer_lines(hca_aer_text(fatal=1, only=LINKS[0][1]))


def aer_nonfatal(s):
    s.facts["spark-worker"].traits.hca_aer = parsers.hca_aer_lines(hca_aer_text(nonfatal=2))


def gpu_thermal_slowdown(s):
    # the captured line with HwThermalSlowdown (0x40) and SwThermalSlowdown (0x20) active besides GpuIdle
    line = cap("h100-nvidia-smi-clocks.csv").replace("0x0000000000000001", "0x0000000000000061")
    s.facts["spark-worker"].traits.gpu_clocks = parsers.gpu_clocks_csv(line)


def earlyoom_defaults(s):
    s.facts["spark-worker"].traits.earlyoom = parsers.earlyoom_args("earlyoom -r 3600 ")


def image_nccl_pip_2_28_9(s):
    # the pip wheel's METADATA version, read in the image (the fact's shape: facts/image_nccl.py)
    f = s.facts["spark-worker"]
    f.image_nccl = dataclasses.replace(f.image_nccl, version="2.28.9", build="pip")


def image_built_for_590(s):
    # the worker's copy of the image says it was built for driver 590 (eugr/spark-vllm-docker#266: "built
    # for NVIDIA Driver Release 590.48 or later"; the entrypoint prints CUDA_DRIVER_VERSION less its last part)
    f = s.facts["spark-worker"]
    f.image_nccl = dataclasses.replace(f.image_nccl, cuda_driver="590.48.01")


def image_turns_jit_cache_off(s):
    # the worker's copy of the image sets CUDA_CACHE_DISABLE=1 (CUDA Programming Guide, "CUDA Environment
    # Variables": 1 stops the driver adding to or reading its JIT cache)
    f = s.facts["spark-worker"]
    f.image_nccl = dataclasses.replace(f.image_nccl, cuda_cache_disable="1")


DRIFT_CASES = [
    # the same CUDA major on the 580 driver: compatibility mode, not failed (issue 51; test_image_driver.py)
    ("image.driver", "spark-worker", "warn", image_built_for_590, {}),
    ("image.nccl", "spark-worker", "warn", image_nccl_pip_2_28_9, {}),
    ("image.cuda_cache", "spark-worker", "warn", image_turns_jit_cache_off, {}),
    ("host.kernel", "spark-worker", "fail", kernel_7_kho, {}),
    ("host.kernel", "spark-worker", "warn", kernel_differs, {}),
    ("host.bios", "spark-worker", "warn", bios_before_2026_04, {}),
    ("host.bios", "spark-worker", "warn", bios_differs, {}),
    ("host.versions", "spark-worker", "warn", docker_differs, {}),
    ("rdma.pcie", "spark-worker", "warn", hca_at_x2, {}),
    ("rdma.firmware", "spark-worker", "warn", firmware_differs, {}),
    ("rdma.aer", "spark-worker", "fail", aer_fatal, {}),
    ("rdma.aer", "spark-worker", "warn", aer_nonfatal, {}),
    ("gpu.clocks", "spark-worker", "warn", gpu_thermal_slowdown, {}),
    ("mem.earlyoom_args", "spark-worker", "warn", earlyoom_defaults, {}),
]
