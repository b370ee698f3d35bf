"""The stage contract (`steps/base.Stage`) and its registry: every stage of `up` is declared
there once, with its steps, its summary and the state it leaves; the plan and the executor read the
declarations and name no stage."""

from __future__ import annotations

import ast
from pathlib import Path

from sparkcluster.steps.base import Stage
from sparkcluster.up import service_up, stages
from sparkcluster.up.stages import STAGES
from sparkcluster.upgrade import upgrade

UP = Path(stages.__file__).resolve().parent.parent


def test_every_stage_keeps_the_contract():
    for name, stage in STAGES.items():
        assert isinstance(stage, Stage) and stage.name == name
        assert callable(stage.steps) and callable(stage.summary)
        assert all(isinstance(t, type) for t in stage.leaves), name


def test_every_stage_module_is_in_the_registry():
    used = {
        x.__module__
        for s in STAGES.values()
        for x in (s.steps, s.summary, *s.leaves)
        if x.__module__.startswith("sparkcluster.up.stages.")
    }
    modules = {f"sparkcluster.up.stages.{p.stem}" for p in (UP / "stages").glob("*.py")} - {
        "sparkcluster.up.stages.__init__",
    }
    assert modules == used


def test_stages_that_run_before_the_plan_come_first():
    flags = [s.before_plan for s in STAGES.values()]
    assert flags == sorted(flags, reverse=True) and any(flags)


def _state_types_used() -> dict[str, set[str]]:
    """The class names each use of the run's state names: `r.put(X(...))`, `r.get(X)`, `r.find(X)`."""
    used: dict[str, set[str]] = {"put": set(), "read": set()}
    for p in [*UP.rglob("*.py"), Path(upgrade.__file__)]:  # up's stages, and upgrade's
        for n in ast.walk(ast.parse(p.read_text())):
            if not (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.args):
                continue
            if not (isinstance(n.func.value, ast.Name) and n.func.value.id == "r"):  # the run, by house name
                continue
            if n.func.attr == "put" and isinstance(n.args[0], ast.Call):
                f = n.args[0].func
                used["put"].add(f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "?"))
            elif n.func.attr in ("get", "find") and isinstance(n.args[0], (ast.Name, ast.Attribute)):
                a = n.args[0]
                name = a.attr if isinstance(a, ast.Attribute) else a.id
                used["read"].add(name)
    return used


def test_the_state_a_stage_leaves_is_declared():
    # up's stages, and upgrade's (several `up`s and the canary between them, walked the same way)
    declared = {t.__name__ for s in [*STAGES.values(), *upgrade.STAGES.values()] for t in s.leaves}
    # a service's `up` (up/service_up) walks steps of its own, whose state its module declares the same way
    declared |= {t.__name__ for t in service_up.LEAVES}
    used = _state_types_used()
    # `r.put(how(...))`: the serve stage puts what the supervisor was handed, returned by a call
    # (server.start's Record, or on demand server.standby's Standby), and
    # `r.put(canary_watch.after_serve(...))` the canary it kept
    assert used["put"] - {"how", "after_serve"} | {"Record", "Kept", "Standby"} == declared
    assert "how" in used["put"]
    assert {"Created", "Record"} <= used["read"] <= declared


def test_plan_and_execute_name_no_stage():
    for module in ("plan.py", "execute.py"):
        strings = {
            n.value
            for n in ast.walk(ast.parse((UP / module).read_text()))
            if isinstance(n, ast.Constant) and isinstance(n.value, str)
        }
        assert not strings & set(STAGES), module
