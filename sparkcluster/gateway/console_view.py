"""The console's pages as HTML (gateway/console serves them): pure, from the snapshot the gateway
holds (its routes, each with its head agent's last report) and what the console read for the page.
Every value is escaped here; nothing a report, a journal or a log carries reaches the page as markup.

The engine's figures come from vLLM's own `/metrics` (Prometheus' text format): tokens generated
(`vllm:generation_tokens_total`), time to first token (`vllm:time_to_first_token_seconds`), the
inter-token latency (`vllm:inter_token_latency_seconds`), requests running and waiting
(`vllm:num_requests_running`, `vllm:num_requests_waiting`) and the KV cache's use
(`vllm:kv_cache_usage_perc`), as vLLM's documentation lists them ("Production Metrics",
https://docs.vllm.ai/en/v0.32.0/usage/metrics/) and node/readings and monitor/dashboards read them.
The alerts firing come from Prometheus' HTTP API (`GET /api/v1/alerts`, each alert's `labels`,
`annotations`, `state` and `activeAt`: https://prometheus.io/docs/prometheus/latest/querying/api/#alerts).
Standard library only (shipped into the gateway's container).
"""

from __future__ import annotations

import html
import json
import time
import urllib.parse
from dataclasses import dataclass, field

from ..node import contract

GENERATED = "vllm:generation_tokens_total"
TTFT = "vllm:time_to_first_token_seconds"
ITL = "vllm:inter_token_latency_seconds"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV = "vllm:kv_cache_usage_perc"
GIB = 1024**3


def esc(value) -> str:
    return html.escape("" if value is None else str(value), quote=True)


# -- the engine's figures
def samples(text: str) -> dict[str, float]:
    """Prometheus' text format summed by metric and suffix over every label set: the few series the
    console reads (`name`, `name_sum`, `name_count`); comments and unreadable lines skipped."""
    wanted = (GENERATED, TTFT, ITL, RUNNING, WAITING, KV)
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if not name.startswith(wanted):
            continue
        try:
            value = float(line.rsplit(" ", 1)[-1] if "}" not in line else line.rsplit("}", 1)[1].split()[0])
        except (ValueError, IndexError):
            continue
        out[name] = out.get(name, 0.0) + value
    return out


@dataclass
class Figures:
    """One deployment's engine figures between two reads of its `/metrics`."""

    tokens_per_s: float | None = None
    ttft_s: float | None = None  # mean over the interval
    itl_s: float | None = None
    running: float | None = None
    waiting: float | None = None
    kv_use: float | None = None  # 0..1
    read_at: float = 0.0
    error: str = ""


def _mean(now: dict, before: dict, name: str) -> float | None:
    count = now.get(f"{name}_count", 0.0) - before.get(f"{name}_count", 0.0)
    total = now.get(f"{name}_sum", 0.0) - before.get(f"{name}_sum", 0.0)
    return total / count if count > 0 else None


def figures(now: dict, before: dict | None, dt: float) -> Figures:
    """Pure: the figures from two reads `dt` seconds apart (the first read alone has no rates)."""
    f = Figures(running=now.get(RUNNING), waiting=now.get(WAITING), kv_use=now.get(KV))
    if before is not None and dt > 0:
        gen = now.get(GENERATED, 0.0) - before.get(GENERATED, 0.0)
        f.tokens_per_s = max(0.0, gen / dt)
        f.ttft_s, f.itl_s = _mean(now, before, TTFT), _mean(now, before, ITL)
    return f


def node_figures(text: str) -> dict:
    """The head agent's own `/metrics` (node/metrics): its GPUs' power, the last fabric test's bus
    bandwidth, floor and transport."""
    out: dict = {}
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name, _, value = line.rpartition(" ")
        metric = name.split("{", 1)[0]
        try:
            v = float(value)
        except ValueError:
            continue
        if metric == "sparkcluster_gpu_power_watts":
            out["power_w"] = out.get("power_w", 0.0) + v
        elif metric == "sparkcluster_fabric_busbw_gbps":
            out["busbw_gbps"] = v
        elif metric == "sparkcluster_fabric_floor_gbps":
            out["floor_gbps"] = v
        elif metric == "sparkcluster_fabric_transport_info" and 'transport="' in name:
            out["transport"] = name.split('transport="', 1)[1].split('"', 1)[0]
    return out


