"""Connect, gather facts on every host in parallel, run the checks. Shared by doctor and up."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from sparkcluster import checks, facts
from sparkcluster.config import profile as profiles
from sparkcluster.config.images import image_ref
from sparkcluster.config.inventory import Inventory
from sparkcluster.container.spec import required_flags
from sparkcluster.facts import image_nccl, ray_seen
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
        image_disk_bytes=int(prof.image_disk_gb * checks.GiB),
        model_disk_bytes=int(prof.model_disk_gb * checks.GiB),
        vllm_version=prof.image.vllm_version,
        min_driver=prof.min_driver,
        container_flags=required_flags(prof.ulimit_stack),
        executor=prof.executor if len(inv.nodes) > 1 else "ray",
    )


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
    ctx = checks.Context(inv, hosts_facts, unreachable, expect)
    results = [
        # the connection's own fix names the cause (a closed port, a host key, a refused key ...),
        # as `status` prints it: the check's generic one is only for a failure without one
        replace(r, fix=fixes[r.node]) if r.id == "ssh.reachable" and r.status == "fail" and r.node in fixes else r
        for r in checks.run_checks(ctx, only)
    ]
    return PreflightReport(results, hosts_facts, unreachable), cluster
