"""`sparkcluster status [--json] [--watch]`: healthy, degraded or down, per node."""

from __future__ import annotations

import time
from pathlib import Path

import click
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from .. import redact, secrets as secret_store, status as status_mod, supervision
from .main import cli

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
    colour = {"healthy": "green", "degraded": "bold red", "down": "yellow"}[st.state]
    t = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("node", "container", "state", "ray", "uptime", "MemAvailable"):
        t.add_column(col)
    for n in st.nodes:
        if not n.reachable:
            t.add_row(n.node, "-", "[red]unreachable[/]", "-", "-", "-")
            continue
        ray = "-" if n.ray_alive is None else ("alive" if n.ray_alive else "[red]missing[/]")
        up = _duration(n.uptime_s)
        mem = f"{n.mem_available_gib} GiB" if n.mem_available_gib is not None else "-"
        t.add_row(n.node, n.container or "-", n.state, ray, up, mem)
    lines = [f"cluster [bold]{st.cluster}[/]: [{colour}]{st.state}[/]", t]
    if st.ray_nodes is not None:
        lines.append(f"ray: {st.ray_nodes} nodes, {st.ray_gpus:g} GPUs")
    if st.endpoint and st.state != "down":
        lines.append(f"endpoint: {st.endpoint}  health: {st.health or 'no answer'}  models: {', '.join(st.models) or '-'}"
                     + (f"  vllm serve pid {st.server_pid}" if st.server_pid else ""))
    if st.metrics and st.state != "down":
        m = st.metrics
        lines.append("serving: " + "  ".join(f"{label} {fmt(m[key])}" for key, label, fmt in (
            ("requests_running", "running", _count), ("requests_waiting", "waiting", _count),
            ("kv_cache_usage", "KV cache", lambda v: f"{v * 100:.1f}%"),
            ("generation_tokens_total", "tokens generated", _count)) if key in m))
    sup = st.supervisor
    if sup and st.state != "down":
        restarts = len(sup.get("restarts") or [])
        rate = sup.get("tokens_per_s")
        lines.append(f"supervisor: {sup.get('state')}  restarts: {restarts} of {sup.get('policy', {}).get('max_restarts', '?')}"
                     + (f"  generating {rate:.1f} tok/s" if rate is not None else ""))
        for e in st.journal[-3:]:
            lines.append("  " + redact.mask(supervision.format_entry(e)))
    for p in st.problems:
        lines.append(f"[red]problem:[/] {redact.mask(p)}")
    return Group(*lines)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@click.option("--watch", is_flag=True, help="Refresh in place every --interval seconds until Ctrl-C.")
@click.option("--interval", default=2.0, show_default=True, help="Seconds between refreshes with --watch.")
@click.option("--env-file", type=click.Path(path_type=Path), default=None, help="Where VLLM_API_KEY lives.")
@click.pass_obj
def status(obj, as_json: bool, watch: bool, interval: float, env_file: Path | None) -> None:
    """Per node: container, Ray membership, endpoint health and model, container uptime, MemAvailable."""
    inv = obj.inventory()
    key = secret_store.load_secrets(env_file, names=["VLLM_API_KEY"]).get("VLLM_API_KEY")
    if watch and not as_json:
        console = Console()
        try:
            with Live(console=console, auto_refresh=False) as live:
                while True:
                    live.update(render(status_mod.collect(inv, key)), refresh=True)
                    time.sleep(interval)
        except KeyboardInterrupt:
            return
    st = status_mod.collect(inv, key)
    if as_json:
        click.echo(redact.mask(st.as_json()))
    else:
        Console(soft_wrap=True).print(render(st), highlight=False)
    raise click.exceptions.Exit(EXIT[st.state])
