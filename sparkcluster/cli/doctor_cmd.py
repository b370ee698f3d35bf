"""`sparkcluster doctor`: every preflight check on every node, in parallel."""

from __future__ import annotations

import click
from rich.console import Console

from sparkcluster.checks import preflight, report
from sparkcluster.cli.common import load_profile_for
from sparkcluster.cli.main import cli
from sparkcluster.deployment import known_good
from sparkcluster.errors import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE
from sparkcluster.steps.base import dry_run as dry_run_text


@cli.command()
@click.option(
    "--profile",
    "-p",
    "profile_name",
    default=None,
    help="Judge against this profile (default: the inventory's cluster.profile).",
)
@click.option("--json", "as_json", is_flag=True, help="Print results as JSON.")
@click.option(
    "--fabric",
    is_flag=True,
    help="Also measure the fabric: all_gather, all_reduce and each direction between the nodes, "
    "in containers of the cluster image with the ranks' own environment (fabric.*).",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="With --fabric: run the checks (they change nothing), then print the fabric test's steps and start "
    "no container.",
)
@click.pass_obj
def doctor(obj, profile_name: str | None, as_json: bool, fabric: bool, dry_run: bool) -> None:
    """Check every node for what breaks Spark clusters; a fix for every failure."""
    if dry_run and not fabric:
        raise click.UsageError("--dry-run goes with --fabric (the checks alone change nothing)")
    inv = obj.inventory()
    prof = load_profile_for(inv, profile_name)
    err = Console(stderr=True)
    with err.status(f"gathering facts from {len(inv.nodes)} nodes", spinner="dots"):
        rep, cluster = preflight.run(inv, prof)
    try:
        if fabric:
            from sparkcluster.config.images import image_ref  # only `doctor --fabric` needs these two
            from sparkcluster.fabric import measure  # (the fabric test loads the Docker SDK)

            blocked = measure.preconditions(inv, prof, rep)
            if blocked is not None:
                rep.results.append(blocked)
            else:
                steps = measure.test_steps(cluster, inv, prof, image_ref(inv, prof), rep.facts)
                if dry_run:
                    click.echo(dry_run_text(steps, as_json, [f"doctor --fabric on cluster '{inv.cluster.name}':"]))
                    return
                with err.status(f"fabric test between {len(inv.nodes)} nodes", spinner="dots"):
                    rep.results.extend(measure.walk_test(steps))
    finally:
        if cluster:
            cluster.close()
    # what drifted since the last good serve (issue 39)
    rep.results.extend(
        known_good.doctor_results(
            inv.cluster.name, known_good.load(inv.cluster.name), rep.facts, [n.name for n in inv.nodes]
        )
    )
    # as --help and README promise: 4 when a node could not be reached, else 1 when a check failed
    code = EXIT_UNREACHABLE if rep.unreachable else EXIT_FAILED if rep.failed else EXIT_OK
    if as_json:
        click.echo(report.as_json(rep.results, code))
    else:
        report.table(rep.results, [n.name for n in inv.nodes], Console(soft_wrap=True))
    raise click.exceptions.Exit(code)
