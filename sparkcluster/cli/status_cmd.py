"""`sparkcluster status [--json] [--watch]`: healthy, degraded or down, per node."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from sparkcluster import log, redact
from sparkcluster.cli.main import cli
from sparkcluster.cli.options import env_file_option
from sparkcluster.config.secrets import ENV_FILE_HELP, load_secrets
from sparkcluster.deployment import supervision
from sparkcluster.node import contract, engine_log
from sparkcluster.status import fleet
from sparkcluster.status import status as status_mod

if TYPE_CHECKING:  # rich only where a table is drawn: `status --json` is polled by scripts
    from rich.console import Group

from sparkcluster.errors import EXIT_DOWN, EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE, InputError, SparkError

EXIT = {"healthy": EXIT_OK, "degraded": EXIT_FAILED, "down": EXIT_DOWN, "unreachable": EXIT_UNREACHABLE}


def _interval(v: float) -> float:
    import math

    if not math.isfinite(v) or v < 0.5:
        raise click.BadParameter(f"{v} is not a number of seconds of at least 0.5", param_hint="--interval")
    return v


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
    from rich.markup import escape
    from rich.table import Table

    colour = {"healthy": "green", "degraded": "bold red", "down": "yellow", "unreachable": "bold red"}[st.state]
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
    if st.endpoint and st.state != "down" and st.service:  # issue 60: its health is its supervisor's
        said = contract.Supervised.of(st.supervisor)
        state = (said.state if said else None) or "no state yet"
        pid = f"  service pid {st.server_pid}" if st.server_pid else ""
        lines.append(f"endpoint: {st.endpoint}  service: {state}{pid}")
    elif st.endpoint and st.state != "down":
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
    hot = {"warning": "yellow", "critical": "bold red"}
    temps = [n for n in st.nodes if n.temperatures]
    if temps:  # the CX7's and NVMe drives' sensors, coloured at their thresholds (node/hwmon, issue 75)
        lines.append(
            "temperatures: "
            + "  ".join(
                f"{n.node} "
                + ", ".join(
                    f"[{hot[h]}]{escape(text)}[/]" if h else escape(text)
                    for text, h in status_mod.temperatures_shown(n.temperatures)
                )
                for n in temps
            )
        )
    if st.nccl and st.state != "down":  # what the engine's own NCCL chose, per node
        lines.append("nccl: " + "  ".join(f"{node} {what}" for node, what in st.nccl.items()))
    if st.all_reduce and st.state != "down":  # the backend the ranks named for the TP all-reduce (issue 59)
        lines.append(f"all-reduce: {st.all_reduce}")
    if st.phases and st.state != "down":  # each rank's warm-up phase while the engine starts
        lines.append("warm-up: " + redact.mask(engine_log.drift_text(st.phases)))
    sup = st.supervisor
    rec = contract.Supervised.of(sup)
    if sup and rec and st.state != "down":
        restarts = len(rec.restarts)
        rate = rec.tokens_per_s
        age = sup.get("age_s")  # the controller's: how old the file is by the head's clock
        stale = rec.stale(age)
        lines.append(
            f"supervisor: {status_mod.supervisor_shown(sup)}"
            + (f" (stale: written {age:.0f}s ago)" if stale else "")
            + f"  restarts: {restarts} of {(rec.policy or {}).get('max_restarts', '?')}"
            + (f"  generating {rate:.1f} tok/s" if rate is not None and not stale else "")
        )
        if rec.activity and not stale:  # a long prompt being prefilled: progress, not a wedge
            lines.append(f"  {redact.mask(rec.activity)}")
        energy = status_mod.energy_shown(sup) if not stale else ""
        if energy:  # every node's GPU power and the energy per 1,000 generated tokens (issue 75)
            lines.append(f"  {energy}")
        for e in st.journal[-3:]:
            lines.append("  " + redact.mask(supervision.format_entry(e)))
    for d in st.drift:
        lines.append(f"[yellow]drift:[/] {redact.mask(d)}")
    speed = speed_line(st.cluster, st.profile) if st.profile and st.state != "down" else None
    if speed:
        lines.append(speed)
    canary = canary_line(st.canary) if st.state != "down" else None
    if canary:
        lines.append(canary)
    for p in st.problems:
        lines.append(f"[red]problem:[/] {escape(redact.mask(p))}")
    if st.fix:
        lines.append(f"fix: {escape(redact.mask(st.fix))}")
    return Group(*lines)


def canary_line(check: dict | None) -> str | None:
    """The head container's last correctness-canary check (node/canary, issue 38), whoever made it (the
    supervisor after a restart, `up`, `bench --canary`): same, taken, changed (a problem) or differs (a
    model nondeterministic by design: told only)."""
    from rich.markup import escape

    if not check or not check.get("state"):
        return None
    state = {"changed": "[bold red]changed[/]", "differs": "differs (nondeterministic by design)"}.get(
        check["state"], check["state"]
    )
    after = f" after {check['after']}" if check.get("after") else ""
    since = f" since {', '.join(check['since'])}" if check.get("since") else ""
    n = len(check.get("changed") or [])
    rest = f" at {check.get('at')}{after}{since}" + (f" ({n} answer(s))" if n else "")
    if check["state"] == "changed":
        rest += " -- read a few answers; after a change you meant: sparkcluster bench --canary-retake"
    return f"canary: {state}" + escape(redact.mask(rest))


def speed_line(cluster: str, profile: str) -> str | None:
    """The newest `bench` of this profile against a record (issue 38), from this machine's run folders
    (bench writes against.json beside its results): the worst figure's ratio and the verdict."""
    import json

    root = log.state_dir() / "bench" / cluster
    if not root.is_dir():
        return None
    for f in sorted(root.glob("*/against.json"), key=lambda p: p.parent.name, reverse=True):
        try:
            doc = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if doc.get("profile") != profile or not doc.get("ratios"):
            continue
        worst = min(doc["ratios"], key=lambda r: r["ratio"])
        verdict = "[bold red]short[/]" if doc.get("verdict") == "short" else "holds"
        cause = (doc.get("causes") or [{}])[0].get("area")
        return (
            f"speed: {verdict} against the {doc.get('kind') or 'record'} (bench {f.parent.name}): "
            f"{worst['figure']} {worst['ratio']:.2f} of it at {worst['conditions']}"
            + (f"; likely cause: {cause}" if cause else "")
        )
    return None


