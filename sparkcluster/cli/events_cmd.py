"""`sparkcluster events [--follow] [--json]`: the head supervisor's journal (sparkcluster/node): what it saw
and what it did (started, wedged, restarted, stopped for memory, resumed after a reboot), and where
monitoring runs, the alerts Alertmanager holds."""

from __future__ import annotations

import json
import time

import click

from sparkcluster import redact
from sparkcluster.cli.main import cli
from sparkcluster.deployment import failed_serve, supervision
from sparkcluster.deployment.supervision import journals
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
@click.option(
    "--profile",
    "-p",
    "profile_name",
    default=None,
    help="Only the journal of this profile's deployment (where several share the head node).",
)
@click.pass_obj
def events(obj, follow: bool, last: int, as_json: bool, node: str | None, profile_name: str | None) -> None:
    """The supervisor's journal on the head: what it saw and what it did."""
    inv = obj.inventory()
    head = inv.node(node) if node else inv.head
    host = ConnectedHosts.connect(inv, [head]).hosts[head.name]
    api = host.docker().api
    # each deployment headed here has its own supervisor and journal (issue 60): all of them, each
    # entry marked with its profile where there are several, or the one of --profile
    heads = journals(api, inv.cluster.name, head.name, profile_name)
    if not heads:
        kept = failed_serve.newest()
        what = f"of profile '{profile_name}'" if profile_name else container_name(inv.cluster.name, "head", head.name)
        raise InputError(
            f"no head container {what} on {head.name}: nothing has been started there"
            + (f"; the last failed start's logs are kept in {kept}" if kept else ""),
            f"sparkcluster up --profile {profile_name or 'NAME'}",
        ) from None
    several = len(heads) > 1

    def show(entries: list[dict]) -> None:
        for e in entries:
            text = json.dumps(e) if as_json else supervision.format_entry(e)
            if several and not as_json and e.get("deployment"):
                text = f"[{e['deployment']}] {text}"
            click.echo(redact.mask(text))

    def read() -> list[dict]:
        # with monitoring (sparkcluster monitor up) the alerts Alertmanager holds come in among them
        got = [
            {**e, "deployment": prof} if several else e for name, prof in heads for e in supervision.journal(api, name)
        ]
        return sorted(got + alerting.alerts(api, inv), key=lambda e: e.get("ts", 0))

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
