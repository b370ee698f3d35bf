"""The replace stage (`up --replace`): take down, whole, each other deployment that shares a node
with this one and spans a node this one does not (a pair, when one of its nodes is wanted alone),
before anything of this deployment moves. Its containers on this deployment's own nodes would go in
the containers stage anyway; taken down here, none of it is left half-running on the other node."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sparkcluster.config.inventory import Inventory
from sparkcluster.deployment import teardown
from sparkcluster.deployment.deployments import Deployment
from sparkcluster.remote.fanout import ConnectedHosts
from sparkcluster.steps.base import Step, fail

if TYPE_CHECKING:
    from sparkcluster.up.execute import UpRun
    from sparkcluster.up.plan import Plan

STAGE = "replace"


@dataclass(frozen=True)
class Away:
    """Another deployment this run takes down first, with the inventory of its own nodes."""

    deployment: Deployment
    inventory: Inventory


def steps(plan: Plan) -> list[Step]:
    out = []
    for a in plan.away:
        d = a.deployment
        held = "; ".join(f"{n}: {', '.join(cs)}" for n, cs in sorted(d.containers.items())) or "its containers"
        out.append(
            Step(
                STAGE,
                a.inventory.head.name,
                f"down-{d.profile}",
                f"take down {d.describe()} first (it shares this deployment's nodes)",
                f"stop its vllm serve by PID, then remove {held}",
                run=lambda r, a=a: down(r, a),
            )
        )
    return out


def down(r: UpRun, a: Away) -> str:
    hosts = {n: r.reach[n] for n in a.deployment.nodes}
    # its own containers only: another deployment may share its nodes (issue 60)
    outcomes = teardown.down(ConnectedHosts(a.inventory, hosts), only_ids=a.deployment.ids or None)
    errors = [(n, e) for n, o in outcomes.items() for e in o.errors]
    if errors:
        node, why = errors[0]
        raise fail(
            STAGE,
            node,
            f"take down {a.deployment.describe()}",
            why,
            fix=f"sparkcluster down --profile {a.deployment.profile}, then sparkcluster up again",
        )
    return a.deployment.describe()


def summary(done: list[tuple[Step, object]]) -> str:
    return "took down " + "; ".join(str(v) for _, v in done) if done else ""