def render_all(sts: list[status_mod.ClusterStatus]) -> Group:
    from rich.console import Group

    gw = sts[0].gateway if sts else None
    said = f"gateway: {gw['container']} on {gw['node']} port {gw['port']}: {gw['state']}" if gw else ""
    models = (gw or {}).get("models")
    if models is not None:
        said += "  models: " + (
            ", ".join(n if ok else f"[red]{n} (out of rotation)[/]" for n, ok in models.items()) or "none"
        )
    tail = [said + "  (sparkcluster gateway status says why)"] if gw else []
    if len(sts) == 1:
        return Group(render(sts[0]), *tail)
    parts = []
    for st in sts:
        parts.append(f"[bold]deployment {st.deployment}[/]")
        parts.append(render(st))
        parts.append("")
    return Group(*parts, *tail)


def overall(sts: list[status_mod.ClusterStatus]) -> str:
    """healthy only when every deployment is; down (or unreachable) when all are."""
    states = {st.state for st in sts}
    if len(states) == 1 and states <= {"healthy", "down", "unreachable"}:
        return states.pop()
    return "degraded"


def fleet_json(sts: list[status_mod.ClusterStatus]) -> str:
    import json

    docs = [st.as_doc() for st in sts]
    if overall(sts) == status_mod.UNREACHABLE:  # nothing is known: the failure shape, each deployment's beside it
        return json.dumps({**docs[0], "deployments": docs}, indent=2)
    return json.dumps({"state": overall(sts), "deployments": docs}, indent=2)


def watch_ended(seen) -> None:
    """Quitting the full-screen view with q ends `--watch` as a plain `status` would have ended on what
    it showed last (unreachable: 4); nothing shown yet: a plain return. Ctrl-C is no quitting: it
    interrupts, whatever the view showed, and exits 130 as every command does (README, exit codes)."""
    if seen is not None:
        raise click.exceptions.Exit(EXIT[overall(seen)])


