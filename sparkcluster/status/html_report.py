"""`status --html FILE`: the status of every deployment as one static HTML page a browser opens
offline (no script, no external asset): per deployment its state, problems, endpoint, serving
figures and supervisor; per node container, MemAvailable and headroom; the journal's last entries;
and, where monitoring runs, the last hour from Prometheus as inline SVG charts (tok/s per deployment,
headroom per node; a Prometheus younger than that gives its last minutes). Everything printed
passes through the masking of secrets, as every output does."""

from __future__ import annotations

import html
import math
import time
from typing import TYPE_CHECKING

from sparkcluster import redact
from sparkcluster.deployment import supervision
from sparkcluster.node import contract
from sparkcluster.status.status import ClusterStatus, supervisor_shown

if TYPE_CHECKING:
    from sparkcluster.monitor.history import History

CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #1d2330; background: #fafbfc; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 28px; }
.state { display: inline-block; padding: 2px 8px; border-radius: 4px; color: #fff; font-weight: 600; }
.healthy { background: #2e7d32; } .degraded { background: #ef6c00; } .down { background: #c62828; }
.unreachable { background: #6a1b9a; }
table { border-collapse: collapse; margin: 8px 0; } td, th { border: 1px solid #d0d7de; padding: 4px 10px; }
th { background: #eef1f4; text-align: left; } .problems li { color: #c62828; }
.chart { display: inline-block; margin: 8px 16px 8px 0; } .chart span { display: block; font-size: 12px; }
pre { background: #f0f2f4; padding: 8px; font-size: 12px; overflow-x: auto; }
"""


def _e(value) -> str:
    return html.escape(redact.mask(str(value)))


def sparkline_svg(points: list[tuple[float, float]], width: int = 320, height: int = 60) -> str:
    """An inline SVG polyline of (t, value) points, with its last value; '' when fewer than two."""
    pts = [(t, v) for t, v in points if not math.isnan(v)]
    if len(pts) < 2:
        return ""
    t0, t1 = pts[0][0], pts[-1][0]
    lo, hi = min(v for _, v in pts), max(v for _, v in pts)
    span_t, span_v = (t1 - t0) or 1.0, (hi - lo) or 1.0
    xy = " ".join(
        f"{(t - t0) / span_t * (width - 4) + 2:.1f},{height - 2 - (v - lo) / span_v * (height - 4):.1f}" for t, v in pts
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}">'
        f'<rect width="{width}" height="{height}" fill="#fff" stroke="#d0d7de"/>'
        f'<polyline fill="none" stroke="#1565c0" stroke-width="1.5" points="{xy}"/></svg>'
    )


def _table(rows: list[tuple[str, str]]) -> str:
    return "<table>" + "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows) + "</table>"


def _deployment(st: ClusterStatus) -> str:
    sup = st.supervisor or {}
    rec = contract.Supervised.of(st.supervisor)
    floor = (rec.policy or {}).get("memory_floor_gib") if rec and sup else None
    out = [f"<h2>{_e(st.deployment or st.cluster)} <span class='state {_e(st.state)}'>{_e(st.state)}</span></h2>"]
    if st.problems:
        out.append("<ul class='problems'>" + "".join(f"<li>{_e(p)}</li>" for p in st.problems) + "</ul>")
    figures = [(k.removeprefix("vllm:"), f"{v:g}") for k, v in sorted(st.metrics.items())]
    out.append(
        _table(
            [
                ("profile", st.profile or "-"),
                ("endpoint", st.endpoint or "-"),
                ("health", st.health if st.health is not None else "-"),
                ("models", ", ".join(st.models) or "-"),
                ("supervisor", supervisor_shown(sup) if sup else "none"),
                ("restarts in window", len(rec.restarts) if rec else 0),
                ("tok/s", "-" if rec is None or rec.tokens_per_s is None else f"{rec.tokens_per_s:.1f}"),
                *figures,
            ]
        )
    )
    head = "<tr><th>node</th><th>container</th><th>state</th><th>MemAvailable</th><th>headroom</th><th>Ray</th></tr>"
    rows = []
    for n in st.nodes:
        avail = n.mem_available_gib
        room = "-" if avail is None or floor is None else f"{avail - float(floor):.1f} GiB"
        rows.append(
            "<tr>"
            + "".join(
                f"<td>{_e(x)}</td>"
                for x in (
                    n.node,
                    n.container or "-",
                    n.state if n.reachable else f"unreachable: {n.error}",
                    "-" if avail is None else f"{avail:.1f} GiB",
                    room,
                    "-" if n.ray_alive is None else ("alive" if n.ray_alive else "not a member"),
                )
            )
            + "</tr>"
        )
    out.append(f"<table>{head}{''.join(rows)}</table>")
    if st.journal:
        out.append("<pre>" + "\n".join(_e(supervision.format_entry(e)) for e in st.journal[-15:]) + "</pre>")
    return "\n".join(out)


def _window(seconds: float) -> str:
    return "hour" if seconds == 3600 else (f"{seconds / 60:g} minutes" if seconds >= 120 else f"{seconds:g} s")


def render(sts: list[ClusterStatus], charts: History | None = None, now: float | None = None) -> str:
    """The page. `charts` (monitor/history): drawn where monitoring runs; where it has nothing to draw
    yet, the page says why."""
    when = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(now if now is not None else time.time()))
    cluster = sts[0].cluster if sts else "?"
    body = [f"<h1>sparkcluster: {_e(cluster)}</h1><p>status at {_e(when)}</p>"]
    if charts is not None:
        drawn = [(title, sparkline_svg(pts)) for title, pts in sorted(charts.points.items())]
        drawn = [(t, svg) for t, svg in drawn if svg]
        body.append(f"<h2>The last {_window(charts.window_s)} (Prometheus)</h2>")
        body += [f"<div class='chart'><span>{_e(t)}</span>{svg}</div>" for t, svg in drawn]
        if charts.note or not drawn:
            body.append(
                f"<p>{'no chart' if not drawn else 'note'}: {_e(charts.note or 'Prometheus gave no series')}</p>"
            )
    body += [_deployment(st) for st in sts]
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>sparkcluster: {_e(cluster)}</title><style>{CSS}</style></head><body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )
