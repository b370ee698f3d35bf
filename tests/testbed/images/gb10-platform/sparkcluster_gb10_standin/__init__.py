"""TEST DOUBLE for the GB10 platform, installed only in the testbed's stand-in of the NGC image.

On a Spark, vLLM's CUDA platform asks Ray for one "GPU" per rank, and Ray places rank 1 on the
worker because each node advertises one GPU. This machine has no GPU, and vLLM's CPU platform has
no Ray device key (`ValueError: current platform cpu does not support ray.`), so the real engine
would refuse the Ray executor. This plugin (entry point group `vllm.platform_plugins`) selects a
subclass of the CPU platform whose only change is that key: the real vLLM then runs TP=2 through
Ray across the two testbed hosts, each of which starts Ray with one "GPU" as on a Spark. Its worker
meets the first kernel's JIT as a GB10 at an older driver does (jit.py): every rank fails with the PTX
toolchain error where the image's start-up did not give it the image's own CUDA driver.
sparkcluster never knows it exists.
"""


def register() -> str | None:
    # Activate only where the CPU build of vLLM is installed (the testbed image).
    try:
        from vllm.platforms.cpu import CpuPlatform  # noqa: F401
    except Exception:  # pragma: no cover - no vLLM here
        return None
    return "sparkcluster_gb10_standin.platform.Gb10StandinPlatform"
