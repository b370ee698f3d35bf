"""`sparkcluster down [--purge-gcs] [--purge-caches]`: stop the server, remove sparkcluster's containers;
the compile caches stay (a restart loads them) unless --purge-caches."""

from __future__ import annotations

import json

import click

from sparkcluster import redact
from sparkcluster.cli.main import cli
from sparkcluster.down import down_plan
from sparkcluster.down.down_run import execute
from sparkcluster.errors import EXIT_FAILED, EXIT_UNREACHABLE, failure, problem
from sparkcluster.monitor.planned import planned
from sparkcluster.steps.base import dry_run as dry_run_text


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
@click.option("--dry-run", is_flag=True, help="Print the steps it would take (what runs now, read); change nothing.")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="As JSON: the steps (with --dry-run), or per node what was stopped and removed.",
)
@click.pass_obj
def down(
    obj, purge_gcs: bool, purge_caches: bool, node: str | None, profile_name: str | None, dry_run: bool, as_json: bool
) -> None:
    """Stop vllm serve by its PID, then remove sparkcluster's containers, workers before the head;
    every deployment and the gateway, or those on --node / of --profile (the gateway stays)."""
    full = obj.inventory()
    with down_plan.make(full, node, profile_name, purge_gcs, purge_caches) as plan:
        if plan.nothing:
            said = plan.nothing
            click.echo(json.dumps({"ok": True, "message": said, "nodes": []}, indent=2) if as_json else said)
            return
        if dry_run:
            click.echo(dry_run_text(plan.steps(), True) if as_json else plan.render())
            return
        with planned(plan.cluster.hosts, full, plan.touched, "sparkcluster down"):
            outcomes = execute(plan)
    inv, unreachable = plan.inventory, plan.unreachable
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
        body = {"ok": not failed, "nodes": rows}
        if failed:  # the shape of every --json failure, the nodes' rows beside it
            body = {**failure_of(rows, unreachable), **body}
        click.echo(redact.mask(json.dumps(body, indent=2)))
    elif nothing and not unreachable:
        click.echo(f"{inv.cluster.name} is already down")
    if failed:
        click.echo("something may remain: run `sparkcluster down` again once every node answers", err=True)
        # README, "Exit codes": 4 when a node could not be reached, else 1
        raise click.exceptions.Exit(EXIT_UNREACHABLE if unreachable else EXIT_FAILED)


def failure_of(rows: list[dict], unreachable: dict) -> dict:
    """`down`'s failure in the one --json shape: a problem per node not reached or not cleaned."""
    problems = [
        problem(r["node"], r.get("message") or "; ".join(r.get("errors") or []), r.get("fix"))
        for r in rows
        if r["state"] in ("unreachable", "error")
    ]
    code = EXIT_UNREACHABLE if unreachable else EXIT_FAILED
    fix = "run `sparkcluster down` again once every node answers"
    return failure(f"something may remain on {', '.join(p['node'] for p in problems)}", fix, problems, code)
