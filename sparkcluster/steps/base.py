"""A step, the unit of both the plan and its execution, and a stage, what every stage of `up` is.

A step is data (a stable id `stage/host/action`, the host, what a person reads, the command or API
call it amounts to) plus the function that performs it. `make_plan` builds the list once; `--dry-run`
prints it, and the executor walks that same list, so what runs is what was printed. A step that
depends on what an earlier step did says in the plan what it will check (`when`), and its `skip`
function checks exactly that.

A stage is declared once, as a `Stage`: its name, its steps (what the plan prints and the executor
runs), a summary of what they did, and the state they leave for later stages and the rollback (a
type of its own per stage, kept in the run by `Run.put`). The registry (`up/stages/__init__`)
lists every stage as one; the plan and the executor read these fields and name no stage.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sparkcluster import redact
from sparkcluster.errors import StageError, StepFailure

if TYPE_CHECKING:
    from sparkcluster.steps.walk import Run


@dataclass(frozen=True)
class Step:
    stage: str
    host: str
    action: str  # stable within a plan: the last part of the id
    what: str  # what a person reads
    detail: str = ""  # the command or API call it amounts to (masked whenever shown)
    run: Callable[[Run], Any] | None = field(default=None, repr=False, compare=False)
    when: str = ""  # decided at run time: the condition checked just before running
    skip: Callable[[Run], str | None] | None = field(default=None, repr=False, compare=False)
    # consecutive steps with the same key run at once (one thread per host); "" runs alone
    parallel: str = ""

    @property
    def id(self) -> str:
        return f"{self.stage}/{self.host}/{self.action}"

    def runnable(self) -> Step:
        """The step itself, once it is known to carry its run: a step without one is never printed
        nor walked (what a dry run shows is what runs)."""
        if self.run is None:
            raise TypeError(f"step {self.id} has no run function: it can be neither printed nor walked")
        return self

    @property
    def description(self) -> str:
        text = self.what + (f" (only if {self.when})" if self.when else "")
        return redact.mask(text + (f": {self.detail}" if self.detail else ""))

    def public(self) -> dict[str, str]:
        """What `--dry-run --json` prints for this step."""
        self.runnable()
        return {"id": self.id, "stage": self.stage, "host": self.host, "description": self.description}


# where a plan's long lines wrap (a `docker run` or `vllm serve` runs to thousands of characters);
# `--json` keeps each step's description whole
PLAN_WIDTH = 100


def wrapped(text: str, indent: str, more: str = "  ", width: int = PLAN_WIDTH) -> list[str]:
    """`text` as lines of at most `width` columns where it has spaces to break at, the first after
    `indent`, the rest after `indent + more`; masked first, so that no secret is cut in two. Joining
    the lines' words with single spaces gives the text back (a word longer than a line stays whole)."""
    import textwrap

    lines = textwrap.wrap(
        redact.mask(text),
        width=width,
        initial_indent=indent,
        subsequent_indent=indent + more,
        break_long_words=False,
        break_on_hyphens=False,
    )
    return lines or [indent]


def render_steps(steps: list[Step], under: Callable[[Step], list[str]] = lambda s: []) -> list[str]:
    """The steps as the plans print them: grouped under `[stage]`, each with its condition and its
    command below it (wrapped at PLAN_WIDTH), then whatever `under` adds for it (unmasked: the
    caller masks the whole)."""
    lines, stage = [], None
    for s in steps:
        s.runnable()
        if s.stage != stage:
            stage = s.stage
            lines.append(f"[{stage}]")
        lines += wrapped(f"{s.host}: {s.what}", "  ", "    ")
        if s.when:
            lines += wrapped(f"only if {s.when}", "      ")
        if s.detail:
            lines += wrapped(s.detail, "      ")
        lines += under(s)
    return lines


def dry_run(steps: list[Step], as_json: bool, head: list[str] = ()) -> str:
    """What `--dry-run` prints for any command's steps: `head` (its title and notes) then the steps
    as the plans print them, or with `--json` the list of the steps' public fields (`up`'s shape,
    every command's). Masked."""
    if as_json:
        return redact.mask(json.dumps([s.public() for s in steps], indent=2))
    return redact.mask("\n".join([*head, *render_steps(steps)]))


def fail(
    stage: str, host: str, step: str, reason: str, command: str | None = None, tail: str = "", fix: str | None = None
) -> StageError:
    """A stage failure naming the host, the step, the command and its last lines."""
    return StageError(stage, [StepFailure(host, step, reason, command, tail, fix)], fix)


@dataclass(frozen=True)
class Stage:
    """The contract every stage of `up` keeps.

    `steps(plan)` is pure over the plan (no host touched): what `--dry-run` prints and the executor
    walks. `summary(done)` says in one line what the steps that ran did, from their return values.
    `leaves` names the types of the state its steps put in the run for later stages and the rollback
    (none when it leaves nothing). A stage whose steps run before the plan can exist
    (`before_plan`: preflight, whose facts the plan is made from) is reported done once there is a
    plan, never walked. A stage with nothing to do is left out of the progress unless
    `always_reported` (its "nothing to do" is news)."""

    name: str
    steps: Callable[[Any], list[Step]]  # over the plan of the command it belongs to (up's, upgrade's)
    summary: Callable[[list[tuple[Step, Any]]], str]
    leaves: tuple[type, ...] = ()
    before_plan: bool = False
    always_reported: bool = False
