"""Session fixtures. `testbed`: the two simulated Sparks (tests/testbed).

A healthy testbed that is already up (make testbed-up) is reused and left running; otherwise one is
built for the session and torn down at its end (only what this session built). Tests that need it
are marked `@pytest.mark.testbed`; they are skipped with the reason when this machine cannot host
the testbed (not root, no namespaces). Unit tests never touch it.
"""

from __future__ import annotations

import os
import signal

import pytest

from tests.testbed import use_profiles

# A suite started as a background job of a non-interactive shell inherits SIGINT ignored, and an
# ignored signal stays ignored across exec: the Ctrl-C tests (unit and integration) would then send a
# signal the CLI never sees. A handler here, in every pytest process (xdist's workers load this file
# too), is reset to the default in every child the tests start.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# The testbed's profiles do not ship with sparkcluster: the suite finds them as an owner finds a folder
# of their own, on $SPARKCLUSTER_PROFILES, in-process and in every CLI it starts.
use_profiles()


def _skip_reason() -> str | None:
    if os.environ.get("SPARKCLUSTER_SKIP_TESTBED"):
        return "SPARKCLUSTER_SKIP_TESTBED is set"
    from tests.testbed.testbed import preflight

    return preflight()


@pytest.fixture(scope="session")
def testbed(request):
    reason = _skip_reason()
    if reason:
        pytest.skip(f"testbed unavailable: {reason}")
    from tests.testbed.testbed import Testbed

    tb = Testbed()
    st = tb._state()
    if st and not tb.problems():
        tb.built_here = False
        tb.reset()  # a reused testbed starts with every knob at its default
    else:
        tb.up()  # refuses with a clear message if a broken testbed is in the way
    yield tb
    if tb.built_here and not os.environ.get("SPARKCLUSTER_KEEP_TESTBED"):
        tb.down()


# Modules that serve the `testbed` profile with the real engine and leave it serving for the next
# one run last, in this order, so each finds the cluster the previous one left and its `up` is a
# no-op (about 2 s against 40-50 s of engine start). Each still brings its own cluster up when run
# alone or in another order: the order saves time, it is never needed for a result. `test_mp` (the
# `testbed-mp` profile, issue 28) goes just before them: it ends with `down`, which `test_up` starts from.
SERVING_TAIL = (
    "tests.integration.test_mp",
    "tests.integration.test_up",
    "tests.integration.test_bench",
    "tests.integration.test_bench_against",
    # test_monitor's wedge is the supervisor's too (named by `status`, restarted): test_supervisor goes
    # on from its restart, on the same cluster, to the limit; its limit's closing `up` serves on
    "tests.integration.test_monitor",
    "tests.integration.test_supervisor",
    # issue 75's node health on what test_supervisor leaves serving (its `up` a no-op), the gateway its own
    "tests.integration.test_node_health",
    # issue 55: the guides' lines on what serves; then the supervisor's final states (the memory
    # floor, then `down` and a reboot: test_supervisor_final); then, with nothing serving, the
    # guides' `down` lines and `doctor --fabric` (refused while a server runs: test_guide_bare), and
    # test_fabric
    "tests.integration.test_guide",
    "tests.integration.test_supervisor_final",
    "tests.integration.test_guide_bare",
    "tests.integration.test_fabric",
)


def _module_rank(item) -> int:
    name = item.module.__name__ if item.module else ""
    return SERVING_TAIL.index(name) + 1 if name in SERVING_TAIL else 0


def pytest_collection_modifyitems(config, items):
    items.sort(key=_module_rank)  # stable: every other module keeps its place and its tests' order
    # a testbed test that forgot to ask for the fixture still gets the skip reason
    reason = None
    for item in items:
        if item.get_closest_marker("testbed") is not None:
            if reason is None:
                reason = _skip_reason() or ""
            if reason:
                item.add_marker(pytest.mark.skip(reason=f"testbed unavailable: {reason}"))


# The time per module (setup, call and teardown of its tests together), printed at the end of every
# run: tests/README.md's ledger of `make test`'s minutes is copied from a fresh clone's run of it
# (issue 57), so that the next suite knows what it may add.
_MODULE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report):
    module = report.nodeid.split("::", 1)[0]
    _MODULE_SECONDS[module] = _MODULE_SECONDS.get(module, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    if not _MODULE_SECONDS:
        return
    terminalreporter.section("time per module")
    total = sum(_MODULE_SECONDS.values())
    for module, seconds in sorted(_MODULE_SECONDS.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"{seconds / 60:7.2f} min  {module}")
    terminalreporter.write_line(f"{total / 60:7.2f} min  in all ({len(_MODULE_SECONDS)} modules)")
