"""One tensor-parallel rank (runs inside a Ray actor; plain class, wrapped with ray.remote lazily).

A rank reports what vLLM/NCCL would see from its own process on its own node: its IP as vLLM's
get_ip() computes it, Ray's node IP, hostname, selected environment variables, and NCCL's
interface/HCA selection. `step` stands in for one forward pass (every rank runs each token).
"""

from __future__ import annotations

import os
import socket

VOCAB = (
    "spark",
    "tensor",
    "parallel",
    "ray",
    "node",
    "token",
    "cluster",
    "grace",
    "blackwell",
    "kernel",
    "rank",
    "socket",
    "cache",
    "batch",
    "model",
    "stream",
    "warm",
    "ready",
    "fast",
    "quiet",
)


def token_for(step: int, seed: int = 0) -> str:
    return VOCAB[(seed * 7 + step * 3) % len(VOCAB)]


class RankWorker:
    def __init__(self, rank: int, model: str):
        self.rank = rank
        self.model = model

    def probe(self, required: list[str]) -> dict:
        from vllm_standin import knobs as _knobs
        from vllm_standin.checks import reported_env
        from vllm_standin.nccl import collect_hcas, has_uverbs, nccl_report
        from vllm_standin.network_utils import get_ip, list_ifaces

        env = dict(os.environ)
        k = _knobs.load(env)
        node_ip, node_id = _ray_node()
        rep = nccl_report(
            env,
            list_ifaces(k["net_sysfs_dir"]),
            collect_hcas(k["ib_sysfs_dir"]),
            has_uverbs(k["uverbs_dir"]),
        )
        return {
            "rank": self.rank,
            "pid": os.getpid(),
            "hostname": socket.gethostname(),
            "ip": get_ip(env),
            "node_ip": node_ip,
            "node_id": node_id,
            "env": reported_env(env, required),
            "nccl": {"lines": rep.lines, "error": rep.error, "transport": rep.transport},
        }

    def step(self, step: int, seed: int = 0) -> str:
        return token_for(step, seed)

    def die(self) -> None:
        os._exit(1)


def _ray_node() -> tuple[str, str]:
    try:
        import ray

        return ray.util.get_node_ip_address(), ray.get_runtime_context().get_node_id()
    except Exception:  # not inside Ray (local executor)
        from vllm_standin.network_utils import get_ip

        return get_ip(), "local"
