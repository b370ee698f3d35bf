"""`sparkcluster monitor up|down|status|config|dashboards`: Prometheus and Alertmanager on the head, node_exporter on
every node (sparkcluster/monitor). `up` generates the scrape configuration from the inventory and
the deployments running now, so it is run again after `up` of a new deployment; `config` prints
what `up` would write (the webhook masked) without starting anything; `dashboards` copies the
shipped Grafana dashboards to a folder of the owner's."""

from __future__ import annotations

import shutil
from pathlib import Path

import click

from sparkcluster import redact
from sparkcluster.cli.main import cli
from sparkcluster.cli.options import env_file_option
from sparkcluster.config.inventory import Inventory
from sparkcluster.config.secrets import GATEWAY_KEYS, load_secrets, split_keys
from sparkcluster.deployment import deployments, gateway_registry
from sparkcluster.errors import EXIT_FAILED, EXIT_UNREACHABLE, ConnectError, InputError, SparkError
from sparkcluster.monitor import alerting, dashboards, scrape, stack
from sparkcluster.remote.fanout import ConnectedHosts, connect_reachable
from sparkcluster.remote.forward import Forward


@cli.group()
def monitor() -> None:
    """Prometheus, Alertmanager and node_exporter for the cluster: up, down, status, config."""


def _configs(inv: Inventory, served: list, env_file, gateways: dict[str, int]) -> tuple[str, str, bool]:
    webhook = load_secrets(env_file, names=[alerting.WEBHOOK_SECRET]).get(alerting.WEBHOOK_SECRET)
    prom = scrape.render(scrape.prometheus_config(inv, scrape.targets(inv, served, gateways)))
    am = alerting.render(alerting.alertmanager_config(inv, webhook))
    return prom, am, bool(webhook)


def gateway_key(env_file) -> str | None:
    """The key Prometheus shows the gateway's `/metrics`: the first of the gateway's client keys
    (read as `gateway up` reads them), None when there is none."""
    keys = split_keys(load_secrets(env_file, names=[GATEWAY_KEYS]).get(GATEWAY_KEYS))
    return keys[0] if keys else None


def _owners(cluster: ConnectedHosts) -> dict[str, str]:
    got = cluster.each(lambda h: h.run("echo $(id -u):$(id -g)").stdout.strip())
    return {n: o.value for n, o in got.items() if o.ok and o.value}


env_option = env_file_option(
    "A .env (mode 0600) with ALERT_WEBHOOK_URL and GATEWAY_API_KEYS (the first is shown to the gateway's /metrics)."
)


