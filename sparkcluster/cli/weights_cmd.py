"""`sparkcluster weights pull|status|rm`: the model weights in every node's HF cache, without serving."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console

from sparkcluster.cli import weights_read_cmd
from sparkcluster.cli.common import profile_or_usage
from sparkcluster.cli.main import cli
from sparkcluster.cli.options import env_file_option
from sparkcluster.cli.up_cmd import RichProgress
from sparkcluster.config.secrets import ENV_FILE_HELP, load_secrets
from sparkcluster.steps.base import dry_run as dry_run_text
from sparkcluster.up import weights_only


@cli.group()
def weights() -> None:
    """Model weights in the nodes' HF caches: stage, list, remove."""


@weights.command()
@click.option(
    "--profile",
    "-p",
    "profile_name",
    default=None,
    help="Profile whose repositories to stage (default: the inventory's).",
)
@env_file_option(f"Where HF_TOKEN lives (mode 0600); {ENV_FILE_HELP}.")
@click.option("--verify", is_flag=True, help="Hash every file again on every node (not only new or changed ones).")
@click.option("--dry-run", is_flag=True, help="Print the steps (resolve, check, download, replicate); move nothing.")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="As JSON: the steps (with --dry-run), or each repository, its commit and state.",
)
@click.pass_obj
def pull(obj, profile_name: str | None, env_file: Path | None, verify: bool, dry_run: bool, as_json: bool) -> None:
    """Fetch every repository the profile needs (model, tokenizer, draft model, plugin file) once on the
    head and replicate it to every worker, verified."""
    inv = obj.inventory()
    prof = profile_or_usage(inv, profile_name)
    secrets = load_secrets(env_file, prof)
    err = Console(stderr=True, highlight=False)
    plan, got = weights_only.pull(inv, prof, secrets, RichProgress(err), rehash=verify, dry_run=dry_run)
    if got is None:
        head = [f"weights pull for profile '{prof.name}' on cluster '{inv.cluster.name}':"]
        click.echo(dry_run_text(plan.steps(), as_json, head))
        return
    # with --json, what is said on the way goes to stderr and stdout holds one JSON object
    say = (lambda text: click.echo(text, err=True)) if as_json else click.echo
    for repo, notes in zip(got.repos, got.notes):
        short = f"{repo['repo']}@{repo['commit'][:12]}"
        if repo["state"] == "complete":
            say(f"{short} ({repo['role']}, {repo['bytes'] / 1e9:.2f} GB) is complete and verified on every node")
            continue
        for note in notes:
            say(note)
        say(f"{short} ({repo['role']}) staged on every node")
    if as_json:
        click.echo(json.dumps({"ok": True, "profile": prof.name, "repos": got.repos}, indent=2))


@weights.command()
@click.argument("repo")
@click.option("--commit", default=None, help="Only this snapshot (default: every cached snapshot of REPO).")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option("--dry-run", is_flag=True, help="Print the steps (each snapshot on each node); remove nothing.")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="As JSON: the steps (with --dry-run), or each snapshot removed and the space freed (with --yes).",
)
@click.pass_obj
def rm(obj, repo: str, commit: str | None, yes: bool, dry_run: bool, as_json: bool) -> None:
    """Remove a model's snapshot(s) from every node's HF cache (`down` never does)."""
    if as_json and not yes and not dry_run:
        raise click.UsageError("--json goes with --yes (a script cannot answer the question)")
    inv = obj.inventory()
    with weights_only.removal(inv, repo, commit) as rm_:
        if dry_run:
            click.echo(dry_run_text(rm_.steps, as_json, [f"weights rm {repo} on cluster '{inv.cluster.name}':"]))
            return
        if not rm_.steps:
            said = f"{repo}{'@' + commit if commit else ''} is not cached on any node"
            click.echo(json.dumps({"ok": True, "message": said, "removed": []}, indent=2) if as_json else said)
            return
        for n, cs in rm_.targets.items():
            for c in cs if not as_json else []:
                click.echo(f"  {n}: {repo}@{c}")
        if not yes and not click.confirm("remove these snapshots?", default=False):
            raise click.exceptions.Abort()
        removed = rm_.walk()
    for x in [] if as_json else removed:
        click.echo(f"{x['node']}: removed {repo}@{x['commit'][:12]}, freed {x['freed_bytes'] / 1e9:.2f} GB")
    if as_json:
        click.echo(json.dumps({"ok": True, "removed": removed}, indent=2))


# the read-only subcommand (status) connects by itself: its own module
weights.add_command(weights_read_cmd.status)
