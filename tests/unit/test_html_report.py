"""`status --html` (sparkcluster/status/html_report, monitor/history): the page from a status snapshot
and Prometheus' charts (promtool's `query range -o json` as Debian's promtool 2.42 prints it) is
well formed, masks secrets, draws a chart per series; and headless Chromium (Debian's package)
opens it and takes a screenshot, kept where SPARKCLUSTER_ARTIFACTS points."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from sparkcluster import redact
from sparkcluster.config import inventory
from sparkcluster.monitor import history
from sparkcluster.status import html_report
from sparkcluster.status.status import ClusterStatus, NodeStatus

INV = inventory.parse((Path(__file__).parent / "data" / "profile-cluster.toml").read_text())
# the shape Debian's promtool 2.42 prints for `query range -o json` (checked on this machine kind)
MATRIX = (
    '[{"metric":{"cluster":"pair","deployment":"big@spark-a+spark-b"},'
    '"values":[[1795601836,"10"],[1795601838,"12.5"],[1795601840,"NaN"],[1795601842,"11"]]}]'
)
SECRET = "sk-live-do-not-print-1234"


def statuses() -> list[ClusterStatus]:
    nodes = [
        NodeStatus(
            "spark-a", container="sparkcluster-pair-head", state="running", mem_available_gib=40.0, ray_alive=True
        ),
        NodeStatus("spark-b", reachable=False, error="ssh: timed out"),
    ]
    sup = {"state": "serving", "tokens_per_s": 42.0, "restarts": [1.0], "policy": {"memory_floor_gib": 6.0}}
    return [
        ClusterStatus(
            "pair", "degraded", nodes, profile="big", deployment="big@spark-a+spark-b",
            endpoint="http://192.168.100.10:8000", health=200, models=["m"], supervisor=sup,
            metrics={"vllm:num_requests_running": 2.0}, journal=[{"ts": 1.7e9, "event": "state: serving"}],
            problems=[f"spark-b: unreachable <b>{SECRET}</b>"],
        )
    ]  # fmt: skip


class Balance(HTMLParser):
    VOID = frozenset({"meta", "br", "rect", "polyline"})

    def __init__(self):
        super().__init__()
        self.stack, self.tags = [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.tags.append(tag)

    def handle_endtag(self, tag):
        if tag in self.VOID:
            return
        assert self.stack and self.stack.pop() == tag, (tag, self.stack)


def page() -> str:
    redact.register(SECRET)
    charts = history.parse("tok/s {}", "deployment", MATRIX) | history.parse("headroom GiB {}", "peer", "not json")
    return html_report.render(statuses(), history.History(charts, 3600.0), now=1.7e9)


class Promtool:
    """Prometheus' container as history.charts sees it: running, and promtool answering `query range`
    with `MATRIX`'s shape, holding samples from `since` on at the scrape interval."""

    def __init__(self, since: float, ok: bool = True):
        self.since, self.ok, self.asked = since, ok, []

    def __call__(self, api, inv, component, argv):
        from sparkcluster.remote.result import CommandResult

        opts = dict(a.removeprefix("--").split("=", 1) for a in argv if a.startswith("--"))
        self.asked.append(opts)
        start, end, step = float(opts["start"]), float(opts["end"]), float(opts["step"].removesuffix("s"))
        if not self.ok:
            return CommandResult("spark-a", "promtool", 1, "Error: bad_data: invalid parameter", "", 0.1)
        t, values = start, []
        while t <= end:
            if t >= self.since:
                values.append([t, "7"])
            t += step
        series = [{"metric": {"cluster": "pair", "deployment": "d", "peer": "spark-a"}, "values": values}]
        return CommandResult("spark-a", "promtool", 0, json.dumps(series), "", 0.1)


def test_a_young_prometheus_is_asked_at_its_scrape_interval_and_an_empty_one_is_said(monkeypatch):
    """Minutes after `monitor up` the hour's 15 s steps hold under two samples: the report asks again at
    the scrape interval over the last 240 scrapes, so it has charts; with nothing at all it says why."""
    monkeypatch.setattr(history.stack, "running", lambda api, inv, c: True)
    now, scrape_s = 1.8e9, INV.monitor.scrape_interval_s
    young = Promtool(since=now - 1.2 * scrape_s)  # one sample at the hour's 15 s steps, two at the scrape's
    monkeypatch.setattr(history.stack, "exec_in", young)
    got = history.charts(None, INV, now=now)
    assert got.drawable() and got.window_s == min(3600, 240 * scrape_s) and not got.note
    assert {a["step"] for a in young.asked} == {f"{max(scrape_s, 15):g}s", f"{scrape_s:g}s"}
    assert f"The last {html_report._window(got.window_s)} (Prometheus)" in html_report.render(statuses(), got)

    monkeypatch.setattr(history.stack, "exec_in", Promtool(since=now + 1))
    empty = history.charts(None, INV, now=now)
    assert not empty.drawable() and "no series has two samples yet" in empty.note
    assert "<p>no chart: no series has two samples yet" in html_report.render(statuses(), empty)

    monkeypatch.setattr(history.stack, "exec_in", Promtool(since=0, ok=False))
    assert history.charts(None, INV, now=now).note == "promtool query range failed: Error: bad_data: invalid parameter"
    monkeypatch.setattr(history.stack, "running", lambda api, inv, c: False)
    assert history.charts(None, INV, now=now) is None
    assert "Prometheus" not in html_report.render(statuses(), None)


def test_the_page_is_well_formed_masks_secrets_and_draws_the_charts():
    text = page()
    p = Balance()
    p.feed(text)
    assert not p.stack and p.tags.count("svg") == 1 and p.tags.count("polyline") == 1
    assert SECRET not in text and "&lt;b&gt;" in text  # masked, and markup in a problem is text
    assert "tok/s big@spark-a+spark-b" in text and "34.0 GiB" in text and "unreachable: ssh: timed out" in text
    assert history.parse("x {}", "deployment", MATRIX)["x big@spark-a+spark-b"][1] == (1795601838.0, 12.5)


def test_headless_chromium_renders_a_screenshot(tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed (Debian package chromium)")
    out_dir = Path(os.environ.get("SPARKCLUSTER_ARTIFACTS", tmp_path))
    out_dir.mkdir(parents=True, exist_ok=True)
    src, png = out_dir / "status.html", out_dir / "status-html.png"
    src.write_text(page())
    png.unlink(missing_ok=True)
    argv = [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        f"--user-data-dir={tmp_path / 'profile'}",
    ]
    p = subprocess.run(
        [*argv, "--window-size=1100,900", f"--screenshot={png}", src.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert png.is_file() and png.stat().st_size > 10_000, p.stdout + p.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_nan_points_draw_nothing_and_the_page_says_so():
    """A rate without two samples is NaN at every step: nothing to draw, and the page's line says why."""
    nan = history.History({"tok/s d": [(1.0, float("nan")), (2.0, float("nan"))]}, 3600.0)
    assert not nan.drawable()
    assert "<p>no chart: Prometheus gave no series</p>" in html_report.render(statuses(), nan)
