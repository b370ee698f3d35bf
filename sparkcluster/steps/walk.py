"""The step engine's walk: a list of steps run in order, the run they share, and what the user sees.

Steps with the same `parallel` key next to each other run at once, one thread per host (a host's
own steps keep their order); the others run one after another. Each step ends as one structured
`step` event (logger `sparkcluster.steps`) with the id the dry run printed and its outcome: `done`,
`skipped: <reason>` or `failed`. A step's failure ends its stage as a whole, naming the host, the
step, the command and its last lines.

`up` (`up/execute.UpRun`, and `weights pull` with it) and `upgrade` (`upgrade.UpgradeRun`) each walk
their steps with it, and so does every other command that changes nodes (`down`, `gateway up|down`,
`monitor up|down`, `weights rm`, a service's `up`, `doctor --fabric`'s test), with a `CommandRun`
or a run of their own: the engine names none of them. Their runs keep the `Run` protocol below.
A step without its run function is never walked (nor printed: `steps/base`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import docker.errors

from sparkcluster import log
from sparkcluster.errors import CommandFailed, SparkError, StageError, StepFailure
from sparkcluster.remote.fanout import run_each
from sparkcluster.steps.base import Step

_steps_log = log.get(log.STEPS_LOGGER)
SKIPPED = object()
T = TypeVar("T")


class StageProgress:
    """What the user sees: each stage with its duration. Replaced by the CLI with a rich display."""

    def stage(self, name: str) -> None: ...
    def done(self, name: str, seconds: float, note: str = "") -> None: ...
    def info(self, text: str) -> None: ...
    def bytes(self, node: str, sent: int, total: int) -> None: ...


class Run(Protocol):
    """What a walk needs of the run its steps share: the stage being walked, the progress the user
    sees, and the state each step leaves, kept by its type (`put`; `find` when the step that writes
    it may not have run). `up`'s `UpRun` and `upgrade`'s `UpgradeRun` are both one."""

    stage: str
    progress: StageProgress
    owned: dict[type, Any]

    def put(self, value: T) -> T: ...
    def find(self, kind: type[T]) -> T | None: ...


@dataclass
class CommandRun:
    """The run of a command whose steps need nothing shared but what they leave one another (`down`,
    `gateway up|down`, `monitor up|down`): its steps close over their own context (the connections)."""

    stage: str = ""
    progress: StageProgress = field(default_factory=StageProgress)
    owned: dict[type, Any] = field(default_factory=dict, repr=False)

    def put(self, value: T) -> T:
        self.owned[type(value)] = value
        return value

    def find(self, kind: type[T]) -> T | None:
        return self.owned.get(kind)


def event(step: Step, outcome: str, seconds: float | None = None) -> None:
    fields: dict[str, Any] = {"id": step.id, "stage": step.stage, "host": step.host, "outcome": outcome}
    if seconds is not None:
        fields["seconds"] = round(seconds, 3)
    _steps_log.info("step", **fields)


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


def run_step(r: Run, step: Step) -> Any:
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


def walk(r: Run, steps: list[Step]) -> list[tuple[Step, Any]]:
    """Run the steps in order (consecutive steps of one `parallel` key at once), each once; what each
    returned, the skipped ones left out. A step without a run function is refused before any runs."""
    for s in steps:
        s.runnable()
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
