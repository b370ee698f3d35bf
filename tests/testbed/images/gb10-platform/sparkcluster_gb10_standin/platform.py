"""The CPU platform with a Ray device key (see the package docstring: a testbed test double)."""

from vllm.platforms.cpu import CpuPlatform

CPU_WORKER = "vllm.v1.worker.cpu_worker.CPUWorker"


class Gb10StandinPlatform(CpuPlatform):
    # What the CUDA platform uses on a Spark: each rank asks Ray for one GPU.
    ray_device_key: str = "GPU"

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        return "sparkcluster_gb10_standin.communicator.Gb10StandinCommunicator"

    @classmethod
    def check_and_update_config(cls, vllm_config) -> None:
        super().check_and_update_config(vllm_config)
        # every rank's worker meets the first kernel's JIT as a GB10 does (jit.py)
        if vllm_config.parallel_config.worker_cls == CPU_WORKER:
            vllm_config.parallel_config.worker_cls = "sparkcluster_gb10_standin.worker.Gb10StandinWorker"