# -- the cluster's snapshot
@dataclass
class Row:
    """One deployment as the console shows it."""

    key: str
    names: tuple[str, ...]
    nodes: tuple[str, ...]
    in_rotation: bool
    reason: str
    in_flight: int
    on_demand: bool
    state: str = "unknown"
    since: float = 0.0
    verdict: str = ""  # the last verdict: kind
    cause: str = ""  # ... and its cause
    verdict_ts: float = 0.0
    tokens_per_s: float | None = None
    service: bool = False
    stopping: bool = False  # the supervisor is stopping its engine (a verdict, a stop asked)


@dataclass
class Node:
    name: str
    answered: bool
    mem_available: int | None = None
    mem_total: int | None = None
    ray_alive: bool | None = None
    seen_by: list[str] = field(default_factory=list)
    temperatures: list[dict] = field(default_factory=list)  # its CX7 and NVMe sensors (node/hwmon)


def rows(routes) -> list[Row]:
    """The gateway's routes (gateway/routes.Route, each with its head agent's last report)."""
    out = []
    for r in routes:
        report = r.report or {}
        sup = contract.Supervised.of(report.get("supervisor"))
        row = Row(
            r.key,
            tuple(r.names),
            tuple(r.nodes),
            r.up,
            r.reason,
            r.in_flight,
            r.wake_token is not None,
            service=bool(r.paths),
        )
        if sup is not None:
            row.state, row.since = sup.state or "unknown", sup.since
            row.verdict, row.cause = sup.newest.get("kind", ""), sup.last_cause
            row.verdict_ts = float(sup.newest.get("ts") or 0)
            row.tokens_per_s = sup.tokens_per_s
            row.stopping = sup.is_stopping()
        elif not r.report:
            row.state = "no answer"
        out.append(row)
    return out


def nodes(routes) -> list[Node]:
    """Every node a deployment runs on: its head's own figures, the others' as the head last read them."""
    found: dict[str, Node] = {}
    for r in routes:
        report = r.report or {}
        for n in r.nodes:
            found.setdefault(n, Node(n, False))
        if report.get("node"):
            n = found.setdefault(report["node"], Node(report["node"], False))
            n.answered, n.mem_available, n.mem_total = True, report.get("mem_available"), report.get("mem_total")
            n.ray_alive = report.get("ray_alive")
            n.temperatures = report.get("temperatures") or []
            n.seen_by.append(r.key)
        for name, peer in (report.get("peers") or {}).items():
            n = found.setdefault(name, Node(name, False))
            if isinstance(peer, dict) and not n.answered:
                n.answered, n.mem_available, n.mem_total = True, peer.get("mem_available"), peer.get("mem_total")
                n.ray_alive = peer.get("ray_alive")
                n.temperatures = peer.get("temperatures") or []
    return [found[k] for k in sorted(found)]


# -- HTML
def _gib(b) -> str:
    return f"{b / GIB:.1f} GiB" if isinstance(b, (int, float)) else "?"


def _ago(ts: float, now: float) -> str:
    if not ts:
        return ""
    s = max(0, int(now - ts))
    return f"{s}s ago" if s < 120 else f"{s // 60} min ago" if s < 7200 else f"{s // 3600} h ago"


def _query(**kw) -> str:
    return esc(urllib.parse.urlencode(kw))


def _num(v, fmt: str, unit: str = "") -> str:
    return "–" if v is None else f"{v:{fmt}}{unit}"