@monitor.command("up")
@env_option
@click.option("--dry-run", is_flag=True, help="Print the containers and their targets; start nothing.")
@click.option("--json", "as_json", is_flag=True, help="As JSON at the end: targets, containers started or not, URLs.")
@click.pass_obj
def monitor_up(obj, env_file, dry_run: bool, as_json: bool) -> None:
    """Start (or replace) the monitoring containers with a configuration made from what runs now."""
    import json

    say = (lambda text: click.echo(text, err=True)) if as_json else click.echo  # stdout: one JSON object
    inv = obj.inventory()
    cluster, unreachable = connect_reachable(inv)
    with cluster:
        if inv.head.name not in cluster.hosts:
            err = unreachable[inv.head.name]
            # a node out of reach is exit 4 (README, "Exit codes"), not bad input
            why = err.message.removeprefix(f"{inv.head.name}: ")
            raise ConnectError(inv.head.name, f"the head does not answer: {why}", err.fix)
        found, unread = deployments.on(cluster, inv)
        served = scrape.served(inv, found)
        gateways = gateway_registry.ports(cluster.hosts, inv.cluster.name)
        prom, am, webhook = _configs(inv, served, env_file, gateways)
        key = gateway_key(env_file)
        specs = stack.specs(inv, prom, am, _owners(cluster), key)
        targets = scrape.targets(inv, served, gateways)
        for t in targets:
            say(f"target {t.job} {t.address} ({', '.join(f'{k}={v}' for k, v in t.labels.items())})")
        if not webhook:
            say("no ALERT_WEBHOOK_URL: alerts stay in Alertmanager and `sparkcluster events`")
        if gateways and key is None:
            say(f"no {GATEWAY_KEYS}: the gateway's /metrics refuses Prometheus (401) until monitor up has one")
        if dry_run:
            for s in specs:
                say(redact.mask(s.describe()))
            if as_json:
                click.echo(json.dumps({"ok": True, "dry_run": True, "targets": [t.address for t in targets]}, indent=2))
            return
        started = cluster.each(
            lambda h: [stack.start(h.docker().api, inv, s) for s in specs if s.node == h.name],
        )
    bad = False
    rows = []
    for s in specs:
        o = started.get(s.node)
        if o is not None and o.ok:
            rows.append({"node": s.node, "component": s.component, "image": s.image, "started": True, "error": None})
            say(f"{s.node}: {s.component} started ({s.image})")
        else:
            bad = True
            why = unreachable[s.node].message if s.node in unreachable else str(o.error if o else "not reached")
            rows.append({"node": s.node, "component": s.component, "image": s.image, "started": False, "error": why})
            say(f"{s.node}: {s.component} NOT started: {redact.mask(why)}")
    for n, why in unread.items():
        say(f"{n}: its deployments could not be read ({why}): its engine is not scraped")
    ip = scrape.reach_ip(inv, inv.head.name)
    urls = {
        "prometheus": f"http://{ip}:{inv.monitor.prometheus_port}",
        "alertmanager": f"http://{ip}:{inv.monitor.alertmanager_port}",
    }
    say(f"Prometheus {urls['prometheus']}  Alertmanager {urls['alertmanager']}")
    if as_json:
        body = {"ok": not bad, **urls, "targets": [t.address for t in targets], "containers": rows}
        click.echo(redact.mask(json.dumps(body, indent=2)))
    if bad:  # README, "Exit codes": 4 when a node could not be reached, else 1
        raise click.exceptions.Exit(EXIT_UNREACHABLE if unreachable else EXIT_FAILED)


@monitor.command("down")
@click.option("--purge-data", is_flag=True, help="Also remove Prometheus' and Alertmanager's data volumes.")
@click.option("--json", "as_json", is_flag=True, help="As JSON: per node what was removed, or why not.")
@click.pass_obj
def monitor_down(obj, purge_data: bool, as_json: bool) -> None:
    """Remove the monitoring containers on every node (their data stays unless --purge-data)."""
    inv = obj.inventory()
    cluster, unreachable = connect_reachable(inv)
    with cluster:
        done = cluster.each(lambda h: stack.down(h.docker().api, inv, purge_data and h.name == inv.head.name))
    rows = []
    for n in inv.nodes:
        o = done.get(n.name)
        if n.name in unreachable or o is None:
            rows.append({"node": n.name, "state": "unreachable", "removed": []})
        elif not o.ok:
            rows.append({"node": n.name, "state": "error", "error": str(o.error), "removed": []})
        else:
            rows.append({"node": n.name, "state": "removed" if o.value else "nothing", "removed": list(o.value)})
    failed = bool(unreachable) or any(not o.ok for o in done.values())
    if as_json:
        import json

        click.echo(redact.mask(json.dumps({"ok": not failed, "nodes": rows}, indent=2)))
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
        raise click.exceptions.Exit(EXIT_UNREACHABLE if unreachable else EXIT_FAILED)


def summary(targets: dict, alerts: dict) -> tuple[list[dict], list[dict]]:
    """Prometheus' /api/v1/targets and /api/v1/alerts -> (each target: job, address, health, error;
    each firing alert: name, labels, since)."""
    rows = [
        {
            "job": t.get("labels", {}).get("job", "?"),
            "address": t.get("labels", {}).get("instance") or t.get("scrapeUrl", "?"),
            "health": t.get("health", "unknown"),
            "error": t.get("lastError", ""),
        }
        for t in (targets.get("data") or {}).get("activeTargets", [])
    ]
    firing = [
        {
            "name": a.get("labels", {}).get("alertname", "?"),
            "labels": {k: v for k, v in a.get("labels", {}).items() if k != "alertname"},
            "since": a.get("activeAt", ""),
        }
        for a in (alerts.get("data") or {}).get("alerts", [])
        if a.get("state") == "firing"
    ]
    return rows, firing


