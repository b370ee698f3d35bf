"""What `down` will do, as steps made from the deployments found on the nodes that answer.

`make` connects, reads what runs (deployment/deployments), chooses what `--node`/`--profile` name and
refuses where what runs cannot be read; then one step per deployment taken down (its own head's
server stopped first, then its containers, workers before the head), with every deployment one
more for whatever else carries sparkcluster's label (a killed run's leftovers, the gateway; Ray's
session state with --purge-gcs), and with --purge-caches one per node for its compile caches.
`--dry-run` prints these steps; `execute` walks the same ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sparkcluster import redact
from sparkcluster.config.inventory import Inventory
from sparkcluster.deployment import deployments, teardown
from sparkcluster.errors import SparkError
from sparkcluster.facts.access import learn_homes
from sparkcluster.remote.fanout import ConnectedHosts, connect_reachable, unreachable_error
from sparkcluster.steps.base import Step, render_steps

STAGE = "down"


@dataclass
class Plan:
    full: Inventory  # the whole inventory
    inventory: Inventory  # the nodes taken down (the whole one when nothing was chosen)
    cluster: ConnectedHosts  # the nodes that answered (closed with the plan)
    unreachable: dict[str, SparkError]
    nothing: str = ""  # "no deployment on X": nothing to take down, said as it is
    _steps: list[Step] = field(default_factory=list, repr=False)

    def steps(self) -> list[Step]:
        return list(self._steps)

    @property
    def touched(self) -> list[str]:
        """The nodes whose containers go (locked while the steps run)."""
        return [n.name for n in self.inventory.nodes]

    @property
    def reachable(self) -> list[str]:
        return [n for n in self.touched if n in self.cluster.hosts]

    def render(self) -> str:
        lines = [f"down on cluster '{self.full.cluster.name}':"]
        lines += [f"  note: {n}: unreachable, not cleaned: {e.message}" for n, e in sorted(self.unreachable.items())]
        return redact.mask("\n".join(lines + render_steps(self._steps)))

    def close(self) -> None:
        self.cluster.close()

    def __enter__(self) -> Plan:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _refuse_unknown(node: str | None, profile_name: str | None, chosen: list, unknown: dict[str, str]) -> None:
    """`down --node X` (or `--profile P`) where what runs cannot be read: never "no deployment"."""
    if node and node in unknown:
        raise SparkError(
            f"{node}: cannot tell what runs there, so nothing was taken down: {unknown[node]}",
            f"check that {node} answers (ssh, then `docker ps` there), then sparkcluster down --node {node}",
        )
    if profile_name and unknown and not chosen:
        names = ", ".join(f"{n} ({why})" for n, why in sorted(unknown.items()))
        raise SparkError(
            f"no deployment of '{profile_name}' on the nodes that answer; cannot read {names}",
            f"check those nodes, then sparkcluster down --profile {profile_name}",
        )


def make(
    full: Inventory, node: str | None, profile_name: str | None, purge_gcs: bool = False, purge_caches: bool = False
) -> Plan:
    """Connect to every node that answers and make the steps (the plan holds the connections)."""
    if node:
        full.node(node)  # an unknown name is an input error
    cluster, unreachable = connect_reachable(full)
    if not cluster.hosts:
        raise unreachable_error(unreachable)
    try:
        return _make(full, cluster, unreachable, node, profile_name, purge_gcs, purge_caches)
    except BaseException:
        cluster.close()
        raise


def _make(full, cluster, unreachable, node, profile_name, purge_gcs, purge_caches) -> Plan:
    found, unread = deployments.on(cluster, full)
    chosen = deployments.select(found, node, profile_name)
    everything = node is None and profile_name is None
    if not everything:
        _refuse_unknown(node, profile_name, chosen, {**{n: e.message for n, e in unreachable.items()}, **unread})
    names = sorted({x for d in chosen for x in d.nodes} | ({n.name for n in full.nodes} if everything else set()))
    inv = full.only(names) if names else full
    plan = Plan(full, inv, cluster, unreachable)
    if not names:
        plan.nothing = "no deployment " + " ".join(
            x for x in (f"on {node}" if node else "", f"of '{profile_name}'" if profile_name else "") if x
        )
        return plan
    plan._steps = [_deployment_step(full, d, cluster) for d in chosen]
    if everything:
        plan._steps.append(_leftovers_step(inv, cluster, purge_gcs))
    if purge_caches:
        plan._steps += [_caches_step(inv, n, cluster) for n in plan.reachable]
    return plan


def _deployment_step(full: Inventory, d, cluster: ConnectedHosts) -> Step:
    sub = d.inventory(full)
    names = "containers: " + ", ".join(x for n in d.nodes for x in d.containers.get(n, []))

    def run(r) -> dict[str, teardown.NodeTeardown]:
        hosts = {n: h for n, h in cluster.hosts.items() if n in d.nodes}
        # its own containers only: another deployment may share its nodes
        return teardown.down(ConnectedHosts(sub, hosts), only_ids=d.ids or None)

    return Step(
        STAGE,
        sub.head.name,
        f"deployment:{d.key}",
        f"stop vllm serve of {d.describe()} by its PID, then remove its containers (workers before the head)",
        names,
        run=run,
    )


def _leftovers_step(inv: Inventory, cluster: ConnectedHosts, purge_gcs: bool) -> Step:
    what = "remove whatever else carries sparkcluster's label on every node that answers (the gateway among them)"
    if purge_gcs:
        what += f", then Ray's session state, checking that port {inv.cluster.ray_port} is free"
    return Step(
        STAGE,
        inv.head.name,
        "leftovers",
        what,
        teardown.purge_gcs_command(inv.cluster.ray_port) if purge_gcs else "",
        run=lambda r: teardown.down(ConnectedHosts(inv, cluster.hosts), purge_gcs=purge_gcs, gateway=True),
    )


def _caches_step(inv: Inventory, node: str, cluster: ConnectedHosts) -> Step:
    def run(r) -> dict[str, teardown.NodeTeardown]:
        one = ConnectedHosts(inv.only([node]), {node: cluster.hosts[node]})
        learn_homes(one)
        out = {}
        for n, (removed, errors) in teardown.purge_caches(one).items():
            out[n] = teardown.NodeTeardown(n, removed=list(removed), errors=list(errors))
        return out

    return Step(
        STAGE,
        node,
        "compile-caches",
        "remove the compile caches (torch.compile, inductor, Triton, FlashInfer) once the containers are gone",
        run=run,
        parallel="compile-caches",
    )