def page(title: str, body: str, who: str | None, csrf: str = "", admin: bool = False, live: str = "") -> str:
    """The whole page: the nav (by keyboard: a skip link first), the body, the sign-out form."""
    nav = ""
    if who is not None:
        links = [("/console", "Cluster"), ("/console/speed", "Speed"), ("/console/upgrades", "Upgrades")]
        links.append(("/console/usage", "Usage"))
        if admin:
            links.append(("/console/events", "Events"))
        links.append(("/console/print", "Printable"))
        items = "".join(f"<li><a href='{h}'>{esc(t)}</a></li>" for h, t in links)
        nav = (
            f"<nav aria-label='Console'><ul>{items}</ul>"
            f"<form method='post' action='/console/logout' class='signout'>"
            f"<input type='hidden' name='csrf' value='{esc(csrf)}'>"
            f"<span class='who'>{esc(who)}{' (admin)' if admin else ''}</span> "
            f"<button type='submit'>Sign out</button></form></nav>"
        )
    # the script only keeps a live page live: a page with no stream (the printable one) carries none
    data_live = f" data-live='{esc(live)}'" if live else ""
    script = "<script src='/console/static/console.js' defer></script>" if live else ""
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{esc(title)} · sparkcluster</title>"
        f"<link rel='stylesheet' href='/console/static/console.css'>{script}</head>"
        f"<body{data_live}><a class='skip' href='#main'>Skip to content</a>"
        f"<header><p class='brand'>sparkcluster console</p>{nav}</header>"
        f"<main id='main'><h1>{esc(title)}</h1>{body}</main></body></html>"
    )


def login(error: str = "") -> str:
    said = f"<p class='error' role='alert'>{esc(error)}</p>" if error else ""
    body = (
        f"{said}<form method='post' action='/console/login' class='login'>"
        "<label for='key'>Gateway key</label>"
        "<input id='key' name='key' type='password' autocomplete='current-password' required>"
        "<button type='submit'>Sign in</button></form>"
        "<p>The key is sent once; the console then holds a session cookie for this browser.</p>"
    )
    return page("Sign in", body, None)


def deployments_table(rs: list[Row], now: float, admin: bool) -> str:
    if not rs:
        return "<p>No deployment is routed.</p>"
    head = (
        "<table class='cards'><caption>Deployments and services</caption><thead><tr><th scope='col'>Deployment</th>"
        "<th scope='col'>Models</th><th scope='col'>Supervisor</th><th scope='col'>Last verdict</th>"
        "<th scope='col'>Rotation</th><th scope='col'>In flight</th><th scope='col'>Tokens/s</th>"
        + ("<th scope='col'>Actions</th>" if admin else "")
        + "</tr></thead><tbody>"
    )
    body = ""
    for r in rs:
        models = ", ".join(f"<a href='/console/model/{urllib.parse.quote(n, safe='')}'>{esc(n)}</a>" for n in r.names)
        verdict = (
            f"<span class='verdict'>{esc(r.verdict)}</span>: {esc(r.cause)} "
            f"<span class='ago'>({esc(_ago(r.verdict_ts, now))})</span>"
            if r.verdict
            else "none"
        )
        rotation = (
            "<span class='ok'>in rotation</span>" if r.in_rotation else f"<span class='out'>out</span>: {esc(r.reason)}"
        )
        state = f"<span class='state state-{esc(r.state)}'>{esc(r.state)}</span>"
        if r.since:
            state += f" <span class='ago'>{esc(_ago(r.since, now))}</span>"
        acts = ""
        if admin:
            acts = (
                "<td data-label='Actions'>"
                + " ".join(
                    f"<a class='act' href='/console/confirm?{_query(action=a, deployment=r.key)}'>{esc(label)}</a>"
                    for a, label in actions_for(r)
                )
                + "</td>"
            )
        body += (
            f"<tr data-deployment='{esc(r.key)}'><th scope='row'>{esc(r.key)}"
            f"{' <small>(on demand)</small>' if r.on_demand else ''}"
            f"{' <small>(service)</small>' if r.service else ''}</th>"
            f"<td data-label='Models'>{models}</td><td data-label='Supervisor'>{state}</td>"
            f"<td data-label='Last verdict'>{verdict}</td><td data-label='Rotation'>{rotation}</td>"
            f"<td data-label='In flight'>{r.in_flight}</td>"
            f"<td data-label='Tokens/s'>{_num(r.tokens_per_s, '.1f')}</td>{acts}</tr>"
        )
    return head + body + "</tbody></table>"


