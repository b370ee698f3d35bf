"""`sparkcluster down [--purge-gcs]`: stop the server, remove sparkcluster's containers."""

from __future__ import annotations

import contextlib

import click

from .. import teardown
from ..errors import ConnectError, EXIT_FAILED
from ..fanout import connect_reachable
from ..lock import ClusterLock
from .main import cli


@cli.command()
@click.option("--purge-gcs", is_flag=True, help="Also remove Ray session state on the hosts and check port 6379 is free.")
@click.pass_obj
def down(obj, purge_gcs: bool) -> None:
    """Stop vllm serve by its PID, then remove sparkcluster's containers, workers before the head."""
    inv = obj.inventory()
    cluster, unreachable = connect_reachable(inv)
    if not cluster.hosts:
        first = next(iter(unreachable.values()))
        raise ConnectError("all nodes", f"no node reachable ({first.message})", first.fix)
    with cluster:
        # the lock lives on the head: without it, the workers are still cleaned
        head_ok = inv.head.name in cluster.hosts
        with ClusterLock(cluster.head, inv.cluster.name, "down") if head_ok else contextlib.nullcontext():
            outcomes = teardown.down(cluster, purge_gcs=purge_gcs)
    nothing = True
    for n in inv.nodes:
        if n.name in unreachable:
            click.echo(f"{n.name}: UNREACHABLE, not cleaned: {unreachable[n.name].message}")
            continue
        o = outcomes[n.name]
        parts = []
        if o.server is not None and o.server.stopped:
            parts.append(str(o.server))
        if o.removed:
            parts.append("removed " + ", ".join(o.removed))
        if o.errors:
            parts.append("ERROR " + "; ".join(o.errors))
        nothing = nothing and not (o.removed or parts)
        click.echo(f"{n.name}: " + ("; ".join(parts) if parts else "nothing of sparkcluster's here"))
    if nothing and not unreachable:
        click.echo(f"{inv.cluster.name} is already down")
    if unreachable or any(not o.ok for o in outcomes.values()):
        click.echo("something may remain: run `sparkcluster down` again once every node answers", err=True)
        raise click.exceptions.Exit(EXIT_FAILED)
