"""Preflight checks: pure functions from the facts of all hosts to one result per node.

Each check has a stable id (used by `doctor --json` and by `up`'s preflight) and records its
results in a `Report` that stamps them with that id. A check reports only on the nodes it can
judge; `run_checks` marks the rest SKIP. Every WARN or FAIL has a one-line cause (`detail`) and a
one-line `fix`.

`registry` holds what every check is made of (Result, Expect, Context, Report, the `check` decorator
and REGISTRY); this package runs them; the checks themselves live in one module per area:
`host` (ssh, GPU, docker, memory, disk, clock), `image`, `network` (net.*), `wiring` (net.topology
across N nodes), `rdma` and `runtime` (ports, stale Ray, running containers), `drift` (what changes
on one node: kernel, BIOS, HCA links, clocks, earlyoom, the image's NCCL and the driver it needs;
issue 39). CHECK_ORDER fixes the order they run and report in.
"""

from __future__ import annotations

# Importing an area registers its checks in REGISTRY (checks.registry, which imports no area).
from sparkcluster.checks import account, cluster_image, drift, host, network, rdma, rendezvous, runtime, wiring
from sparkcluster.checks.registry import REGISTRY, Context, Expect, GiB, Result

AREAS = (host, account, cluster_image, network, wiring, rdma, runtime, rendezvous, drift)

# The stable order checks run and report in (`doctor`, `doctor --json`, `up`'s preflight).
CHECK_ORDER = (
    "ssh.reachable",
    "gpu.gb10",
    "gpu.driver",
    "gpu.clocks",
    "host.kernel",
    "host.bios",
    "host.versions",
    "account.docker",
    "docker.engine",
    "docker.gpu_runtime",
    "account.hf_cache",
    "account.lock",
    "image.same",
    "image.base-same",
    "image.ray",
    "image.nccl",
    "image.driver",
    "image.cuda_cache",
    "net.control_ip",
    "net.vllm_host_ip",
    "net.link",
    "net.mtu",
    "net.path_mtu",
    "net.twins",
    "rdma.gid",
    "net.speed",
    "net.peer",
    "net.default_route",
    "net.topology",
    "net.crossing",
    "rdma.hca",
    "rdma.pcie",
    "rdma.firmware",
    "rdma.aer",
    "nccl.topology_env",
    "mem.fit",
    "mem.size",
    "mem.headroom",
    "mem.earlyoom",
    "mem.earlyoom_args",
    "mem.sshd_oom",
    "ports.free",
    "ray.stale",
    "net.rendezvous",
    "disk.free",
    "clock.skew",
    "containers.forwarded_env",
    "containers.per_host_env",
    "containers.flags",
)
if sorted(cid for cid, _, _ in REGISTRY) != sorted(CHECK_ORDER):
    raise ImportError("sparkcluster.checks: CHECK_ORDER and the registered checks differ")
REGISTRY.sort(key=lambda entry: CHECK_ORDER.index(entry[0]))


# --- running them -------------------------------------------------------------------------------


def run_checks(ctx: Context, only: set[str] | None = None) -> list[Result]:
    results = []
    names = [n.name for n in ctx.inventory.nodes]
    for cid, _title, fn in REGISTRY:
        if only is not None and cid not in only:
            continue
        got = {r.node: r for r in fn(ctx)}
        for n in names:
            results.append(got.get(n) or Result(cid, n, "skip", "unreachable" if n in ctx.unreachable else ""))
    return results


def titles() -> dict[str, str]:
    return {cid: title for cid, title, _ in REGISTRY}


__all__ = ["Result", "Expect", "Context", "GiB", "REGISTRY", "run_checks", "titles"]