def actions_for(r: Row) -> list[tuple[str, str]]:
    """What the console offers for a deployment: restart a running engine; on demand, its standby."""
    if r.service or r.stopping:
        return []
    out = []
    if r.state in (contract.SERVING, contract.STARTING):  # an engine runs (the supervisor's `ask` needs one)
        out.append(("restart", "Restart"))
    if r.on_demand:
        if r.state in contract.WAKEABLE:
            out.append(("wake", "Wake"))
        elif r.state in (contract.SERVING, contract.STARTING):
            out.append(("standby", "Stop to standby"))
    return out


def _fabric(f: dict) -> str:
    if "busbw_gbps" not in f:
        return "–"
    said = f"{f['busbw_gbps']:.1f} GB/s"
    if f.get("transport"):
        said += f" over {esc(f['transport'])}"
    if isinstance(f.get("floor_gbps"), float) and f["busbw_gbps"] < f["floor_gbps"]:
        said = f"<span class='out'>{said}, below the floor of {f['floor_gbps']:.1f}</span>"
    return said


def _hottest(temps: list[dict]) -> str:
    """The node's CX7 or NVMe sensor nearest its threshold (else the hottest), under its report's
    answer, marked where an alert would fire."""
    known = [t for t in temps if isinstance(t, dict) and isinstance(t.get("celsius"), (int, float))]
    if not known:
        return "–"

    def nearness(t: dict) -> float:
        limit = t.get("max_c") or t.get("crit_c")
        return t["celsius"] - limit if isinstance(limit, (int, float)) else t["celsius"] - 1000.0

    t = max(known, key=lambda t: (nearness(t), t["celsius"]))
    said = esc(f"{t.get('device')} {t.get('sensor')} {t['celsius']:.0f} °C")
    hot = t.get("alert") if t.get("alert") in ("warning", "critical") else ""  # the agent's judgement (node/hwmon)
    return f"<span class='out'>{said}, {hot}</span>" if hot else said


def nodes_table(ns: list[Node], figs: dict | None = None) -> str:
    if not ns:
        return ""
    figs = figs or {}
    body = "".join(
        f"<tr><th scope='row'>{esc(n.name)}</th>"
        f"<td>{'<span class=ok>answers</span>' if n.answered else '<span class=out>no report</span>'}"
        f"{'<br>' + _hottest(n.temperatures) if n.temperatures else ''}</td>"
        f"<td>{_gib(n.mem_available)} of {_gib(n.mem_total)}</td>"
        f"<td>{'yes' if n.ray_alive else 'no' if n.ray_alive is False else '?'}</td>"
        f"<td>{_num(figs.get(n.name, {}).get('power_w'), '.0f', ' W')}</td>"
        f"<td>{_fabric(figs.get(n.name, {}))}</td></tr>"
        for n in ns
    )
    return (
        "<table><caption>Nodes (GPU power and the fabric test: each deployment's head)</caption><thead><tr>"
        "<th scope='col'>Node</th><th scope='col'>Report</th><th scope='col'>Memory available</th>"
        "<th scope='col'>Ray</th><th scope='col'>GPU power</th><th scope='col'>Last fabric test</th></tr></thead>"
        f"<tbody>{body}</tbody></table>"
    )


def alerts_list(alerts: list[dict] | None) -> str:
    """The alerts firing, as Prometheus' `/api/v1/alerts` lists them (labels, annotations, activeAt)."""
    if alerts is None:
        return "<h2>Alerts</h2><p>No Prometheus answers (<code>sparkcluster monitor up</code> runs one).</p>"
    if not alerts:
        return "<h2>Alerts</h2><p class='ok'>None firing.</p>"
    items = ""
    for a in alerts:
        labels, notes = a.get("labels") or {}, a.get("annotations") or {}
        where = ", ".join(f"{k}={v}" for k, v in sorted(labels.items()) if k in ("deployment", "node", "severity"))
        items += (
            f"<li><strong class='out'>{esc(labels.get('alertname', 'alert'))}</strong> ({esc(where)}): "
            f"{esc(notes.get('summary') or notes.get('description') or '')} "
            f"<span class='ago'>since {esc(a.get('activeAt', ''))}</span></li>"
        )
    return f"<h2>Alerts</h2><ul class='alerts'>{items}</ul>"


