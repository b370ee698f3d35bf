"""The stand-in platform's worker (a testbed test double; see the package docstring): vLLM's CPU worker
whose first kernel meets the JIT as a GB10 does (jit.py): at the profiling run, where vLLM on a Spark
runs its warm-up kernels (FlashInfer's autotune), in every rank."""

from vllm.v1.worker.cpu_worker import CPUWorker

from . import jit


class Gb10StandinWorker(CPUWorker):
    def determine_available_memory(self) -> int:
        jit.first_kernel()
        return super().determine_available_memory()

    def compile_or_warm_up_model(self):
        jit.first_kernel()
        return super().compile_or_warm_up_model()
