"""`sparkcluster upgrade --profile P --image NEW` (or `--revision`): the new serve kept only once its
canary and bench hold, else the last good serve back by itself (`upgrade/upgrade`)."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console

from sparkcluster.cli.common import profile_or_usage
from sparkcluster.cli.main import cli
from sparkcluster.cli.options import env_file_option
from sparkcluster.cli.up_cmd import RichProgress, run_up, with_api_key
from sparkcluster.config.images import check_dockerfile
from sparkcluster.config.secrets import load_secrets
from sparkcluster.upgrade import upgrade as upgrades


def print_plan(plan: upgrades.UpgradePlan, as_json: bool) -> None:
    click.echo(json.dumps(plan.as_json(), indent=2) if as_json else plan.render())


@cli.command()
@click.option(
    "--profile", "-p", "profile_name", default=None, help="The deployment's profile (default: the inventory's)."
)
@click.option("--image", default=None, help="The new base image, REPOSITORY:TAG (on the head, as for up).")
@click.option("--vllm-version", default=None, help="The vLLM version the new image ships (for the version gates).")
@click.option(
    "--revision", default=None, help="A new model revision (branch, tag or commit) instead of or with --image."
)
@click.option(
    "--min-speed",
    type=click.FloatRange(0.0, 1.0),
    default=upgrades.SPEED_BOUND,
    show_default=True,
    help="Roll back when one-stream decode speed falls below this share of the last good serve's.",
)
@click.option("--node", "node", multiple=True, help="The deployment's nodes, as given to up.")
@env_file_option("Where HF_TOKEN and VLLM_API_KEY live.")
@click.option("--dry-run", is_flag=True, help="Print the whole plan, the rollback included; change nothing.")
@click.option("--json", "as_json", is_flag=True, help="With --dry-run: the steps as a JSON list.")
@click.pass_obj
def upgrade(
    obj,
    profile_name: str | None,
    image: str | None,
    vllm_version: str | None,
    revision: str | None,
    min_speed: float,
    node: tuple[str, ...],
    env_file: Path | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Serve a new image or model revision; roll back by itself unless its canary and bench hold."""
    if as_json and not dry_run:
        raise click.UsageError("--json goes with --dry-run")
    inv = obj.inventory()
    prof = profile_or_usage(inv, profile_name)
    check_dockerfile(prof, len(inv.nodes))  # before any connection: the image's Dockerfile is in this install
    secrets = load_secrets(env_file, prof)
    err = Console(stderr=True, highlight=False)
    with_api_key(env_file, secrets, dry_run, err)
    got = upgrades.upgrade(
        inv,
        prof,
        secrets,
        RichProgress(err),
        up=run_up,
        image=image,
        revision=revision,
        vllm_version=vllm_version,
        nodes=node,
        bound=min_speed,
        dry_run=dry_run,
    )
    if isinstance(got, upgrades.UpgradePlan):
        print_plan(got, as_json)
        return
    click.echo(got)
    if image and prof.image.ref != image:
        click.echo(
            f"note: profile '{prof.name}' still names {prof.image.ref}: set its [image] to the new one, or a later "
            "`sparkcluster up` serves the old image again"
        )