def cluster_live(
    routes, now: float, admin: bool, figs: dict | None = None, alerts: list[dict] | None = None
) -> dict[str, str]:
    """The parts of the cluster page the live stream replaces (element id -> HTML); `figs` each head
    node's figures from its agent's `/metrics` (node_figures), `alerts` those firing (None: no Prometheus)."""
    return {
        "alerts": alerts_list(alerts),
        "deployments": deployments_table(rows(routes), now, admin),
        "nodes": nodes_table(nodes(routes), figs),
        "updated": f"updated {time.strftime('%H:%M:%S', time.gmtime(now))} UTC",
    }


def live_blocks(parts: dict[str, str]) -> str:
    out = f"<p id='updated' class='updated' aria-live='off'>{parts.get('updated', '')}</p>"
    for k, v in parts.items():
        if k != "updated":
            out += f"<section id='{esc(k)}' aria-live='polite'>{v}</section>"
    return out


def cluster(parts: dict[str, str], who: str, csrf: str, admin: bool, said: str, routes) -> str:
    """The cluster page: `parts` (cluster_live's), then for an admin the controller's commands."""
    notice = f"<p class='notice' role='status'>{esc(said)}</p>" if said else ""
    body = notice + live_blocks(parts)
    if admin:
        body += controller_commands(routes)
    return page("Cluster", body, who, csrf, admin, live="/console/live")


def controller_commands(routes) -> str:
    """Bench and rollback stay the controller's: the exact commands, per deployment (docs: security)."""
    items = ""
    for r in routes:
        if r.paths:
            continue
        profile, _, nodes_ = r.key.partition("@")
        node_args = " ".join(f"--node {n}" for n in (r.nodes or tuple(x for x in nodes_.split("+") if x)))
        items += (
            f"<li><strong>{esc(r.key)}</strong>: <code>sparkcluster bench --profile {esc(profile)}</code>, "
            f"<code>sparkcluster rollback --profile {esc(profile)} {esc(node_args)}</code> "
            "(with <code>--dry-run</code>: its plan first)</li>"
        )
    if not items:
        return ""
    return (
        "<section aria-labelledby='from-controller'><h2 id='from-controller'>From the controller</h2>"
        "<p>A bench and a rollback run from the controller (they need its SSH trust and the image's "
        "records): run these there.</p>"
        f"<ul class='commands'>{items}</ul></section>"
    )


def model_live(name: str, routes, figs: dict[str, Figures], log: dict[str, list[str]] | None, now: float) -> dict:
    rows_ = ""
    for r in routes:
        f = figs.get(r.key) or Figures()
        kv = None if f.kv_use is None else f.kv_use * 100
        rows_ += (
            f"<tr><th scope='row'>{esc(r.key)}</th><td>{_num(f.tokens_per_s, '.1f')}</td>"
            f"<td>{_num(None if f.ttft_s is None else f.ttft_s * 1000, '.0f', ' ms')}</td>"
            f"<td>{_num(None if f.itl_s is None else f.itl_s * 1000, '.1f', ' ms')}</td>"
            f"<td>{_num(f.running, '.0f')} + {_num(f.waiting, '.0f')} waiting</td>"
            f"<td>{_num(kv, '.1f', ' %')}</td><td>{esc(f.error)}</td></tr>"
        )
    out = {
        "figures": (
            "<table><caption>Engine figures (vLLM's metrics, between two reads)</caption><thead><tr>"
            "<th scope='col'>Deployment</th><th scope='col'>Tokens/s</th><th scope='col'>Time to first token</th>"
            "<th scope='col'>Inter-token latency</th><th scope='col'>Requests running</th>"
            "<th scope='col'>KV cache use</th><th scope='col'>Read</th></tr></thead>"
            f"<tbody>{rows_}</tbody></table>"
        ),
        "deployments": deployments_table(rows(routes), now, False),
        "updated": f"updated {time.strftime('%H:%M:%S', time.gmtime(now))} UTC",
    }
    if log is not None:
        text = "".join(
            f"<h3>{esc(k)}</h3><pre class='log' tabindex='0'>{esc(chr(10).join(lines))}</pre>"
            for k, lines in log.items()
        )
        out["log"] = "<h2>Server log (secrets masked)</h2>" + (text or "<p>No log read.</p>")
    return out


