"""`sparkcluster gateway up|down|status|events|export`: one endpoint for every model on the cluster
(sparkcluster/gateway). `up` routes over every deployment running now; run it again after `up` or
`down` of a deployment to add or drop its routes (the running gateway re-reads its config in place)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from sparkcluster import redact
from sparkcluster.cli import gateway_keys_cmd, gateway_read_cmd
from sparkcluster.cli.main import cli
from sparkcluster.cli.options import env_file_option
from sparkcluster.config import secrets as secret_store
from sparkcluster.errors import EXIT_UNREACHABLE, InputError, failure, problem
from sparkcluster.gateway import gateway_steps, litellm, rollout
from sparkcluster.steps.base import dry_run as dry_run_text


@cli.group()
def gateway() -> None:
    """One endpoint for every model: up, down, status, events, keys, usage, export --litellm."""


gateway.add_command(gateway_keys_cmd.keys_group)  # named keys and their usage: a module of their own
gateway.add_command(gateway_keys_cmd.usage)


_env_file_option = env_file_option(f"A .env (mode 0600) with {secret_store.GATEWAY_KEYS} and VLLM_API_KEY.")


@gateway.command("up")
@click.option("--node", "node_name", default=None, help="Where the gateway runs (default: the inventory's head).")
@click.option(
    "--port",
    default=rollout.DEFAULT_PORT,
    show_default=True,
    type=click.IntRange(1, 65535),
    help="Its port on that node.",
)
@click.option("--drain-s", default=30, show_default=True, type=click.IntRange(0, 3600), help="Drain bound on stop.")
@click.option("--image", default=None, help="Image to run it from (default: the one a deployment there runs).")
@click.option("--tls-cert", default=None, help="Certificate file on the node (PEM): serve HTTPS.")
@click.option("--tls-key", default=None, help="Its private key file on the node (PEM).")
@click.option("--dry-run", is_flag=True, help="Print the plan (keys masked) and change nothing.")
@click.option("--json", "as_json", is_flag=True, help="As JSON: the steps (with --dry-run), or what it routes.")
@_env_file_option
@click.pass_obj
def gateway_up(obj, node_name, port, drain_s, image, tls_cert, tls_key, dry_run, as_json, env_file) -> None:
    """Start (or update) the gateway over every deployment running now."""

    if bool(tls_cert) != bool(tls_key):
        raise InputError("--tls-cert and --tls-key go together", "give both, or neither")
    secrets, keys = gateway_read_cmd.secrets_and_keys(env_file)
    if not keys:  # before any connection
        raise InputError(
            "the gateway needs at least one client key",
            redact.set_fix(secret_store.GATEWAY_KEYS, "KEY[,KEY...]", env_file),
        )
    tls = {"cert": tls_cert, "key": tls_key} if tls_cert else {}
    p, got = gateway_steps.up(
        obj.inventory(),
        node_name,
        secrets,
        keys,
        port=port,
        drain_s=drain_s,
        image=image,
        tls=tls,
        dry_run=dry_run,
        say=(lambda text: click.echo(text, err=True)) if as_json else click.echo,
        warn=lambda text: click.echo(f"warning: {text}", err=True),
        more_secrets=lambda names: secret_store.load_secrets(env_file, names=names, required=not dry_run),
    )
    if dry_run:
        click.echo(p.as_json() if as_json else p.render())
        return
    if as_json:
        click.echo(redact.mask(json.dumps({"ok": True, "node": p.node, "port": port, **got}, indent=2)))
        return
    gateway_read_cmd.show(got, p.node, port)


@gateway.command("down")
@click.option("--purge-usage", is_flag=True, help="Also delete its usage ledger (kept otherwise; keys stay).")
@click.option(
    "--dry-run", is_flag=True, help="Print the steps (each gateway found, drained and removed); change nothing."
)
@click.option("--json", "as_json", is_flag=True, help="As JSON: the steps (with --dry-run), or what was removed.")
@click.pass_obj
def gateway_down(obj, purge_usage: bool, dry_run: bool, as_json: bool) -> None:
    """Stop the gateway (its streams drain first) and remove its container; deployments, keys and usage stay."""

    got = gateway_steps.down(obj.inventory(), dry_run, purge_usage)
    gone = sorted(got.unreachable.items())
    if dry_run:
        click.echo(dry_run_text(got.steps, as_json, ["gateway down:"]))
    elif as_json:
        body = {"ok": not gone, "removed": got.removed}
        if gone:
            problems = [problem(n, e.message, e.fix) for n, e in gone]
            said = f"no gateway removed on {', '.join(n for n, _ in gone)}: not reached"
            body = {**failure(said, problems[0]["fix"], problems, EXIT_UNREACHABLE), **body}
        click.echo(redact.mask(json.dumps(body, indent=2)))
    else:
        for line in got.removed:
            click.echo(line)
        if not got.stopped:
            click.echo("no gateway" + (" on the nodes that answer" if gone else ""))
    for n, e in [] if as_json else gone:
        click.echo(f"{n}: UNREACHABLE, not looked at: {e.message}")
    if gone:  # README, "Exit codes": a node could not be reached
        raise click.exceptions.Exit(EXIT_UNREACHABLE)


@gateway.command("export")
@click.option("--litellm", "as_litellm", is_flag=True, required=True, help="A LiteLLM proxy config (the only format).")
@click.option(
    "--output", "-o", "out_path", type=click.Path(path_type=Path), default=None, help="Write here, not stdout."
)
@_env_file_option
@click.pass_obj
def gateway_export(obj, as_litellm: bool, out_path: Path | None, env_file) -> None:
    """Write a LiteLLM proxy config for the same deployments (secrets as os.environ references)."""

    secrets = secret_store.load_secrets(env_file, names=["VLLM_API_KEY"])
    inv = obj.inventory()
    _, cluster, found, loaded, missing = gateway_steps.routes(inv, None)
    with cluster:
        pass
    for n, why in sorted(missing.items()):
        click.echo(f"warning: {n}: cannot read what runs there, so its deployments are left out: {why}", err=True)
    text = litellm.render(rollout.upstreams(inv, found, loaded), inv.cluster.name, bool(secrets.get("VLLM_API_KEY")))
    if out_path is None:
        click.echo(text, nl=False)
    else:
        out_path.write_text(text)
        click.echo(f"wrote {out_path} ({sum(len(loaded[d.profile].served_names) for d in found)} model entries)")


# the read-only subcommands (status, events) connect by themselves: their own module
gateway.add_command(gateway_read_cmd.gateway_status)
gateway.add_command(gateway_read_cmd.gateway_events)
