"""Connect, gather facts on every host in parallel, run the checks. Shared by doctor and up."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, replace

from sparkcluster import checks, facts
from sparkcluster.config import profile as profiles
from sparkcluster.config import secrets
from sparkcluster.config.images import executor_of, image_ref
from sparkcluster.config.inventory import Inventory
from sparkcluster.container.spec import required_flags
from sparkcluster.errors import InputError
from sparkcluster.facts import image_nccl, model_listing, ray_seen
from sparkcluster.node import memory_fit
from sparkcluster.remote.fanout import ConnectedHosts, connect_reachable


def expectations(inv: Inventory, prof: profiles.Profile | None) -> checks.Expect:
    if prof is None:
        return checks.Expect()
    return checks.Expect(
        image=image_ref(inv, prof),
        base_image=prof.image.ref,
        forwarded_env=prof.forwarded_env(),
        per_host_env={n.name: profiles.per_host_env(prof, inv, n) for n in inv.nodes},
        gpu_memory_utilization=prof.serve.gpu_memory_utilization,
        on_demand=prof.on_demand.enabled,
        image_disk_bytes=int(prof.image_disk_gb * checks.GiB),
        model_disk_bytes=int(prof.model_disk_gb * checks.GiB),
        vllm_version=prof.image.vllm_version,
        min_driver=prof.min_driver,
        container_flags=required_flags(prof.ulimit_stack, prof.ulimit_nofile),
        executor=executor_of(len(inv.nodes), prof),
    )


def with_model_size(expect: checks.Expect, prof: profiles.Profile, listing: model_listing.Listing) -> checks.Expect:
    """The expectations with one rank's share of the listed weights and the KV cache of one
    max_model_len sequence (node/memory_fit), for mem.fit."""
    s = prof.serve
    tp, pp = s.tensor_parallel_size, s.pipeline_parallel_size
    return dataclasses.replace(
        expect,
        weights_per_rank=None if listing.weights is None else memory_fit.weights_per_rank(listing.weights, tp, pp),
        weights_source=(
            f"{memory_fit.gb(listing.weights)} of weights over TP {tp} x PP {pp}, from {listing.source}"
            if listing.weights is not None
            else listing.source
        ),
        kv_min=memory_fit.kv_min(listing.config, s.max_model_len, s.kv_cache_dtype or "auto", tp, pp),
    )


def hub_token(prof: profiles.Profile) -> str:
    """HF_TOKEN where the environment or the .env has it (a gated model's listing needs it); "" else."""
    try:
        return secrets.load_secrets(profile=prof, names=["HF_TOKEN"]).get("HF_TOKEN", "")
    except InputError:
        return ""


@dataclass
class PreflightReport:
    results: list[checks.Result]
    facts: dict[str, facts.HostFacts]
    unreachable: dict[str, str] = field(default_factory=dict)

    @property
    def failed(self) -> list[checks.Result]:
        return [r for r in self.results if r.status == "fail"]

    @property
    def ok(self) -> bool:
        return not self.failed


def gather_all(
    cluster: ConnectedHosts, inv: Inventory, image: str | None, base: str | None = None, ray: bool = True
) -> dict[str, facts.HostFacts]:
    """Facts of every connected host (phase 1), then path MTU probes (phase 2), both in parallel."""
    seen = ray_seen.load() if image else {}
    nccl_seen = image_nccl.load() if image else {}
    got = cluster.each(
        lambda h: facts.gather(h, inv, image, ray_seen=seen, base=base, ray=ray, nccl_seen=nccl_seen)
    ).values_or_raise("gather facts")
    if ray:
        ray_seen.remember({f.image_id: f.image_ray for f in got.values() if f.image_id and f.image_ray})
    image_nccl.remember([f.image_nccl for f in got.values() if f.image_nccl is not None])
    nodes = {n.name: n for n in inv.nodes}
    pings = cluster.each(lambda h: facts.gather_path_mtu(h, facts.path_mtu_probes(nodes[h.name], got)))
    for name, outcome in pings.items():
        if outcome.ok:
            got[name].path_mtu = outcome.value
        else:  # never dropped: net.path_mtu fails with it
            got[name].path_mtu_error = str(outcome.error)
    return got


def run(
    inv: Inventory, prof: profiles.Profile | None, only: set[str] | None = None, cluster: ConnectedHosts | None = None
) -> tuple[PreflightReport, ConnectedHosts | None]:
    """Checks over every node. Unreachable nodes become ssh.reachable FAIL rows, not exceptions.

    Returns the connected cluster too (None when no host was reachable) so `up` goes on with the
    same connections; the caller closes it.
    """
    expect = expectations(inv, prof)
    unreachable: dict[str, str] = {}
    fixes: dict[str, str] = {}
    if cluster is None:
        cluster, failed = connect_reachable(inv)
        unreachable = {name: err.message.removeprefix(f"{name}: ") for name, err in failed.items()}
        fixes = {name: err.fix for name, err in failed.items() if err.fix}
        if not cluster.hosts:
            cluster = None
    hosts_facts = gather_all(cluster, inv, expect.image, expect.base_image, expect.executor == "ray") if cluster else {}
    if prof is not None and cluster is not None and inv.head.name in cluster.hosts:
        expect = with_model_size(expect, prof, model_listing.read(cluster.head, inv, prof, hub_token(prof)))
    ctx = checks.Context(inv, hosts_facts, unreachable, expect)
    results = [
        # the connection's own fix names the cause (a closed port, a host key, a refused key ...),
        # as `status` prints it: the check's generic one is only for a failure without one
        replace(r, fix=fixes[r.node]) if r.id == "ssh.reachable" and r.status == "fail" and r.node in fixes else r
        for r in checks.run_checks(ctx, only)
    ]
    return PreflightReport(results, hosts_facts, unreachable), cluster
