"""`sparkcluster gateway status|events`: the gateway's read-only subcommands (where it runs, what it
routes, its journal). They read the nodes and change nothing; `gateway_cmd` adds them to its group."""

from __future__ import annotations

import json

import click
import httpx

from sparkcluster import redact
from sparkcluster.cli.options import env_file_option
from sparkcluster.config import secrets as secret_store
from sparkcluster.deployment import gateway_registry, supervision
from sparkcluster.errors import EXIT_FAILED, EXIT_UNREACHABLE, SparkError, failure, problem
from sparkcluster.gateway import deploy
from sparkcluster.labels import PORT_LABEL
from sparkcluster.remote.fanout import connect_reachable, unreachable_error

_env_file_option = env_file_option(f"A .env (mode 0600) with {secret_store.GATEWAY_KEYS} and VLLM_API_KEY.")


def secrets_and_keys(env_file) -> tuple[dict[str, str], list[str]]:
    """The gateway's secrets from the .env (or the environment), and its client keys."""
    got = secret_store.load_secrets(env_file, names=["VLLM_API_KEY", secret_store.GATEWAY_KEYS])
    return got, secret_store.split_keys(got.get(secret_store.GATEWAY_KEYS))


def show(got: dict, node: str, port: int) -> None:
    click.echo(f"gateway on {node} port {port}: models {', '.join(got.get('models') or []) or 'none'}")
    for r in got.get("routes", []):
        state = "in rotation" if r.get("in_rotation") else f"OUT: {r.get('reason')}"
        what = ", ".join(r.get("models", []) + r.get("paths", []))  # a service's routes (issue 60)
        click.echo(f"  {what} -> {r.get('deployment')} ({r.get('upstream')}): {state}")


def client_url(host_address: str, container: dict, port: int) -> str:
    """The base URL a client gives its OpenAI or Anthropic SDK: the node's address as this machine
    reaches it over SSH, HTTPS when the gateway was started with --tls-cert."""
    tls = any(m.get("Destination") == "/etc/sparkcluster/tls" for m in container.get("Mounts") or [])
    return f"{'https' if tls else 'http'}://{host_address}:{port}/v1"


def _say_unreachable(unreachable: dict[str, SparkError]) -> None:
    for n, e in sorted(unreachable.items()):
        click.echo(f"{n}: UNREACHABLE, not looked at: {e.message}")
        if e.fix:
            click.echo(f"  fix: {e.fix}")


@click.command("status")
@click.option("--json", "as_json", is_flag=True, help="As JSON.")
@_env_file_option
@click.pass_obj
def gateway_status(obj, as_json: bool, env_file) -> None:
    """Where the gateway runs, the URL clients use, and what it routes (each deployment in rotation or why not).

    Exit 0 when it runs and answers, 1 when it is stopped, does not answer or runs nowhere, 4 when it
    was not found and a node could not be looked at (it may run there)."""

    _, keys = secrets_and_keys(env_file)
    inv = obj.inventory()
    cluster, unreachable = connect_reachable(inv)
    out = []
    with cluster:
        for name, host in cluster.hosts.items():
            c = gateway_registry.find(host.docker().api, inv.cluster.name)
            if c is None:
                continue
            port = int((c.get("Labels") or {}).get(PORT_LABEL) or 0)
            url = client_url(host.address, c, port)
            row = {"node": name, "container": c["Names"][0].lstrip("/"), "state": c.get("State"), "port": port}
            row["url"] = url
            if keys and c.get("State") == "running":
                try:
                    row.update(deploy.ask(host.address, port, keys[0], scheme=url.split(":")[0]))
                except httpx.HTTPError as e:
                    row["error"] = f"does not answer: {type(e).__name__}"
            out.append(row)
    if as_json:
        gone = [{"node": n, "state": "unreachable", "message": e.message, "fix": e.fix} for n, e in unreachable.items()]
        body = {"gateways": out, "unreachable": gone}
        if not out:  # a failure (exit 4, or 1 when none runs): the shape every --json failure has
            problems = [problem(n, e.message, e.fix) for n, e in unreachable.items()]
            said = "no gateway on the nodes that answer" if unreachable else "no gateway runs"
            fix = problems[0]["fix"] if problems else "start one: sparkcluster gateway up"
            body = {**failure(said, fix, problems, EXIT_UNREACHABLE if unreachable else EXIT_FAILED), **body}
        click.echo(redact.mask(json.dumps(body, indent=2)))
    else:
        _say_unreachable(unreachable)
        if not out:
            click.echo(
                "no gateway on the nodes that answer"
                if unreachable
                else "no gateway runs (start one: sparkcluster gateway up)"
            )
    for row in [] if as_json else out:
        click.echo(f"gateway {row['container']} on {row['node']} port {row['port']}: {row['state']}")
        click.echo(f"  clients use: {row['url']} (OpenAI and Anthropic SDKs; a key of {secret_store.GATEWAY_KEYS})")
        if "error" in row:
            click.echo(f"  {row['error']}")
        elif "routes" in row:
            show(row, row["node"], row["port"])
        elif not keys:
            click.echo(f"  (set {secret_store.GATEWAY_KEYS} to see what it routes)")
    if not out and unreachable:
        raise click.exceptions.Exit(EXIT_UNREACHABLE)
    if not out or any(r.get("state") != "running" or "error" in r for r in out):
        raise click.exceptions.Exit(EXIT_FAILED)


@click.command("events")
@click.option("--last", default=50, show_default=True, type=click.IntRange(min=0), help="Entries to show (0: all).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per entry, as the gateway wrote it.")
@click.pass_obj
def gateway_events(obj, last: int, as_json: bool) -> None:
    """The gateway's journal: started, config reloaded, each deployment in or out of rotation and why."""

    inv = obj.inventory()
    cluster, unreachable = connect_reachable(inv)
    shown = False
    with cluster:
        for host in cluster.hosts.values():
            api = host.docker().api
            c = gateway_registry.find(api, inv.cluster.name)
            if c is None:
                continue
            shown = True
            entries = deploy.journal(api, c["Id"])
            for e in entries[-last:] if last else entries:
                click.echo(redact.mask(json.dumps(e) if as_json else supervision.format_entry(e)))
    if not shown and unreachable:  # it may run on a node that did not answer: name each, exit 4
        err = unreachable_error(unreachable)
        if isinstance(err, SparkError):
            err.message = f"no gateway on the nodes that answer; {err.message}"
        raise err
    if not shown:
        raise SparkError("no gateway runs", "start one: sparkcluster gateway up")
