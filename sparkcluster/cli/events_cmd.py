"""`sparkcluster events [--follow] [--json]`: the head supervisor's journal (sparkcluster/node): what it saw
and what it did (started, wedged, restarted, stopped for memory, resumed after a reboot), and where
monitoring runs, the alerts Alertmanager holds."""

from __future__ import annotations

import json
import time

import click
import docker.errors

from sparkcluster import redact
from sparkcluster.cli.main import cli
from sparkcluster.deployment import failed_serve, supervision
from sparkcluster.errors import InputError
from sparkcluster.labels import container_name
from sparkcluster.monitor import alerting
from sparkcluster.remote.fanout import ConnectedHosts


@cli.command()
@click.option(
    "--follow", "-f", is_flag=True, help="Keep printing new entries until Ctrl-C (which never stops anything)."
)
@click.option("--last", default=50, show_default=True, type=click.IntRange(min=0), help="Entries to start from.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per entry.")
@click.option(
    "--node",
    default=None,
    help="The deployment's head node (a one-node deployment's node); default: the inventory's head.",
)
@click.pass_obj
def events(obj, follow: bool, last: int, as_json: bool, node: str | None) -> None:
    """The supervisor's journal on the head: what it saw and what it did."""
    inv = obj.inventory()
    head = inv.node(node) if node else inv.head
    host = ConnectedHosts.connect(inv, [head]).hosts[head.name]
    name = container_name(inv.cluster.name, "head", head.name)
    api = host.docker().api
    try:
        api.inspect_container(name)
    except docker.errors.NotFound:
        kept = failed_serve.newest()
        raise InputError(
            f"no head container {name} on {head.name}: nothing has been started there"
            + (f"; the last failed start's logs are kept in {kept}" if kept else ""),
            "sparkcluster up --profile NAME",
        ) from None

    def show(entries: list[dict]) -> None:
        for e in entries:
            click.echo(redact.mask(json.dumps(e) if as_json else supervision.format_entry(e)))

    def read() -> list[dict]:
        # with monitoring (sparkcluster monitor up) the alerts Alertmanager holds come in among them
        return sorted(supervision.journal(api, name) + alerting.alerts(api, inv), key=lambda e: e.get("ts", 0))

    entries = read()
    show(entries[-last:] if last else entries)
    seen = entries[-1]["ts"] if entries else 0.0
    try:
        while follow:
            time.sleep(1.0)
            new = [e for e in read() if e.get("ts", 0) > seen]
            if new:
                show(new)
                seen = new[-1]["ts"]
    except KeyboardInterrupt:
        pass
    finally:
        host.close()
