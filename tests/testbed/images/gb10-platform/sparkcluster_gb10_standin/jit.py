"""The first kernel's JIT, as a GB10 at an older driver meets it (a testbed test double; see the package
docstring).

On a Spark at DGX OS's 580 driver, an NGC image built for a newer branch initialises CUDA either way
(580 serves CUDA 13.0, minor version compatibility), and fails only at the first kernel its newer
toolchain left as PTX, which the old driver cannot JIT-compile: FlashInfer's autotune in the warm-up
(`torch.AcceleratorError: CUDA error: the provided PTX was compiled with an unsupported toolchain`,
gyliu513/langX101 PR #409, nvcr.io/nvidia/vllm:26.08-py3 on 580.173.02 with the entrypoint bypassed;
the same error from FA2's PTX, vllm-project/vllm#47397). With the image's start-up run, the process
loads the image's own user-mode driver (compat/lib.real) and the JIT succeeds.

Here: libcuda.so.1 is loaded by soname, so the dynamic loader chooses as on a Spark (LD_LIBRARY_PATH,
then ld.so.cache); the file it mapped says which driver this process got. The kernel driver's version
comes from nvidia-smi (the testbed's stand-in, per host), never from the engine's own environment.
"""

from __future__ import annotations

import ctypes
import os
import subprocess

PTX_ERROR = "CUDA error: the provided PTX was compiled with an unsupported toolchain."
_done = False


def _kernel_driver() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.strip().splitlines()[0] if out.strip() else ""


def _mapped_libcuda() -> str:
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            if path.endswith("/libcuda.so.1") or "/libcuda.so." in path:
                return os.path.realpath(path)
    return ""


def first_kernel() -> None:
    """Once per process: raise the PTX toolchain error where this process got the host's driver while
    the image was built for a newer branch than the kernel driver's."""
    global _done
    if _done:
        return
    _done = True
    kmd, built_for = _kernel_driver(), os.environ.get("CUDA_DRIVER_VERSION", "")
    if not kmd or not built_for:  # no GPU in this container (nvidia-smi absent), or not an NGC image
        return
    lib = ctypes.CDLL("libcuda.so.1")  # by soname: the loader decides, as on a Spark
    kind = ctypes.c_char_p
    lib.sparkcluster_standin_libcuda.restype = kind
    got = (lib.sparkcluster_standin_libcuda() or b"").decode()
    if got == "host" and int(kmd.split(".")[0]) < int(built_for.split(".")[0]):
        error = getattr(__import__("torch"), "AcceleratorError", RuntimeError)
        raise error(
            f"{PTX_ERROR}\nCUDA kernel errors might be asynchronously reported at some other API call, so the "
            f"stacktrace below might be incorrect.\n(testbed: libcuda.so.1 loaded from {_mapped_libcuda()}, "
            f"the kernel driver's {kmd}; the image was built for {built_for})"
        )