@monitor.command("status")
@click.option("--json", "as_json", is_flag=True, help="As JSON.")
@click.pass_obj
def monitor_status(obj, as_json: bool) -> None:
    """Where Prometheus and Alertmanager answer, each scrape target up or down, the alerts firing.

    Exit 0 when every target is up and none fires, 1 otherwise (or when monitoring is not running),
    4 when a node cannot be reached."""
    import json

    import httpx

    inv = obj.inventory()
    cluster, unreachable = connect_reachable(inv)
    ip = scrape.reach_ip(inv, inv.head.name)
    urls = {
        "prometheus": f"http://{ip}:{inv.monitor.prometheus_port}",
        "alertmanager": f"http://{ip}:{inv.monitor.alertmanager_port}",
    }
    with cluster:
        if inv.head.name not in cluster.hosts:
            err = unreachable[inv.head.name]
            raise ConnectError(
                inv.head.name, f"the head does not answer: {err.message.removeprefix(inv.head.name + ': ')}", err.fix
            )
        head = cluster.hosts[inv.head.name]
        containers = {
            n: sorted(
                (c.get("Names") or ["?"])[0].lstrip("/") + f" {c.get('State')}" for c in stack.ours(h.docker().api, inv)
            )
            for n, h in cluster.hosts.items()
        }
        if not stack.running(head.docker().api, inv, stack.PROMETHEUS):
            raise SparkError(f"Prometheus does not run on {inv.head.name}", "start monitoring: sparkcluster monitor up")
        # asked through the head's SSH connection: the laptop may not reach the control address
        with Forward(lambda: head.tunnel(ip, inv.monitor.prometheus_port)) as fwd:
            try:
                got = [httpx.get(f"{fwd.url()}/api/v1/{what}", timeout=5).json() for what in ("targets", "alerts")]
            except (httpx.HTTPError, ValueError) as e:
                raise SparkError(
                    f"Prometheus on {inv.head.name} does not answer ({type(e).__name__})",
                    "restart it: sparkcluster monitor up",
                ) from None
    rows, firing = summary(*got)
    gone = [{"node": n, "state": "unreachable", "message": e.message, "fix": e.fix} for n, e in unreachable.items()]
    if as_json:
        body = {**urls, "containers": containers, "targets": rows, "firing": firing, "unreachable": gone}
        click.echo(redact.mask(json.dumps(body, indent=2)))
    else:
        click.echo(f"Prometheus {urls['prometheus']}  Alertmanager {urls['alertmanager']}")
        for n, cs in containers.items():
            click.echo(f"{n}: {', '.join(cs) or 'no monitoring container'}")
        for g in gone:
            click.echo(f"{g['node']}: UNREACHABLE, not looked at: {g['message']}")
        up = sum(r["health"] == "up" for r in rows)
        click.echo(f"targets: {up} of {len(rows)} up")
        for r in rows:
            if r["health"] != "up":
                click.echo(f"  {r['job']} {r['address']}: {r['health'].upper()} {r['error']}".rstrip())
        click.echo(f"alerts firing: {len(firing) or 'none'}")
        for a in firing:
            labels = ", ".join(f"{k}={v}" for k, v in a["labels"].items())
            click.echo(f"  {a['name']} ({labels}) since {a['since']}")
    if unreachable:
        raise click.exceptions.Exit(EXIT_UNREACHABLE)
    if firing or any(r["health"] != "up" for r in rows):
        raise click.exceptions.Exit(EXIT_FAILED)


@monitor.command("config")
@env_option
@click.option("--alertmanager", is_flag=True, help="Alertmanager's configuration instead of Prometheus'.")
@click.pass_obj
def monitor_config(obj, env_file, alertmanager: bool) -> None:
    """Print the configuration `monitor up` writes for the inventory alone (no deployment: offline)."""
    inv = obj.inventory()
    prom, am, _ = _configs(inv, [], env_file, {})
    click.echo(redact.mask(am if alertmanager else prom))


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
