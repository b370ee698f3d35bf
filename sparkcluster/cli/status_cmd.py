"""`sparkcluster status [--json] [--watch]`: healthy, degraded or down, per node."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from sparkcluster import redact
from sparkcluster.cli.main import cli
from sparkcluster.config.secrets import load_secrets
from sparkcluster.day2 import fleet, supervision
from sparkcluster.day2 import status as status_mod

if TYPE_CHECKING:  # rich only where a table is drawn: `status --json` is polled by scripts
    from rich.console import Group

EXIT = {"healthy": 0, "degraded": 1, "down": 3}


def _duration(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def _count(v: float) -> str:
    return f"{v:,.0f}"


def render(st: status_mod.ClusterStatus) -> Group:
    from rich.console import Group
    from rich.table import Table

    colour = {"healthy": "green", "degraded": "bold red", "down": "yellow"}[st.state]
    t = Table(box=None, pad_edge=False, header_style="bold")
    mp = any(n.executor == "mp" for n in st.nodes)  # vLLM's own launch: each node's rank, no Ray
    for col in ("node", "container", "state", "rank" if mp else "ray", "uptime", "MemAvailable"):
        t.add_column(col)
    for n in st.nodes:
        if not n.reachable:
            t.add_row(n.node, "-", "[red]unreachable[/]", "-", "-", "-")
            continue
        ray = "-" if n.ray_alive is None else ("alive" if n.ray_alive else "[red]missing[/]")
        if mp:
            ray = n.rank or "-" if "alive" in (n.rank or "alive") else f"[red]{n.rank}[/]"
        up = _duration(n.uptime_s)
        mem = f"{n.mem_available_gib} GiB" if n.mem_available_gib is not None else "-"
        t.add_row(n.node, n.container or "-", n.state, ray, up, mem)
    lines = [f"cluster [bold]{st.cluster}[/]: [{colour}]{st.state}[/]", t]
    if st.ray_nodes is not None:
        lines.append(f"ray: {st.ray_nodes} nodes, {st.ray_gpus:g} GPUs")
    if st.endpoint and st.state != "down":
        lines.append(
            f"endpoint: {st.endpoint}  health: {st.health or 'no answer'}  models: {', '.join(st.models) or '-'}"
            + (f"  vllm serve pid {st.server_pid}" if st.server_pid else "")
        )
    if st.metrics and st.state != "down":
        m = st.metrics
        lines.append(
            "serving: "
            + "  ".join(
                f"{label} {fmt(m[key])}"
                for key, label, fmt in (
                    ("requests_running", "running", _count),
                    ("requests_waiting", "waiting", _count),
                    ("kv_cache_usage", "KV cache", lambda v: f"{v * 100:.1f}%"),
                    ("generation_tokens_total", "tokens generated", _count),
                )
                if key in m
            )
        )
    caches = [n for n in st.nodes if n.compile_caches_gib is not None]
    if caches:  # the compile caches a restart loads (down keeps them, down --purge-caches removes them)
        lines.append(
            "compile cache: "
            + "  ".join(
                f"{n.node} "
                + (f"{n.compile_cache} {n.compile_cache_gib or 0:.2f} GiB, " if n.compile_cache else "")
                + f"all {n.compile_caches_gib:.2f} GiB"
                for n in caches
            )
        )
    if st.nccl and st.state != "down":  # what the engine's own NCCL chose, per node
        lines.append("nccl: " + "  ".join(f"{node} {what}" for node, what in st.nccl.items()))
    sup = st.supervisor
    if sup and st.state != "down":
        restarts = len(sup.get("restarts") or [])
        rate = sup.get("tokens_per_s")
        stale = isinstance(sup.get("age_s"), (int, float)) and sup["age_s"] > status_mod.stale_after_s(sup)
        lines.append(
            f"supervisor: {sup.get('state')}"
            + (f" (stale: written {sup['age_s']:.0f}s ago)" if stale else "")
            + f"  restarts: {restarts} of {sup.get('policy', {}).get('max_restarts', '?')}"
            + (f"  generating {rate:.1f} tok/s" if rate is not None and not stale else "")
        )
        if sup.get("activity") and not stale:  # a long prompt being prefilled: progress, not a wedge
            lines.append(f"  {redact.mask(sup['activity'])}")
        for e in st.journal[-3:]:
            lines.append("  " + redact.mask(supervision.format_entry(e)))
    for p in st.problems:
        lines.append(f"[red]problem:[/] {redact.mask(p)}")
    return Group(*lines)


def render_all(sts: list[status_mod.ClusterStatus]) -> Group:
    from rich.console import Group

    if len(sts) == 1:
        return render(sts[0])
    parts = []
    for st in sts:
        parts.append(f"[bold]deployment {st.deployment}[/]")
        parts.append(render(st))
        parts.append("")
    return Group(*parts)


def overall(sts: list[status_mod.ClusterStatus]) -> str:
    """healthy only when every deployment is; down when all are."""
    states = {st.state for st in sts}
    return "healthy" if states == {"healthy"} else "down" if states == {"down"} else "degraded"


def fleet_json(sts: list[status_mod.ClusterStatus]) -> str:
    import json
    from dataclasses import asdict

    return json.dumps({"state": overall(sts), "deployments": [asdict(st) for st in sts]}, indent=2)


def _textual() -> bool:
    """Textual (the full-screen view) is installed; without it --watch refreshes a table in place."""
    return importlib.util.find_spec("textual") is not None


def _write_html(inv, sts, path: Path) -> None:
    from sparkcluster.day2 import html_report  # only where --html is asked: status --json stays light

    charts = {}
    try:
        from sparkcluster.monitor import history  # only where --html is asked, as above
        from sparkcluster.remote.fanout import connect_all  # as above

        res = connect_all(inv, [inv.head])
        host = res.succeeded.get(inv.head.name)
        if host is not None:
            try:
                charts = history.charts(host.docker().api, inv)
            finally:
                host.close()
    except Exception as e:  # noqa: BLE001 - the page is written without charts, and says nothing false
        click.echo(f"warning: no charts from Prometheus: {redact.mask(str(e))}", err=True)
    path.write_text(html_report.render(sts, charts))
    click.echo(f"wrote {path}", err=True)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@click.option(
    "--all",
    "every",
    is_flag=True,
    help="Every deployment on the inventory's nodes (the JSON lists them); "
    "exits 0 only when every one serves: a fleet check for cron or a timer.",
)
@click.option(
    "--on-change",
    default=None,
    metavar="CMD",
    help="Run CMD (through sh) for each deployment whose state changed since the last status run on this "
    "machine; SPARKCLUSTER_DEPLOYMENT, _PROFILE, _NODES, _STATE, _PREVIOUS_STATE, _PROBLEMS in its env.",
)
@click.option("--watch", is_flag=True, help="Refresh in place every --interval seconds until Ctrl-C.")
@click.option("--interval", default=2.0, show_default=True, help="Seconds between refreshes with --watch.")
@click.option("--env-file", type=click.Path(path_type=Path), default=None, help="Where VLLM_API_KEY lives.")
@click.option(
    "--html",
    "html_path",
    type=click.Path(path_type=Path),
    default=None,
    help="Also write the status as one static HTML page (with the last hour's charts where monitoring runs).",
)
@click.pass_obj
def status(
    obj,
    as_json: bool,
    every: bool,
    on_change: str | None,
    watch: bool,
    interval: float,
    env_file: Path | None,
    html_path: Path | None,
) -> None:
    """Per deployment and node: container, Ray membership, endpoint health and model, serving
    figures, the supervisor, container uptime, MemAvailable."""
    inv = obj.inventory()
    key = load_secrets(env_file, names=["VLLM_API_KEY"]).get("VLLM_API_KEY")
    if watch and not as_json and sys.stdout.isatty() and _textual():
        from sparkcluster.day2 import live  # a full-screen view: sparklines, the journal

        live.run(lambda: status_mod.collect_all(inv, key), interval)
        return
    if watch and not as_json:
        from rich.console import Console
        from rich.live import Live

        console = Console()
        try:
            with Live(console=console, auto_refresh=False) as live:
                while True:
                    live.update(render_all(status_mod.collect_all(inv, key)), refresh=True)
                    time.sleep(interval)
        except KeyboardInterrupt:
            return
    sts = status_mod.collect_all(inv, key)
    if html_path is not None:
        _write_html(inv, sts, html_path)
    if on_change:
        for line in fleet.notify_changes(inv.cluster.name, sts, on_change):
            click.echo(f"warning: {line}", err=True)
    if as_json:
        # one deployment keeps the single object it always printed; --all (or several) the list
        click.echo(redact.mask(fleet_json(sts) if every or len(sts) > 1 else sts[0].as_json()))
    else:
        from rich.console import Console

        Console(soft_wrap=True).print(render_all(sts), highlight=False)
    raise click.exceptions.Exit(EXIT[overall(sts)])
