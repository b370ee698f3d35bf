"""`sparkcluster fabric resume [--dry-run]`: bring a deployment the fabric holds out of the gateway's
rotation back now, rather than after the profile's healthy looks (the plan and its steps:
deployment/fabric_resume)."""

from __future__ import annotations

import json

import click

from sparkcluster.cli.main import cli
from sparkcluster.deployment import fabric_resume
from sparkcluster.steps.base import dry_run as dry_run_text


@cli.group()
def fabric() -> None:
    """The data-plane fabric while serving: end a fabric hold (sparkcluster status shows one)."""


@fabric.command()
@click.option("--dry-run", is_flag=True, help="Print the steps that would run, then stop.")
@click.option("--json", "as_json", is_flag=True, help="The steps (with --dry-run) or what was marked, as JSON.")
@click.option("--node", default=None, help="The deployments' head node; default: the inventory's head.")
@click.option("--profile", "-p", "profile_name", default=None, help="Only this profile's deployment.")
@click.pass_obj
def resume(obj, dry_run: bool, as_json: bool, node: str | None, profile_name: str | None) -> None:
    """Bring a deployment held out of rotation for its fabric back now."""
    inv = obj.inventory()
    with fabric_resume.resume(inv, node, profile_name) as plan:
        if dry_run:
            click.echo(dry_run_text(plan.steps, as_json, [f"fabric resume on cluster '{inv.cluster.name}':"]))
            return
        marked = plan.walk()
    if as_json:
        click.echo(json.dumps({"ok": True, "marked": marked}, indent=2))
    else:
        click.echo(
            f"marked {', '.join(marked)}: the supervisor ends a fabric hold at its next look (sparkcluster events)"
        )