def model(name: str, routes, figs, log, events: list[dict] | None, now, who, csrf, admin) -> str:
    body = live_blocks(model_live(name, routes, figs, log, now))
    if events is not None:
        body += (
            "<section aria-labelledby='recent'><h2 id='recent'>Recent events</h2>" + events_table(events) + "</section>"
        )
    live = f"/console/live/model/{urllib.parse.quote(name, safe='')}"
    return page(f"Model {name}", body, who, csrf, admin, live=live)


def events_table(entries: list[dict]) -> str:
    if not entries:
        return "<p>No events.</p>"
    body = ""
    for e in entries:
        detail = {k: v for k, v in e.items() if k not in ("ts", "event", "deployment")}
        body += (
            f"<tr><td>{esc(time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(float(e.get('ts') or 0))))}</td>"
            f"<td>{esc(e.get('deployment', ''))}</td><td>{esc(e.get('event', ''))}</td>"
            f"<td><code>{esc(json.dumps(detail, sort_keys=True))}</code></td></tr>"
        )
    return (
        "<table class='events'><caption>Journal (newest first)</caption><thead><tr><th scope='col'>Time (UTC)</th>"
        "<th scope='col'>Deployment</th><th scope='col'>Event</th><th scope='col'>Detail</th></tr></thead>"
        f"<tbody>{body}</tbody></table>"
    )


def events(entries: list[dict], keys: list[str], chosen: dict, who, csrf) -> str:
    options = "<option value=''>every deployment</option>" + "".join(
        f"<option value='{esc(k)}'{' selected' if chosen.get('deployment') == k else ''}>{esc(k)}</option>"
        for k in keys
    )
    form = (
        "<form method='get' action='/console/events' class='filter'>"
        f"<label for='deployment'>Deployment</label><select id='deployment' name='deployment'>{options}</select>"
        f"<label for='kind'>Event contains</label><input id='kind' name='kind' value='{esc(chosen.get('kind', ''))}'>"
        f"<label for='minutes'>Last minutes</label><input id='minutes' name='minutes' inputmode='numeric' "
        f"value='{esc(chosen.get('minutes', '60'))}'>"
        "<button type='submit'>Filter</button></form>"
    )
    live = "/console/live/events?" + urllib.parse.urlencode(chosen)
    return page("Events", form + f"<section id='journal'>{events_table(entries)}</section>", who, csrf, True, live)


def confirm(action: str, key: str, words: list[str], who: str, csrf: str) -> str:
    said = "".join(f"<li>{esc(w)}</li>" for w in words)
    body = (
        f"<p>This is what <strong>{esc(action)}</strong> of <strong>{esc(key)}</strong> does "
        "(the dry run's words); it is journalled with your key's name and the time.</p>"
        f"<ol class='plan'>{said}</ol>"
        "<form method='post' action='/console/action'>"
        f"<input type='hidden' name='csrf' value='{esc(csrf)}'>"
        f"<input type='hidden' name='action' value='{esc(action)}'>"
        f"<input type='hidden' name='deployment' value='{esc(key)}'>"
        f"<button type='submit' class='danger'>Yes, {esc(action)} {esc(key)}</button> "
        "<a href='/console'>Cancel</a></form>"
    )
    return page(f"Confirm: {action}", body, who, csrf, True)


def usage(usage_rows: list[dict], all_keys: bool, who, csrf, admin) -> str:
    if not usage_rows:
        table = "<p>No usage recorded in the last 24 hours.</p>"
    else:
        body = "".join(
            f"<tr><td>{esc(time.strftime('%Y-%m-%d %H:00', time.gmtime(r['hour'])))}</td><td>{esc(r['key'])}</td>"
            f"<td>{esc(r['model'])}</td><td>{r['requests']}</td><td>{r['prompt_tokens']}</td>"
            f"<td>{r['completion_tokens']}</td><td>{r['errors']}</td></tr>"
            for r in usage_rows
        )
        table = (
            "<table><caption>Usage by hour (UTC), last 24 hours</caption><thead><tr><th scope='col'>Hour</th>"
            "<th scope='col'>Key</th><th scope='col'>Model</th><th scope='col'>Requests</th>"
            "<th scope='col'>Prompt tokens</th><th scope='col'>Completion tokens</th><th scope='col'>Errors</th>"
            f"</tr></thead><tbody>{body}</tbody></table>"
        )
    scope = "every key's" if all_keys else "your key's"
    return page("Usage", f"<p>Showing {scope} usage.</p>" + table, who, csrf, admin)


