"""The supervisor's decision once a verdict is in (node/verdict.decide), on tables: a pure function
of the verdict, the bounds, the engine's start, its restarts and whether it served."""

from __future__ import annotations

import dataclasses

import pytest

from sparkcluster.config import bounds
from sparkcluster.node import contract
from sparkcluster.node.contract import FAILED, LIMIT, MEMORY, RESTARTING, Policy
from sparkcluster.node.verdict import Decision, decide

NOW = 10_000.0
P = Policy()  # max_restarts 3 in 3600 s, backoff 5 s doubled per restart of an engine that never served
OFF = Policy(act=False)

# (verdict, policy, first start, restarts before, served) -> decision
TABLE = [
    # supervision off: journalled, never acted on, whatever the verdict
    ("dead", OFF, False, [], True, Decision("watch")),
    ("memory", OFF, True, [], False, Decision("watch")),
    # out of memory stops for good: a restart would take the host down again
    ("memory", P, False, [], True, Decision("stop", MEMORY)),
    ("memory", P, True, [], False, Decision("stop", MEMORY)),
    # an engine that never started in this container is not restarted (its profile is wrong)
    ("dead", P, True, [], False, Decision("stop", FAILED)),
    ("not-ready", P, True, [], False, Decision("stop", FAILED)),
    # restarts, with the backoff: 5 s after a serving engine, doubled per restart in the window otherwise
    ("wedged", P, False, [], True, Decision("restart", RESTARTING, 5.0)),
    ("dead", P, False, [], False, Decision("restart", RESTARTING, 5.0)),
    ("dead", P, False, [NOW - 30], False, Decision("restart", RESTARTING, 10.0)),
    ("dead", P, False, [NOW - 30, NOW - 20], False, Decision("restart", RESTARTING, 20.0)),
    ("dead", P, False, [NOW - 30, NOW - 20], True, Decision("restart", RESTARTING, 5.0)),
    # the window spent: stopped, the state says the limit
    ("dead", P, False, [NOW - 30, NOW - 20, NOW - 10], True, Decision("stop", LIMIT)),
    # a restart older than the window does not count
    ("dead", P, False, [NOW - 4000, NOW - 20, NOW - 10], True, Decision("restart", RESTARTING, 5.0)),
    # no restarts allowed at all
    ("wedged", Policy(max_restarts=0), False, [], True, Decision("stop", LIMIT)),
    # a crash loop's backoff stops doubling at 60 s
    (
        "dead",
        Policy(max_restarts=10),
        False,
        [NOW - i for i in range(1, 8)],
        False,
        Decision("restart", RESTARTING, 60.0),
    ),
]


@pytest.mark.parametrize(("kind", "policy", "first", "restarts", "served", "want"), TABLE)
def test_decide(kind, policy, first, restarts, served, want):
    assert decide(kind, policy, first, list(restarts), NOW, served) == want


def test_decide_leaves_its_inputs_alone():
    restarts = [NOW - 30]
    decide("dead", P, False, restarts, NOW, False)
    assert restarts == [NOW - 30]


def test_the_bounds_defaults_are_written_once():
    """A profile's `[supervisor]` table starts from the agent's own defaults (contract.Policy), and
    what `up` hands the agent reads back as the same policy."""
    settings = bounds.SupervisorSettings()
    defaults = Policy()
    for f in dataclasses.fields(Policy):
        if f.name in bounds.SupervisorSettings.model_fields:
            assert getattr(settings, f.name) == getattr(defaults, f.name), f.name
    handed = bounds.policy(settings, defaults.ready_timeout_s)
    assert Policy.of(handed) == defaults


def test_a_policy_reads_json_as_its_types_and_ignores_what_it_does_not_know():
    got = Policy.of(
        {"stall_s": 30, "max_restarts": 5.0, "act": False, "a_newer_bound": 1, "memory_need_fraction": None}
    )
    assert got == Policy(stall_s=30.0, max_restarts=5, act=False)
    assert isinstance(got.stall_s, float) and isinstance(got.max_restarts, int)
    assert Policy.of(None) == Policy() and Policy.of(got.doc()) == got
    assert contract.Supervised.of({"policy": {"interval_s": 5.0}}).stale_after_s() == 3 * 5.0 + contract.LOOK_BLOCKS_S
