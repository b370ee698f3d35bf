"""The stages of `up`, one module each, in the order they run: the one registry of stages.

Each module holds its stage's steps (`steps(plan)`, what the plan prints) together with the mechanics
those steps run, so the two cannot drift; a `summary` of what its steps did; and the state its steps
leave for later ones, a type of its own kept in the run (`UpRun.put`, `UpRun.get`). Each is declared
here as a `Stage` (`steps/base`), the contract the plan and the executor read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sparkcluster.deployment import canary_watch, server
from sparkcluster.steps.base import Stage, Step
from sparkcluster.up.stages import (
    collective,
    containers,
    gate,
    image,
    image_chain,
    probe,
    ray,
    replace,
    serve,
    weights,
    weights_chain,
)

if TYPE_CHECKING:
    from sparkcluster.up.plan import Plan


def _image_steps(plan: Plan) -> list[Step]:
    """The build and one worker's send (`image`), or one save fed along a chain through several
    workers (`image_chain`, issue 27): each module gives its steps only when they apply."""
    return image.steps(plan) + image_chain.steps(plan)


# stage name -> its declaration, in the order the stages run
STAGES: dict[str, Stage] = {
    s.name: s
    for s in (
        Stage(gate.STAGE, gate.steps, gate.summary, before_plan=True),
        Stage(replace.STAGE, replace.steps, replace.summary),
        # reported even with nothing to do: "in place on every node" is news
        Stage(
            image.STAGE,
            _image_steps,
            image.summary,
            leaves=(image.HeadImage, image_chain.Chained),
            always_reported=True,
        ),
        Stage(weights.STAGE, weights.steps, weights.summary, leaves=(weights.Stagings, weights_chain.WeightsChained)),
        Stage(containers.STAGE, containers.steps, containers.summary, leaves=(containers.Created,)),
        Stage(ray.STAGE, ray.steps, ray.summary),
        Stage(collective.STAGE, collective.steps, collective.summary),
        Stage(probe.STAGE, probe.steps, probe.summary),
        Stage(serve.STAGE, serve.steps, serve.summary, leaves=(server.Record, server.Standby, canary_watch.Kept)),
    )
}
