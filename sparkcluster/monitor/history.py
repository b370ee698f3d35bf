"""The recent past from the cluster's Prometheus, for reports (`status --html`): tokens per second
per deployment and headroom above the memory floor per node, as (t, value) points. Asked with
`promtool query range` inside the Prometheus container (over the head's Docker API), so it works
wherever `monitor up` runs, Prometheus listening on the cluster's addresses only."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field

from sparkcluster.config.inventory import Inventory
from sparkcluster.monitor import scrape, stack


def queries(inv: Inventory) -> dict[str, tuple[str, str]]:
    """title template (one label filled in) -> (label, PromQL)."""
    c = f'cluster="{inv.cluster.name}"'
    return {
        "tok/s {}": ("deployment", f"sum by (deployment) (rate(vllm:generation_tokens_total{{{c}}}[1m]))"),
        "headroom GiB {}": ("peer", f"sparkcluster_memory_headroom_bytes{{{c}}} / 1073741824"),
    }


def parse(title: str, label: str, text: str) -> dict[str, list[tuple[float, float]]]:
    """`promtool query range -o json` (a matrix) -> {title with the label's value: points}."""
    try:
        doc = json.loads(text)
    except ValueError:
        return {}
    out = {}
    for series in doc if isinstance(doc, list) else []:
        name = title.format((series.get("metric") or {}).get(label, "?"))
        out[name] = [(float(t), float(v)) for t, v in series.get("values") or []]
    return out


@dataclass
class History:
    """What Prometheus gave for the report: each chart's points, the window they cover, and (when no
    chart has two points) why, said on the page instead of leaving the charts out silently."""

    points: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    window_s: float = 0.0
    note: str = ""

    def drawable(self) -> bool:
        """A chart has two points to draw a line through (NaN, a rate without two samples, is none)."""
        return any(sum(1 for _t, v in p if not math.isnan(v)) >= 2 for p in self.points.values())


def _ask(api, inv: Inventory, url: str, end: float, seconds: float, step: float) -> tuple[dict, str]:
    out: dict[str, list[tuple[float, float]]] = {}
    failed = ""
    for title, (label, expr) in queries(inv).items():
        argv = ["/bin/promtool", "query", "range", "-o", "json", f"--start={end - seconds:.0f}", f"--end={end:.0f}"]
        res = stack.exec_in(api, inv, stack.PROMETHEUS, [*argv, f"--step={step:g}s", url, expr])
        if res.ok:
            out.update(parse(title, label, res.stdout))
        else:
            said = res.stdout.strip().splitlines()  # stdout and stderr together (dockerapi.run_in)
            failed = f"promtool query range failed: {said[-1] if said else f'exit {res.exit_code}'}"
    return out, failed


def charts(api, inv: Inventory, seconds: float = 3600.0, now: float | None = None) -> History | None:
    """Every chart's points over the last `seconds` (240 steps, none finer than a scrape); None where
    Prometheus does not run. A Prometheus younger than two of those steps is asked again at its
    scrape interval over its last 240 scrapes, so a report made minutes after `monitor up` has charts."""
    if not stack.running(api, inv, stack.PROMETHEUS):
        return None
    end = time.time() if now is None else now
    url = f"http://{scrape.reach_ip(inv, inv.head.name)}:{inv.monitor.prometheus_port}"
    scrape_s = inv.monitor.scrape_interval_s
    step = max(scrape_s, seconds / 240)
    points, failed = _ask(api, inv, url, end, seconds, step)
    got = History(points, seconds)
    if not got.drawable() and not failed and step > scrape_s:
        recent = min(seconds, 240 * scrape_s)
        points, failed = _ask(api, inv, url, end, recent, scrape_s)
        got = History(points, recent)
    if failed and got.drawable():
        got.note = failed  # one chart drawn, the other's query failed: said under the charts
    elif not got.drawable():
        got.note = failed or (
            f"no series has two samples yet in the last {got.window_s:g} s (scraped every {scrape_s:g} s): "
            "Prometheus started moments ago"
        )
    return got
