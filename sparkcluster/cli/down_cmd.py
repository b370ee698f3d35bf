"""`sparkcluster down [--purge-gcs] [--purge-caches]`: stop the server, remove sparkcluster's containers;
the compile caches stay (a restart loads them) unless --purge-caches."""

from __future__ import annotations

import json

import click

from sparkcluster import redact
from sparkcluster.cli.main import cli
from sparkcluster.deployment import deployments, teardown
from sparkcluster.errors import EXIT_FAILED, EXIT_UNREACHABLE, SparkError
from sparkcluster.facts.access import learn_homes
from sparkcluster.monitor.planned import planned
from sparkcluster.remote.fanout import ConnectedHosts, connect_reachable, unreachable_error
from sparkcluster.remote.lock import NodeLocks


def _refuse_unknown(node: str | None, profile_name: str | None, chosen: list, unknown: dict[str, str]) -> None:
    """`down --node X` (or `--profile P`) where what runs cannot be read: never "no deployment"."""
    if node and node in unknown:
        raise SparkError(
            f"{node}: cannot tell what runs there, so nothing was taken down: {unknown[node]}",
            f"check that {node} answers (ssh, then `docker ps` there), then sparkcluster down --node {node}",
        )
    if profile_name and unknown and not chosen:
        names = ", ".join(f"{n} ({why})" for n, why in sorted(unknown.items()))
        raise SparkError(
            f"no deployment of '{profile_name}' on the nodes that answer; cannot read {names}",
            f"check those nodes, then sparkcluster down --profile {profile_name}",
        )


@cli.command()
@click.option(
    "--purge-gcs", is_flag=True, help="Also remove Ray session state on the hosts and check port 6379 is free."
)
@click.option(
    "--purge-caches",
    is_flag=True,
    help="Also remove the compile caches (torch.compile, inductor, Triton, FlashInfer) on the nodes taken down.",
)
@click.option("--node", default=None, help="Only the deployment(s) on this node (a pair it belongs to goes whole).")
@click.option("--profile", "-p", "profile_name", default=None, help="Only the deployment(s) of this profile.")
@click.option("--json", "as_json", is_flag=True, help="As JSON: per node what was stopped and removed, or why not.")
@click.pass_obj
def down(obj, purge_gcs: bool, purge_caches: bool, node: str | None, profile_name: str | None, as_json: bool) -> None:
    """Stop vllm serve by its PID, then remove sparkcluster's containers, workers before the head;
    every deployment and the gateway, or those on --node / of --profile (the gateway stays)."""
    full = obj.inventory()
    if node:
        full.node(node)  # an unknown name is an input error
    cluster, unreachable = connect_reachable(full)
    if not cluster.hosts:
        raise unreachable_error(unreachable)
    with cluster:
        found, unread = deployments.on(cluster, full)
        chosen = deployments.select(found, node, profile_name)
        everything = node is None and profile_name is None
        if not everything:
            _refuse_unknown(node, profile_name, chosen, {**{n: e.message for n, e in unreachable.items()}, **unread})
        names = sorted({x for d in chosen for x in d.nodes} | ({n.name for n in full.nodes} if everything else set()))
        inv = full.only(names) if names else full
        if not names:
            said = "no deployment " + " ".join(
                x for x in (f"on {node}" if node else "", f"of '{profile_name}'" if profile_name else "") if x
            )
            click.echo(json.dumps({"ok": True, "message": said, "nodes": []}, indent=2) if as_json else said)
            return
        reachable = [n for n in inv.nodes if n.name in cluster.hosts]
        with (
            NodeLocks(cluster, full.only([n.name for n in reachable]), "down"),
            planned(cluster.hosts, full, [n.name for n in inv.nodes], "sparkcluster down"),
        ):
            outcomes = {}
            for d in chosen:  # each deployment by itself: its own head's server stopped first
                sub = d.inventory(full)
                hosts = {n: h for n, h in cluster.hosts.items() if n in d.nodes}
                # its own containers only: another deployment may share its nodes (issue 60)
                for n, o in teardown.down(ConnectedHosts(sub, hosts), only_ids=d.ids or None).items():
                    if n in outcomes:
                        outcomes[n].removed += o.removed
                        outcomes[n].errors += o.errors
                        outcomes[n].server = outcomes[n].server or o.server
                    else:
                        outcomes[n] = o
            if everything:  # and whatever else carries our label (a killed run's leftovers)
                for n, o in teardown.down(
                    ConnectedHosts(inv, cluster.hosts), purge_gcs=purge_gcs, gateway=True
                ).items():
                    if n in outcomes:
                        outcomes[n].removed += o.removed
                        outcomes[n].errors += o.errors
                    else:
                        outcomes[n] = o
            if purge_caches:  # the containers are gone: nothing writes there any more
                cached = ConnectedHosts(inv, {n.name: cluster.hosts[n.name] for n in reachable})
                learn_homes(cached)
                for n, (removed, errors) in teardown.purge_caches(cached).items():
                    o = outcomes.setdefault(n, teardown.NodeTeardown(n))
                    o.removed += removed
                    o.errors += errors
    nothing = True
    rows = []
    for n in inv.nodes:
        if n.name in unreachable:
            msg = unreachable[n.name].message
            rows.append({"node": n.name, "state": "unreachable", "message": msg, "fix": unreachable[n.name].fix})
            if not as_json:
                click.echo(f"{n.name}: UNREACHABLE, not cleaned: {msg}")
            continue
        o = outcomes.get(n.name)
        if o is None:
            continue
        parts = []
        if o.server is not None and o.server.stopped:
            parts.append(str(o.server))
        if o.removed:
            parts.append("removed " + ", ".join(o.removed))
        if o.errors:
            parts.append("ERROR " + "; ".join(o.errors))
        nothing = nothing and not (o.removed or parts)
        rows.append(
            {
                "node": n.name,
                "state": "error" if o.errors else "cleaned" if parts else "nothing",
                "server": str(o.server) if o.server is not None and o.server.stopped else None,
                "removed": list(o.removed),
                "errors": list(o.errors),
            }
        )
        if not as_json:
            click.echo(f"{n.name}: " + ("; ".join(parts) if parts else "nothing of sparkcluster's here"))
    failed = bool(unreachable) or any(not o.ok for o in outcomes.values())
    if as_json:
        click.echo(redact.mask(json.dumps({"ok": not failed, "nodes": rows}, indent=2)))
    elif nothing and not unreachable:
        click.echo(f"{inv.cluster.name} is already down")
    if failed:
        click.echo("something may remain: run `sparkcluster down` again once every node answers", err=True)
        # README, "Exit codes": 4 when a node could not be reached, else 1
        raise click.exceptions.Exit(EXIT_UNREACHABLE if unreachable else EXIT_FAILED)
