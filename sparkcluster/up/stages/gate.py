"""Preflight: facts gathered once per host in parallel, then every check over them (the doctor's
checks and the profile's lint, which runs before any connection). It runs before the plan exists,
because the plan is made from its facts; its steps are in the plan so the plan shows the whole run."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sparkcluster.checks import preflight
from sparkcluster.errors import StageError, StepFailure
from sparkcluster.steps.base import Step

if TYPE_CHECKING:
    from sparkcluster.config.inventory import Inventory
    from sparkcluster.config.profile import Profile
    from sparkcluster.remote.fanout import ConnectedHosts
    from sparkcluster.up.plan import Plan

STAGE = "preflight"
# checks that `up` itself repairs, so they do not block it: the image stage builds and sends the
# image, recreating the containers fixes their flags and variables
REPAIRED_BY_UP = {"image.same", "image.ray", "containers.forwarded_env", "containers.per_host_env", "containers.flags"}


def steps(plan: Plan) -> list[Step]:
    return [
        Step(
            STAGE,
            n.name,
            "facts",
            "facts and checks",
            "one read-only probe script, then path-MTU pings",
            # run before the plan (its facts make the plan): reported done, its facts read again here
            run=lambda r, node=n.name: r.facts[node],
        )
        for n in plan.inventory.nodes
    ]


def summary(done: list[tuple[Step, object]]) -> str:
    return f"facts and checks on {len(done)} nodes"


def check(cluster: ConnectedHosts, inv: Inventory, prof: Profile) -> preflight.PreflightReport:
    """Facts and checks on every host; any failure `up` cannot repair stops here, before a change."""
    report, _ = preflight.run(inv, prof, cluster=cluster)
    blocking = [r for r in report.failed if r.id not in REPAIRED_BY_UP]
    if blocking:
        raise StageError(STAGE, [StepFailure(r.node, r.id, r.detail, fix=r.fix) for r in blocking], blocking[0].fix)
    return report
