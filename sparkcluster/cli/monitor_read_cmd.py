"""`sparkcluster monitor status`: where Prometheus and Alertmanager answer, each target up or down,
the alerts firing. It reads the nodes and changes nothing; `monitor_cmd` adds it to its group."""

from __future__ import annotations

import click

from sparkcluster import redact
from sparkcluster.errors import EXIT_FAILED, EXIT_UNREACHABLE, ConnectError, SparkError
from sparkcluster.monitor import scrape, stack
from sparkcluster.remote.fanout import connect_reachable
from sparkcluster.remote.forward import Forward


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


@click.command("status")
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
