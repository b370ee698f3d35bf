"""`sparkcluster rollback --profile P`: back to the deployment's last good serve with another image or
revision, on request (`upgrade` does the same by itself when its canary fails)."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console

from sparkcluster.cli.common import profile_or_usage
from sparkcluster.cli.main import cli
from sparkcluster.cli.options import env_file_option
from sparkcluster.cli.up_cmd import RichProgress, run_up, with_api_key
from sparkcluster.cli.upgrade_cmd import print_plan
from sparkcluster.config.secrets import load_secrets
from sparkcluster.deployment import known_good
from sparkcluster.upgrade import upgrade as upgrades


@cli.command()
@click.option(
    "--profile", "-p", "profile_name", default=None, help="The deployment's profile (default: the inventory's)."
)
@click.option("--node", "node", multiple=True, help="The deployment's nodes, as given to up.")
@env_file_option("Where HF_TOKEN and VLLM_API_KEY live.")
@click.option("--dry-run", is_flag=True, help="Print the plan; change nothing.")
@click.option(
    "--json", "as_json", is_flag=True, help="With --dry-run: the steps as a JSON list; with --history: the records."
)
@click.option("--history", is_flag=True, help="List the recorded good serves and upgrades; change nothing.")
@click.pass_obj
def rollback(
    obj,
    profile_name: str | None,
    node: tuple[str, ...],
    env_file: Path | None,
    dry_run: bool,
    as_json: bool,
    history: bool,
) -> None:
    """Return a deployment to its last good serve with another image or revision."""
    inv = obj.inventory()
    if history and as_json:  # the same records, whole (the canary's answers left out: they are long)
        import dataclasses
        import json

        good = [
            {k: v for k, v in dataclasses.asdict(r).items() if k != "canary"} for r in known_good.load(inv.cluster.name)
        ]
        upgr = [dataclasses.asdict(o) for o in known_good.load_outcomes(inv.cluster.name)]
        click.echo(json.dumps({"good": good, "upgrades": upgr}, indent=2))
        return
    if history:
        for r in known_good.load(inv.cluster.name):
            canary = f", canary {r.canary_tok_s:.1f} tok/s" if r.canary else ""
            click.echo(f"good  {r.at} {r.deployment} {r.base_image or r.image}@{r.model_revision[:12]}{canary}")
        for o in known_good.load_outcomes(inv.cluster.name):
            click.echo(f"upgr  {o.line()}")
        return
    if as_json and not dry_run:
        raise click.UsageError("--json goes with --dry-run or --history")
    prof = profile_or_usage(inv, profile_name)
    secrets = load_secrets(env_file, prof)
    err = Console(stderr=True, highlight=False)
    with_api_key(env_file, secrets, dry_run, err)
    got = upgrades.rollback(
        inv,
        prof,
        secrets,
        RichProgress(err),
        up=run_up,
        nodes=node,
        dry_run=dry_run,
    )
    if isinstance(got, upgrades.UpgradePlan):
        print_plan(got, as_json)
        return
    click.echo(got)
