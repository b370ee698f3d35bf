"""The recent past from the cluster's Prometheus, for reports (`status --html`): tokens per second
per deployment and headroom above the memory floor per node, as (t, value) points. Asked with
`promtool query range` inside the Prometheus container (over the head's Docker API), so it works
wherever `monitor up` runs, Prometheus listening on the cluster's addresses only."""

from __future__ import annotations

import json
import time

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


def charts(
    api, inv: Inventory, seconds: float = 3600.0, now: float | None = None
) -> dict[str, list[tuple[float, float]]]:
    """Every chart's points over the last `seconds`; {} where Prometheus does not run."""
    if not stack.running(api, inv, stack.PROMETHEUS):
        return {}
    end = time.time() if now is None else now
    url = f"http://{scrape.reach_ip(inv, inv.head.name)}:{inv.monitor.prometheus_port}"
    step = f"{max(inv.monitor.scrape_interval_s, seconds / 240):g}s"
    out: dict[str, list[tuple[float, float]]] = {}
    for title, (label, expr) in queries(inv).items():
        argv = ["/bin/promtool", "query", "range", "-o", "json", f"--start={end - seconds:.0f}", f"--end={end:.0f}"]
        res = stack.exec_in(api, inv, stack.PROMETHEUS, [*argv, f"--step={step}", url, expr])
        if res.ok:
            out.update(parse(title, label, res.stdout))
    return out
