"""The fabric stage: whenever `up` creates the containers of a deployment of several nodes, the
collective test of `doctor --fabric` runs in them (no server runs yet) before anything is served,
and a FAIL stops `up` there, naming the node and what to change. Kept containers add nothing: the
fabric was measured when they were made. `fabric_test = false` in the profile turns it off."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sparkcluster.errors import StageError, StepFailure
from sparkcluster.fabric import measure
from sparkcluster.steps.base import Step

if TYPE_CHECKING:
    from sparkcluster.up.execute import UpRun
    from sparkcluster.up.plan import Plan

STAGE = "fabric"


def steps(plan: Plan) -> list[Step]:
    inv = plan.inventory
    if not plan.containers or len(inv.nodes) < 2 or not plan.profile.fabric_test:
        return []
    f = inv.fabric
    return [
        Step(
            STAGE,
            inv.head.name,
            "test",
            f"measure the fabric between {len(inv.nodes)} nodes",
            f"all_gather, all_reduce up to {f.max_bytes >> 20} MiB and each direction, one rank per GPU in the "
            f"new containers (rendezvous {inv.head.control_ip}:{f.port}, within {f.timeout_s:g}s); a FAIL stops "
            "before vllm serve",
            run=run_test,
        )
    ]


def summary(done: list[tuple[Step, object]]) -> str:
    lines = [r.detail for _, results in done for r in results if r.id == "fabric.bandwidth"]
    return lines[0] if lines else "not run"


def run_test(r: UpRun) -> list:
    results = measure.run(r.cluster, r.inv, r.plan.profile, r.plan.image, r.plan.facts)
    bad = [x for x in results if x.status == "fail"]
    if bad:
        raise StageError(
            STAGE,
            [StepFailure(x.node, "measure the fabric", f"{x.id}: {x.detail}", None, "", x.fix) for x in bad],
            None,
        )
    for x in results:  # said before `vllm serve` starts (a slow GPU, a fabric below its healthy figure)
        if x.status == "warn":
            r.progress.info(f"warning: {x.id} on {x.node}: {x.detail}" + (f" (fix: {x.fix})" if x.fix else ""))
    return results
