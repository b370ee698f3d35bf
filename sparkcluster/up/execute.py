"""The executor: walks the plan's steps, stage by stage, and does nothing the plan does not list.

Steps with the same `parallel` key next to each other run at once, one thread per host (a host's
own steps keep their order); the others run one after another. Each step ends as one structured
`step` event (logger `sparkcluster.steps`) with the id the dry run printed and its outcome: `done`,
`skipped: <reason>` or `failed`. A step's failure ends its stage as a whole, naming the host, the
step, the command and its last lines.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, TypeVar

import docker.errors

from sparkcluster import log
from sparkcluster.errors import CommandFailed, SparkError, StageError, StepFailure
from sparkcluster.facts import HostFacts
from sparkcluster.remote.fanout import ConnectedHosts, run_each
from sparkcluster.up.plan import Plan
from sparkcluster.up.stages import STAGES
from sparkcluster.up.stages.base import Step

_log = log.get(__name__)
_steps_log = log.get(log.STEPS_LOGGER)
SKIPPED = object()
T = TypeVar("T")


class StageProgress:
    """What the user sees: each stage with its duration. Replaced by the CLI with a rich display."""

    def stage(self, name: str) -> None: ...
    def done(self, name: str, seconds: float, note: str = "") -> None: ...
    def info(self, text: str) -> None: ...
    def bytes(self, node: str, sent: int, total: int) -> None: ...


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


def event(step: Step, outcome: str, seconds: float | None = None) -> None:
    fields: dict[str, Any] = {"id": step.id, "stage": step.stage, "host": step.host, "outcome": outcome}
    if seconds is not None:
        fields["seconds"] = round(seconds, 3)
    _steps_log.info("step", **fields)


def record_before_plan(plan: Plan) -> None:
    """A stage that ran before the plan could exist (preflight: the plan is made from its facts) has
    its steps reported done as soon as there is a plan to report them against."""
    for s in plan.steps():
        if STAGES[s.stage].before_plan:
            event(s, "done")


def _as_stage_error(step: Step, e: BaseException) -> StageError | None:
    if isinstance(e, StageError):
        return e
    if isinstance(e, CommandFailed):
        r = e.result
        return StageError(step.stage, [StepFailure(step.host, step.what, e.reason, r.command, r.tail())])
    if isinstance(e, SparkError):  # e.g. the engine or the connection did not answer
        return StageError(step.stage, [StepFailure(step.host, step.what, e.message, fix=e.fix)], e.fix)
    if isinstance(e, docker.errors.APIError):  # the engine answered with an error
        return StageError(step.stage, [StepFailure(step.host, step.what, str(e))])
    return None  # a bug: the CLI logs its traceback


def run_step(r: UpRun, step: Step) -> Any:
    reason = step.skip(r) if step.skip else None
    if reason:
        event(step, f"skipped: {reason}")
        return SKIPPED
    t = time.monotonic()
    try:
        value = step.run(r)
    except BaseException as e:
        event(step, "failed", time.monotonic() - t)
        err = _as_stage_error(step, e)
        if err is None or err is e:
            raise
        raise err from e
    event(step, "done", time.monotonic() - t)
    return value


def _batches(steps: list[Step]) -> list[list[Step]]:
    out: list[list[Step]] = []
    for s in steps:
        if out and s.parallel and out[-1][0].parallel == s.parallel:
            out[-1].append(s)
        else:
            out.append([s])
    return out


def walk(r: UpRun, steps: list[Step]) -> list[tuple[Step, Any]]:
    done: list[tuple[Step, Any]] = []
    for batch in _batches(steps):
        if len(batch) == 1:
            values = {batch[0].id: run_step(r, batch[0])}
        else:
            # one thread per host; a host's own steps keep their order
            by_host: dict[str, list[Step]] = {}
            for s in batch:
                by_host.setdefault(s.host, []).append(s)
            got = run_each(by_host.items(), lambda steps: {s.id: run_step(r, s) for s in steps}).values_or_raise(
                r.stage
            )
            values = {i: v for per_host in got.values() for i, v in per_host.items()}
        done += [(s, values[s.id]) for s in batch if values[s.id] is not SKIPPED]
    return done


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
        done = walk(r, steps)
        r.seconds[stage.name] = time.monotonic() - t
        r.progress.done(stage.name, r.seconds[stage.name], stage.summary(done))