def printable(parts: dict[str, str], who, csrf, admin) -> str:
    """The cluster as one page to print or save (a PDF from the browser's print): the cluster page's
    parts read once, with no live stream and no action; console.css's print rules drop the navigation
    and lay the tables out for paper."""
    body = "".join(f"<section>{v}</section>" for k, v in parts.items() if k != "updated")
    body += f"<p>{esc(parts['updated'])}</p>"
    return page("Cluster (printable)", body, who, csrf, admin)


# -- speed and upgrades (the records the controller copies to the head: deployment/head_records)
def bars(title: str, points: list[tuple[str, float]], unit: str) -> str:
    """A bar chart as inline SVG (no script, no style: attributes only), its figures also in words."""
    if not points:
        return ""
    top = max(v for _, v in points) or 1.0
    w, h, gap = 48, 120, 16
    width = len(points) * (w + gap) + gap
    parts = []
    for i, (label, v) in enumerate(points):
        x, bh = gap + i * (w + gap), round(h * v / top)
        parts.append(
            f"<rect x='{x}' y='{h - bh + 16}' width='{w}' height='{bh}' fill='#0b4f9c'></rect>"
            f"<text x='{x + w / 2}' y='{h - bh + 12}' text-anchor='middle' font-size='11'>{v:.0f}</text>"
            f"<text x='{x + w / 2}' y='{h + 30}' text-anchor='middle' font-size='11'>{esc(label)}</text>"
        )
    said = ", ".join(f"{esc(label)}: {v:.1f} {esc(unit)}" for label, v in points)
    return (
        f"<figure><svg role='img' aria-label='{esc(title)}: {said}' width='{width}' height='{h + 40}' "
        f"viewBox='0 0 {width} {h + 40}'>{''.join(parts)}</svg><figcaption>{esc(title)}</figcaption></figure>"
    )


def _f(v, fmt: str = ".1f") -> str:
    return f"{v:{fmt}}" if isinstance(v, (int, float)) and not isinstance(v, bool) else "–"


def bench_run(doc: dict) -> str:
    rows = [r for r in doc.get("rows") or [] if isinstance(r, dict)]
    head = (
        f"<h2>{esc(doc.get('deployment', ''))} <small>{esc(doc.get('at', ''))}</small></h2>"
        f"<p>vLLM {esc(doc.get('vllm_version') or '?')}"
        f"{'; interrupted' if doc.get('interrupted') else ''}"
        f"{'; failed: ' + esc(doc.get('failed')) if doc.get('failed') else ''}</p>"
    )
    chart = bars(
        "Output tokens/s by concurrency",
        [(f"c{r.get('concurrency')}", float(r.get("output_tok_s") or 0)) for r in rows],
        "tokens/s",
    )
    body = "".join(
        f"<tr><td>{esc(r.get('concurrency'))}</td><td>{_f(r.get('output_tok_s'))}</td>"
        f"<td>{_f(r.get('ttft_p50_ms'), '.0f')}</td><td>{_f(r.get('itl_p50_ms'))}</td>"
        f"<td>{esc(r.get('errors') or 0)}</td></tr>"
        for r in rows
    )
    table = (
        "<table><caption>Levels</caption><thead><tr><th scope='col'>Concurrency</th>"
        "<th scope='col'>Output tokens/s</th><th scope='col'>TTFT p50 (ms)</th><th scope='col'>ITL p50 (ms)</th>"
        f"<th scope='col'>Errors</th></tr></thead><tbody>{body}</tbody></table>"
    )
    return f"<section class='run'>{head}{chart}{table}{standing(doc.get('against'))}</section>"


