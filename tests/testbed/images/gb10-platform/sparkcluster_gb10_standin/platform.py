"""The CPU platform with a Ray device key (see the package docstring: a testbed test double)."""

from vllm.platforms.cpu import CpuPlatform


class Gb10StandinPlatform(CpuPlatform):
    # What the CUDA platform uses on a Spark: each rank asks Ray for one GPU.
    ray_device_key: str = "GPU"

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        return "sparkcluster_gb10_standin.communicator.Gb10StandinCommunicator"
