"""The executor: walks the plan's steps, stage by stage, and does nothing the plan does not list.

The walk itself (parallel batches, the `step` events, a failure as the stage's error) is the step
engine's (`steps/walk`), shared with `upgrade` and the gateway; here is `up`'s run and its stages'
order.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sparkcluster.facts import HostFacts
from sparkcluster.remote.fanout import ConnectedHosts
from sparkcluster.steps import walk
from sparkcluster.steps.walk import StageProgress
from sparkcluster.up.plan import Plan
from sparkcluster.up.stages import STAGES

T = TypeVar("T")


@dataclass
class UpRun:
    """What the steps of one `up` share while they run: the connections, the plan, and each stage's
    own state (what it created, started or read), kept by its type: the stage that writes a value
    owns its type (`put`), a later stage or the rollback reads it (`get`, or `find` when the stage
    may not have run)."""

    cluster: ConnectedHosts
    plan: Plan
    facts: dict[str, HostFacts]
    secrets: dict[str, str]
    progress: StageProgress
    seconds: dict[str, float] = field(default_factory=dict)
    stage: str = ""  # the stage being walked
    owned: dict[type, Any] = field(default_factory=dict, repr=False)  # each stage's state, by its type
    # every connected host, by name: replace, and up's wake token handed to the gateway
    reach: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def inv(self):
        return self.plan.inventory

    def put(self, value: T) -> T:
        self.owned[type(value)] = value
        return value

    def find(self, kind: type[T]) -> T | None:
        return self.owned.get(kind)

    def get(self, kind: type[T]) -> T:
        value = self.owned.get(kind)
        if value is None:  # a step ran before the one that writes it: a bug in a stage's order
            raise RuntimeError(f"{kind.__name__} asked for before its stage wrote it")
        return value


def record_before_plan(plan: Plan) -> None:
    """A stage that ran before the plan could exist (preflight: the plan is made from its facts) has
    its steps reported done as soon as there is a plan to report them against."""
    for s in plan.steps():
        if STAGES[s.stage].before_plan:
            walk.event(s, "done")  # one patch point for every step event: the walk's


def execute(r: UpRun) -> None:
    """Every stage that runs on the plan, in order; each prints its duration and what it did."""
    for stage in STAGES.values():
        if stage.before_plan:
            continue
        steps = [s for s in r.plan.steps() if s.stage == stage.name]
        if not steps and not stage.always_reported:
            continue
        r.stage = stage.name
        r.progress.stage(stage.name)
        t = time.monotonic()
        done = walk.walk(r, steps)
        r.seconds[stage.name] = time.monotonic() - t
        r.progress.done(stage.name, r.seconds[stage.name], stage.summary(done))