def standing(against: dict | None) -> str:
    """`--compare` against a record: its verdict, each figure's ratio, the causes ranked."""
    if not against:
        return ""
    ratios = "".join(
        f"<tr><td>{esc(r.get('conditions'))}</td><td>{esc(r.get('figure'))}</td><td>{_f(r.get('ours'), '.4g')}</td>"
        f"<td>{_f(r.get('theirs'), '.4g')}</td><td>{_f(r.get('ratio'), '.2f')}</td>"
        f"<td>{'short' if r.get('short') else 'holds'}</td></tr>"
        for r in against.get("ratios") or []
        if isinstance(r, dict)
    )
    causes = "".join(
        f"<li><strong>{esc(c.get('area'))}</strong>{': ' + esc(c.get('node')) if c.get('node') else ''} "
        f"{esc(c.get('says'))} <em>fix: {esc(c.get('fix'))}</em></li>"
        for c in against.get("causes") or []
        if isinstance(c, dict)
    )
    return (
        f"<h3>Against the {esc(against.get('kind') or 'record')}: {esc(against.get('verdict'))}</h3>"
        f"<p>{esc(against.get('source'))}</p>"
        + (
            "<table><caption>Each figure against the record</caption><thead><tr><th scope='col'>Conditions</th>"
            "<th scope='col'>Figure</th><th scope='col'>Ours</th><th scope='col'>Theirs</th>"
            f"<th scope='col'>Ratio</th><th scope='col'>Judged</th></tr></thead><tbody>{ratios}</tbody></table>"
            if ratios
            else ""
        )
        + (f"<p>Likely causes, most likely first:</p><ol>{causes}</ol>" if causes else "")
    )


def speed(runs: list[dict], who, csrf, admin) -> str:
    if not runs:
        body = "<p>No bench run recorded on this node yet: <code>sparkcluster bench</code> from the controller.</p>"
    else:
        body = "".join(bench_run(d) for d in runs)
    return page("Speed", body, who, csrf, admin)


def upgrades(history: dict, who, csrf, admin) -> str:
    outcomes = [o for o in history.get("outcomes") or [] if isinstance(o, dict)][::-1]
    good = [g for g in history.get("good") or [] if isinstance(g, dict)][::-1]
    if not outcomes and not good:
        return page("Upgrades", "<p>No upgrade history recorded on this node yet.</p>", who, csrf, admin)
    rows_o = "".join(
        f"<tr><td>{esc(o.get('at'))}</td><td>{esc(o.get('deployment'))}</td><td>{esc(o.get('image'))}</td>"
        f"<td>{esc(o.get('outcome'))}</td><td>{esc(o.get('reason'))}</td><td>{esc(o.get('returned_to'))}</td></tr>"
        for o in outcomes
    )
    rows_g = "".join(
        f"<tr><td>{esc(g.get('at'))}</td><td>{esc(g.get('deployment'))}</td><td>{esc(g.get('image'))}</td>"
        f"<td>{esc(g.get('vllm_version'))}</td><td>{esc(g.get('model_revision'))}</td>"
        f"<td>{_f(g.get('canary_tok_s'))}</td></tr>"
        for g in good
    )
    body = (
        "<table><caption>Upgrades, their canary verdicts and rollbacks (newest first)</caption><thead><tr>"
        "<th scope='col'>When (UTC)</th><th scope='col'>Deployment</th><th scope='col'>Image</th>"
        "<th scope='col'>Outcome</th><th scope='col'>Why</th><th scope='col'>Returned to</th></tr></thead>"
        f"<tbody>{rows_o}</tbody></table>"
        "<table><caption>Good serves (newest first)</caption><thead><tr><th scope='col'>When (UTC)</th>"
        "<th scope='col'>Deployment</th><th scope='col'>Image</th><th scope='col'>vLLM</th>"
        "<th scope='col'>Model revision</th><th scope='col'>Canary tokens/s</th></tr></thead>"
        f"<tbody>{rows_g}</tbody></table>"
    )
    return page("Upgrades", body, who, csrf, admin)
