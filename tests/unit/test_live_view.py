"""`status --watch`'s full-screen view (sparkcluster/status/live), headless under Textual's pilot: a
sparkline of tok/s per deployment and of headroom per node that grows with each refresh, the
journal's last entries, a failing refresh that leaves the view up. The SVG it renders is written
where SPARKCLUSTER_ARTIFACTS points (the suite's artefacts), else to pytest's tmp dir."""

from __future__ import annotations

import asyncio
import itertools
import os
from pathlib import Path

import pytest

pytest.importorskip("textual", reason="Textual is not installed (pip install 'sparkcluster[watch]')")

from textual.widgets import Label, RichLog, Sparkline

from sparkcluster.status import live
from sparkcluster.status.status import ClusterStatus, NodeStatus


def snapshot(i: int) -> list[ClusterStatus]:
    nodes = [
        NodeStatus("spark-head", container="sparkcluster-testbed-head", state="running", mem_available_gib=20.0 - i),
        NodeStatus("spark-worker", container="w", state="running", mem_available_gib=30.0),
    ]
    sup = {"state": "serving", "tokens_per_s": 10.0 * i, "policy": {"memory_floor_gib": 6.0}}
    journal = [{"ts": 1.7e9 + k, "event": f"event {k}"} for k in range(i + 1)]
    return [
        ClusterStatus(
            "testbed", "healthy", nodes, profile="testbed", deployment="testbed@spark-head+spark-worker",
            supervisor=sup, journal=journal,
        )
    ]  # fmt: skip


def test_readings_give_tok_s_per_deployment_and_headroom_per_node():
    got = live.readings(snapshot(2))
    assert got["tok testbed@spark-head+spark-worker"][1] == 20.0
    assert got["mem spark-head"] == ("  spark-head  running  MemAvailable 18.0 GiB  headroom 12.0 GiB", 12.0)
    assert got["mem spark-worker"][1] == 24.0


def test_the_view_grows_its_sparklines_and_shows_the_journal_headless(tmp_path):
    counter = itertools.count(1)

    def collect():
        i = next(counter)
        if i == 3:
            raise OSError("a node does not answer")  # one failed refresh: the view stays up
        return snapshot(i)

    async def drive() -> str:
        app = live.LiveView(collect, interval=0.05)
        async with app.run_test(size=(140, 40)) as pilot:
            for _ in range(100):
                await pilot.pause(0.05)
                if app.refreshes >= 4:
                    break
            assert app.refreshes >= 4
            spark = app.query_one(f"#{live._id('mem spark-head')}-spark", Sparkline)
            data = list(spark.data)
            assert len(data) >= 4 and data[0] > data[-1]
            label = app.query_one(f"#{live._id('tok testbed@spark-head+spark-worker')}-label", Label)
            assert "HEALTHY" in str(label.render()) and "supervisor: serving" in str(label.render())
            assert len(app.query_one("#journal", RichLog).lines) >= 4
            return app.export_screenshot()

    svg = asyncio.run(drive())
    assert svg.startswith("<svg") and "spark-head" in svg
    out = Path(os.environ.get("SPARKCLUSTER_ARTIFACTS", tmp_path)) / "status-watch.svg"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(svg)


def test_a_refresh_that_ends_after_the_view_closed_is_dropped():
    """The worker's status round trip can end after `q` (or the pilot's exit) took the screen down;
    its result then arrives with no rows to update (CI met this as NoMatches failing the app)."""

    async def drive() -> live.LiveView:
        app = live.LiveView(lambda: snapshot(1), interval=100)
        async with app.run_test(size=(140, 40)) as pilot:
            await pilot.pause(0.05)
        return app

    app = asyncio.run(drive())
    seen = app.refreshes
    app.show(snapshot(2))
    assert app.refreshes == seen


def test_quitting_the_view_ends_the_watch_as_status_would_on_what_it_showed_last():
    """q on the full-screen view of an unreachable cluster exits 4, as a plain `status` does, not 0
    whatever the cluster was (Ctrl-C interrupts instead, 130: tests/unit/test_watch.py)."""
    unreachable = [ClusterStatus("testbed", "unreachable", [NodeStatus("spark-head", state="unreachable")])]

    async def drive():
        app = live.LiveView(lambda: unreachable, interval=0.05)
        async with app.run_test(size=(100, 30)) as pilot:
            for _ in range(100):
                await pilot.pause(0.05)
                if app.refreshes:
                    break
        return app.last

    assert asyncio.run(drive()) == unreachable

    import click

    from sparkcluster.cli import status_cmd

    with pytest.raises(click.exceptions.Exit) as e:
        status_cmd.watch_ended(asyncio.run(drive()))
    assert e.value.exit_code == 4
    status_cmd.watch_ended(None)  # quit before any answer: nothing to say
