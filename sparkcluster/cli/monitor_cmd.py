"""`sparkcluster monitor up|down|status|config|dashboards`: Prometheus and Alertmanager on the head, node_exporter on
every node (sparkcluster/monitor). `up` generates the scrape configuration from the inventory and
the deployments running now, so it is run again after `up` of a new deployment; `config` prints
what `up` would write (the webhook masked) without starting anything; `dashboards` copies the
shipped Grafana dashboards to a folder of the owner's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import click

from sparkcluster import redact
from sparkcluster.cli import monitor_read_cmd
from sparkcluster.cli.main import cli
from sparkcluster.cli.options import env_file_option
from sparkcluster.config.secrets import GATEWAY_KEYS, load_secrets, split_keys
from sparkcluster.errors import EXIT_FAILED, EXIT_UNREACHABLE, InputError, SparkError, failure, problem
from sparkcluster.monitor import alerting, dashboards, monitor_steps, scrape
from sparkcluster.steps.base import dry_run as dry_run_text


@cli.group()
def monitor() -> None:
    """Prometheus, Alertmanager and node_exporter for the cluster: up, down, status, config."""


def gateway_key(env_file) -> str | None:
    """The key Prometheus shows the gateway's `/metrics`: the first of the gateway's client keys
    (read as `gateway up` reads them), None when there is none."""
    keys = split_keys(load_secrets(env_file, names=[GATEWAY_KEYS]).get(GATEWAY_KEYS))
    return keys[0] if keys else None


env_option = env_file_option(
    "A .env (mode 0600) with ALERT_WEBHOOK_URL and GATEWAY_API_KEYS (the first is shown to the gateway's /metrics)."
)


@monitor.command("up")
@env_option
@click.option("--dry-run", is_flag=True, help="Print the targets and the steps (a container each); start nothing.")
@click.option(
    "--json", "as_json", is_flag=True, help="As JSON: the steps (with --dry-run), or targets, containers started, URLs."
)
@click.pass_obj
def monitor_up(obj, env_file, dry_run: bool, as_json: bool) -> None:
    """Start (or replace) the monitoring containers with a configuration made from what runs now."""
    say = (lambda text: click.echo(text, err=True)) if as_json else click.echo  # stdout: one JSON object
    inv = obj.inventory()
    webhook = load_secrets(env_file, names=[alerting.WEBHOOK_SECRET]).get(alerting.WEBHOOK_SECRET)
    key = gateway_key(env_file)
    with monitor_steps.up(inv, webhook, key) as m:
        for t in m.targets:
            say(f"target {t.job} {t.address} ({', '.join(f'{k}={v}' for k, v in t.labels.items())})")
        if not webhook:
            say("no ALERT_WEBHOOK_URL: alerts stay in Alertmanager and `sparkcluster events`")
        if m.gateways and key is None:
            say(f"no {GATEWAY_KEYS}: the gateway's /metrics refuses Prometheus (401) until monitor up has one")
        if dry_run:
            click.echo(dry_run_text(m.steps, as_json, [f"monitor up on cluster '{inv.cluster.name}':"]))
            return
        got = m.walk()
    bad = False
    rows = []
    for s in m.specs:
        value = got.get(f"{monitor_steps.STAGE}/{s.node}/{s.component}")
        if isinstance(value, str) and not value.startswith(monitor_steps.FAILED):
            rows.append({"node": s.node, "component": s.component, "image": s.image, "started": True, "error": None})
            say(f"{s.node}: {s.component} started ({s.image})")
        else:
            bad = True
            why = (
                m.unreachable[s.node].message
                if s.node in m.unreachable
                else str(value).removeprefix(monitor_steps.FAILED)
                if value
                else "not reached"
            )
            rows.append({"node": s.node, "component": s.component, "image": s.image, "started": False, "error": why})
            say(f"{s.node}: {s.component} NOT started: {redact.mask(why)}")
    for n, why in m.unread.items():
        say(f"{n}: its deployments could not be read ({why}): its engine is not scraped")
    ip = scrape.reach_ip(inv, inv.head.name)
    urls = {
        "prometheus": f"http://{ip}:{inv.monitor.prometheus_port}",
        "alertmanager": f"http://{ip}:{inv.monitor.alertmanager_port}",
    }
    say(f"Prometheus {urls['prometheus']}  Alertmanager {urls['alertmanager']}")
    code = EXIT_UNREACHABLE if m.unreachable else EXIT_FAILED
    if as_json:
        body = {"ok": not bad, **urls, "targets": [t.address for t in m.targets], "containers": rows}
        if bad:  # the shape of every --json failure, the containers' rows beside it
            problems = [
                problem(r["node"], f"{r['component']} not started: {r['error']}") for r in rows if not r["started"]
            ]
            fix = "run `sparkcluster monitor up` again once every node answers"
            body = {**failure("monitoring did not start everywhere", fix, problems, code), **body}
        click.echo(redact.mask(json.dumps(body, indent=2)))
    if bad:  # README, "Exit codes": 4 when a node could not be reached, else 1
        raise click.exceptions.Exit(code)


@monitor.command("down")
@click.option("--purge-data", is_flag=True, help="Also remove Prometheus' and Alertmanager's data volumes.")
@click.option("--dry-run", is_flag=True, help="Print the steps (each node's containers to remove); change nothing.")
@click.option(
    "--json", "as_json", is_flag=True, help="As JSON: the steps (with --dry-run), or per node what was removed."
)
@click.pass_obj
def monitor_down(obj, purge_data: bool, dry_run: bool, as_json: bool) -> None:
    """Remove the monitoring containers on every node (their data stays unless --purge-data)."""
    inv = obj.inventory()
    with monitor_steps.down(inv, purge_data) as m:
        if dry_run:
            click.echo(dry_run_text(m.steps, as_json, [f"monitor down on cluster '{inv.cluster.name}':"]))
            return
        got = m.walk()
    rows = []
    for n in inv.nodes:
        value = got.get(f"{monitor_steps.STAGE}/{n.name}/remove", [])
        if n.name in m.unreachable:
            e = m.unreachable[n.name]
            rows.append({"node": n.name, "state": "unreachable", "removed": [], "error": e.message, "fix": e.fix})
        elif isinstance(value, str):
            rows.append(
                {"node": n.name, "state": "error", "error": value.removeprefix(monitor_steps.FAILED), "removed": []}
            )
        else:
            rows.append({"node": n.name, "state": "removed" if value else "nothing", "removed": list(value)})
    failed = any(r["state"] in ("unreachable", "error") for r in rows)
    code = EXIT_UNREACHABLE if m.unreachable else EXIT_FAILED
    if as_json:
        body = {"ok": not failed, "nodes": rows}
        if failed:  # the shape of every --json failure, the nodes' rows beside it
            problems = [
                problem(r["node"], r["error"], r.get("fix")) for r in rows if r["state"] in ("unreachable", "error")
            ]
            fix = "run `sparkcluster monitor down` again once every node answers"
            body = {
                **failure("monitoring may remain on " + ", ".join(p["node"] for p in problems), fix, problems, code),
                **body,
            }
        click.echo(redact.mask(json.dumps(body, indent=2)))
    for r in [] if as_json else rows:
        if r["state"] == "unreachable":
            click.echo(f"{r['node']}: UNREACHABLE, not cleaned")
        elif r["state"] == "error":
            click.echo(f"{r['node']}: ERROR {r['error']}")
        else:
            click.echo(
                f"{r['node']}: " + ("removed " + ", ".join(r["removed"]) if r["removed"] else "no monitoring here")
            )
    if failed:
        raise click.exceptions.Exit(code)


@monitor.command("config")
@env_option
@click.option("--alertmanager", is_flag=True, help="Alertmanager's configuration instead of Prometheus'.")
@click.pass_obj
def monitor_config(obj, env_file, alertmanager: bool) -> None:
    """Print the configuration `monitor up` writes for the inventory alone (no deployment: offline)."""
    inv = obj.inventory()
    webhook = load_secrets(env_file, names=[alerting.WEBHOOK_SECRET]).get(alerting.WEBHOOK_SECRET)
    prom, am = monitor_steps.configs(inv, [], webhook, {})
    click.echo(redact.mask(am if alertmanager else prom))


# the read-only subcommand (status) connects by itself: its own module
monitor.add_command(monitor_read_cmd.monitor_status)


@monitor.command("dashboards")
@click.option(
    "--out",
    "out",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="The folder to write them to (made if missing); an existing file is never overwritten.",
)
def monitor_dashboards(out: Path) -> None:
    """Copy the Grafana dashboards and provisioning files that ship with sparkcluster into a folder."""
    shipped_files = sorted(p for p in dashboards.HERE.rglob("*") if p.is_file())
    if not shipped_files:
        raise SparkError(
            f"no dashboards in this install ({dashboards.HERE})", "reinstall sparkcluster (README, Install)"
        )
    targets = [(p, out / p.relative_to(dashboards.HERE)) for p in shipped_files]
    there = [str(t) for _, t in targets if t.exists()]
    if there:
        raise InputError(
            f"{there[0]} exists" + (f" (and {len(there) - 1} more)" if len(there) > 1 else "") + ": not overwritten",
            "give --out a new folder, or remove those files first",
        )
    for source, target in targets:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        click.echo(str(target))
    click.echo(
        f"next: set the datasource's url in {out / 'provisioning/datasources/sparkcluster.yml'} to "
        "http://HEAD_CONTROL_IP:9090 (the head's control_ip), copy provisioning/ into Grafana's provisioning "
        "folder and dashboards/ to /var/lib/grafana/dashboards/sparkcluster",
        err=True,
    )
