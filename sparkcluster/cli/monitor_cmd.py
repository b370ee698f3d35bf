"""`sparkcluster monitor up|down|config`: Prometheus and Alertmanager on the head, node_exporter on
every node (sparkcluster/monitor). `up` generates the scrape configuration from the inventory and
the deployments running now, so it is run again after `up` of a new deployment; `config` prints
what `up` would write (the webhook masked) without starting anything."""

from __future__ import annotations

import click

from sparkcluster import redact
from sparkcluster.cli.main import cli
from sparkcluster.cli.options import env_file_option
from sparkcluster.config.inventory import Inventory
from sparkcluster.config.secrets import load_secrets
from sparkcluster.deployment import deployments, gateway_registry
from sparkcluster.errors import EXIT_FAILED, ConnectError
from sparkcluster.monitor import alerting, scrape, stack
from sparkcluster.remote.fanout import ConnectedHosts, connect_reachable


@cli.group()
def monitor() -> None:
    """Prometheus, Alertmanager and node_exporter for the cluster: up, down, config."""


def _configs(inv: Inventory, served: list, env_file, gateways: dict[str, int]) -> tuple[str, str, bool]:
    webhook = load_secrets(env_file, names=[alerting.WEBHOOK_SECRET]).get(alerting.WEBHOOK_SECRET)
    prom = scrape.render(scrape.prometheus_config(inv, scrape.targets(inv, served, gateways)))
    am = alerting.render(alerting.alertmanager_config(inv, webhook))
    return prom, am, bool(webhook)


def _owners(cluster: ConnectedHosts) -> dict[str, str]:
    got = cluster.each(lambda h: h.run("echo $(id -u):$(id -g)").stdout.strip())
    return {n: o.value for n, o in got.items() if o.ok and o.value}


env_option = env_file_option("A .env (mode 0600) with ALERT_WEBHOOK_URL (default: as for up).")


@monitor.command("up")
@env_option
@click.option("--dry-run", is_flag=True, help="Print the containers and their targets; start nothing.")
@click.pass_obj
def monitor_up(obj, env_file, dry_run: bool) -> None:
    """Start (or replace) the monitoring containers with a configuration made from what runs now."""
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
        specs = stack.specs(inv, prom, am, _owners(cluster))
        for t in scrape.targets(inv, served, gateways):
            click.echo(f"target {t.job} {t.address} ({', '.join(f'{k}={v}' for k, v in t.labels.items())})")
        if not webhook:
            click.echo("no ALERT_WEBHOOK_URL: alerts stay in Alertmanager and `sparkcluster events`")
        if dry_run:
            for s in specs:
                click.echo(redact.mask(s.describe()))
            return
        started = cluster.each(
            lambda h: [stack.start(h.docker().api, inv, s) for s in specs if s.node == h.name],
        )
    bad = False
    for s in specs:
        o = started.get(s.node)
        if o is not None and o.ok:
            click.echo(f"{s.node}: {s.component} started ({s.image})")
        else:
            bad = True
            why = unreachable[s.node].message if s.node in unreachable else str(o.error if o else "not reached")
            click.echo(f"{s.node}: {s.component} NOT started: {redact.mask(why)}")
    for n, why in unread.items():
        click.echo(f"{n}: its deployments could not be read ({why}): its engine is not scraped")
    ip = scrape.reach_ip(inv, inv.head.name)
    click.echo(
        f"Prometheus http://{ip}:{inv.monitor.prometheus_port}  Alertmanager http://{ip}:{inv.monitor.alertmanager_port}"
    )
    if bad:
        raise click.exceptions.Exit(EXIT_FAILED)


@monitor.command("down")
@click.option("--purge-data", is_flag=True, help="Also remove Prometheus' and Alertmanager's data volumes.")
@click.pass_obj
def monitor_down(obj, purge_data: bool) -> None:
    """Remove the monitoring containers on every node (their data stays unless --purge-data)."""
    inv = obj.inventory()
    cluster, unreachable = connect_reachable(inv)
    with cluster:
        done = cluster.each(lambda h: stack.down(h.docker().api, inv, purge_data and h.name == inv.head.name))
    for n in inv.nodes:
        o = done.get(n.name)
        if n.name in unreachable or o is None:
            click.echo(f"{n.name}: UNREACHABLE, not cleaned")
        elif not o.ok:
            click.echo(f"{n.name}: ERROR {o.error}")
        else:
            click.echo(f"{n.name}: " + ("removed " + ", ".join(o.value) if o.value else "no monitoring here"))
    if unreachable or any(not o.ok for o in done.values()):
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