def plain_frames(collect, interval: float, out=None) -> None:
    """`--watch` where stdout is no terminal (a pipe, a file, `timeout`'s child): one plain frame per
    refresh, each headed by its time and flushed at once, so that whatever reads the other end (or
    kills the watch) has every frame so far. Until Ctrl-C (or a signal)."""
    from datetime import UTC, datetime

    from rich.console import Console

    stream = out or sys.stdout
    console = Console(file=stream, highlight=False, soft_wrap=True, color_system=None)
    while True:
        sts = collect()
        console.print(f"--- {datetime.now(UTC):%Y-%m-%d %H:%M:%S} UTC", markup=False)
        console.print(render_all(sts))
        stream.flush()
        time.sleep(interval)


def _textual() -> bool:
    """Textual (the full-screen view) is installed; without it --watch refreshes a table in place."""
    return importlib.util.find_spec("textual") is not None


def _html_went(obj) -> InputError:
    """`status --html` went (the console's printable view replaces it): an old script that still asks
    for it gets one line naming the page instead of click's "No such option"."""
    from sparkcluster.gateway.rollout import DEFAULT_PORT  # only where the old option is asked

    return InputError(
        "status --html went: the web console's printable view replaces it, at "
        f"http://{_head_address(obj)}:{DEFAULT_PORT}/console/print once the gateway runs "
        "(`gateway up`'s default node and port)",
        "sparkcluster gateway up",
    )


def _head_address(obj) -> str:
    """The head's address as this machine reaches it over SSH (ssh_config's HostName for an alias),
    as `gateway status` names it in the URL it prints; a placeholder where the inventory does not load."""
    try:
        from sparkcluster.remote import ssh, target  # only where the old option is asked

        inv = obj.inventory()
        alias = target.parse_target(inv.head.ssh)[1]
        return target.load_config(ssh.Settings.from_inventory(inv).ssh_config).lookup(alias).get("hostname", alias)
    except SparkError:
        return "HEAD"


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
@click.option(
    "--watch",
    is_flag=True,
    help="Refresh in place every --interval seconds until Ctrl-C (exit 130); where stdout is not a terminal, "
    "one plain frame per refresh.",
)
@click.option(
    "--interval",
    default=2.0,
    show_default=True,
    callback=lambda ctx, param, v: _interval(v),
    help="Seconds between refreshes with --watch (at least 0.5).",
)
@env_file_option(f"Where VLLM_API_KEY lives (mode 0600); {ENV_FILE_HELP}.")
@click.option("--html", "html_path", default=None, hidden=True)  # went: `_html_went` says what replaces it
@click.pass_obj
def status(
    obj,
    as_json: bool,
    every: bool,
    on_change: str | None,
    watch: bool,
    interval: float,
    env_file: Path | None,
    html_path: str | None,
) -> None:
    """Per deployment and node: container, Ray membership, endpoint health and model, serving
    figures, the supervisor, container uptime, MemAvailable."""
    if html_path is not None:
        raise _html_went(obj)
    inv = obj.inventory()
    key = load_secrets(env_file, names=["VLLM_API_KEY"]).get("VLLM_API_KEY")
    if watch and not as_json and sys.stdout.isatty() and _textual():
        from sparkcluster.status import live  # a full-screen view: sparklines, the journal

        watch_ended(live.run(lambda: status_mod.collect_all(inv, key), interval))
        return
    if watch and not as_json:
        from rich.console import Console
        from rich.live import Live

        # rich's highlighter colours numbers, addresses and paths it finds in any text: none of that
        # here, only the colours the table gives states. Ctrl-C ends it as it ends any command (130).
        console = Console(highlight=False)
        if not console.is_terminal:
            plain_frames(lambda: status_mod.collect_all(inv, key), interval)
        with Live(console=console, auto_refresh=False) as live:
            while True:
                live.update(render_all(status_mod.collect_all(inv, key)), refresh=True)
                time.sleep(interval)
    sts = status_mod.collect_all(inv, key)
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
