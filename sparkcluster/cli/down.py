"""`sparkcluster down [--purge-gcs]`: stop the server, remove sparkcluster's containers."""

from __future__ import annotations

import click

from .. import teardown
from ..errors import ConnectError, EXIT_FAILED, SparkError
from ..fanout import Cluster, connect_all
from ..lock import ClusterLock
from .main import cli


@cli.command()
@click.option("--purge-gcs", is_flag=True, help="Also remove Ray session state on the hosts and check port 6379 is free.")
@click.pass_obj
def down(obj, purge_gcs: bool) -> None:
    """Stop vllm serve by its PID, then remove sparkcluster's containers, workers before the head."""
    inv = obj.inventory()
    res = connect_all(inv)
    unreachable = {n: e for n, e in res.failed.items()}
    for e in unreachable.values():
        if not isinstance(e, SparkError):
            raise e
    if not res.succeeded:
        first = next(iter(unreachable.values()))
        raise ConnectError("all nodes", f"no node reachable ({first.message})", first.fix)
    cluster = Cluster(inv, res.succeeded)
    with cluster:
        head_ok = inv.head.name in cluster.hosts
        lock = ClusterLock(cluster.head, inv.cluster.name, "down") if head_ok else None
        if lock:
            lock.__enter__()
        try:
            outcomes = teardown.down(cluster, purge_gcs=purge_gcs)
        finally:
            if lock:
                lock.__exit__(None, None, None)
    nothing = True
    for n in inv.nodes:
        if n.name in unreachable:
            click.echo(f"{n.name}: UNREACHABLE, not cleaned: {unreachable[n.name].message}")
            continue
        o = outcomes[n.name]
        parts = []
        if o.server and o.server not in ("no container", "container not running", "no server recorded", "server not running"):
            parts.append(o.server)
        if o.removed:
            parts.append("removed " + ", ".join(o.removed))
        if o.error:
            parts.append("ERROR " + o.error)
        nothing = nothing and not (o.removed or parts)
        click.echo(f"{n.name}: " + ("; ".join(parts) if parts else "nothing of sparkcluster's here"))
    if nothing and not unreachable:
        click.echo(f"{inv.cluster.name} is already down")
    if unreachable or any(o.error for o in outcomes.values()):
        click.echo("something may remain: run `sparkcluster down` again once every node answers", err=True)
        raise click.exceptions.Exit(EXIT_FAILED)
