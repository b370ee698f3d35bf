"""`down`'s walk: the plan's steps, in order, under the locks of the nodes they touch; what each node
ended as (`teardown.NodeTeardown`: the server stopped, what was removed, what failed)."""

from __future__ import annotations

from sparkcluster.deployment import teardown
from sparkcluster.remote.lock import NodeLocks
from sparkcluster.steps import walk
from sparkcluster.steps.walk import CommandRun, StageProgress

from .down_plan import STAGE, Plan


def execute(plan: Plan, progress: StageProgress | None = None) -> dict[str, teardown.NodeTeardown]:
    """Walk the plan's steps (exactly those `down --dry-run` prints), each node's outcomes merged."""
    r = CommandRun(stage=STAGE, progress=progress or StageProgress())
    with NodeLocks(plan.cluster, plan.full.only(plan.reachable), "down"):
        done = walk.walk(r, plan.steps())
    outcomes: dict[str, teardown.NodeTeardown] = {}
    for _, got in done:
        for n, o in got.items():
            if n not in outcomes:
                outcomes[n] = o
                continue
            outcomes[n].removed += o.removed
            outcomes[n].errors += o.errors
            outcomes[n].server = outcomes[n].server or o.server
    return outcomes
