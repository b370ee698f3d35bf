"""`sparkcluster gateway up|down|status|events|export`: one endpoint for every model on the cluster
(sparkcluster/gateway). `up` routes over every deployment running now; run it again after `up` or
`down` of a deployment to add or drop its routes (the running gateway re-reads its config in place)."""

from __future__ import annotations

import json
from pathlib import Path

import click
import httpx

from sparkcluster import redact
from sparkcluster.cli import gateway_keys_cmd
from sparkcluster.cli.main import cli
from sparkcluster.cli.options import env_file_option
from sparkcluster.config import profile as profiles
from sparkcluster.config import secrets as secret_store
from sparkcluster.deployment import deployments, gateway_registry, supervision
from sparkcluster.errors import EXIT_FAILED, EXIT_UNREACHABLE, InputError, SparkError
from sparkcluster.gateway import deploy, litellm, rollout, store
from sparkcluster.labels import PORT_LABEL
from sparkcluster.remote.fanout import connect_reachable, unreachable_error
from sparkcluster.remote.lock import NodeLocks


@cli.group()
def gateway() -> None:
    """One endpoint for every model: up, down, status, events, keys, usage, export --litellm."""


gateway.add_command(gateway_keys_cmd.keys_group)  # named keys and their usage: a module of their own
gateway.add_command(gateway_keys_cmd.usage)


_env_file_option = env_file_option(f"A .env (mode 0600) with {secret_store.GATEWAY_KEYS} and VLLM_API_KEY.")


def _secrets(env_file: Path | None) -> tuple[dict[str, str], list[str]]:
    got = secret_store.load_secrets(env_file, names=["VLLM_API_KEY", secret_store.GATEWAY_KEYS])
    return got, secret_store.split_keys(got.get(secret_store.GATEWAY_KEYS))


def _routes(obj, node_name: str | None):
    """Connect, find the deployments and their profiles: (inventory, gateway node, cluster, found,
    profiles, nodes that could not be read)."""

    inv = obj.inventory()
    node = inv.node(node_name) if node_name else inv.head
    cluster, unreachable = connect_reachable(inv)
    if node.name not in cluster.hosts:
        cluster.close()
        err = unreachable[node.name]
        raise SparkError(f"{node.name} (the gateway's node) is unreachable: {err.message}", err.fix)
    found, unread = deployments.on(cluster, inv)
    try:
        loaded = {d.profile: profiles.load_profile(d.profile, service=True) for d in found}
    except SparkError:
        cluster.close()
        raise
    missing = {**{n: e.message for n, e in unreachable.items()}, **unread}
    return inv, node, cluster, found, loaded, missing


@gateway.command("up")
@click.option("--node", "node_name", default=None, help="Where the gateway runs (default: the inventory's head).")
@click.option("--port", default=4000, show_default=True, type=click.IntRange(1, 65535), help="Its port on that node.")
@click.option("--drain-s", default=30, show_default=True, type=click.IntRange(0, 3600), help="Drain bound on stop.")
@click.option("--image", default=None, help="Image to run it from (default: the one a deployment there runs).")
@click.option("--tls-cert", default=None, help="Certificate file on the node (PEM): serve HTTPS.")
@click.option("--tls-key", default=None, help="Its private key file on the node (PEM).")
@click.option("--dry-run", is_flag=True, help="Print the plan (keys masked) and change nothing.")
@click.option("--json", "as_json", is_flag=True, help="With --dry-run: the steps as JSON.")
@_env_file_option
@click.pass_obj
def gateway_up(obj, node_name, port, drain_s, image, tls_cert, tls_key, dry_run, as_json, env_file) -> None:
    """Start (or update) the gateway over every deployment running now."""

    if bool(tls_cert) != bool(tls_key):
        raise InputError("--tls-cert and --tls-key go together", "give both, or neither")
    secrets, keys = _secrets(env_file)
    if not keys:  # before any connection
        raise InputError(
            "the gateway needs at least one client key",
            redact.set_fix(secret_store.GATEWAY_KEYS, "KEY[,KEY...]", env_file),
        )
    inv, node, cluster, found, loaded, missing = _routes(obj, node_name)
    with cluster:
        api = cluster.hosts[node.name].docker().api
        running = gateway_registry.find(api, inv.cluster.name)
        img = image or deploy.deployment_image(api, inv.cluster.name) or (running or {}).get("Image")
        tls = {"cert": tls_cert, "key": tls_key} if tls_cert else {}
        tokens = deploy.wake_tokens(cluster.hosts, inv, found, loaded)
        held = gateway_registry.holds(api, running)  # an upgrade's hold, kept (read again just before the write)
        data = store.folder(cluster.hosts[node.name], inv.cluster.name)  # its key file and usage ledger
        p = rollout.make(
            inv, node.name, found, loaded, secrets, keys, img, running, port, drain_s, tls, tokens, held, data
        )
        for n, why in sorted(missing.items()):
            click.echo(f"warning: {n}: cannot read what runs there, so its deployments are not routed: {why}", err=True)
        if dry_run:
            click.echo(p.as_json() if as_json else p.render())
            return
        click.echo(p.render())
        with NodeLocks(cluster, inv.only([node.name]), "gateway up"):
            got = deploy.apply(api, p, cluster.hosts[node.name], say=click.echo)
    _show(got, node.name, port)


def _show(got: dict, node: str, port: int) -> None:
    click.echo(f"gateway on {node} port {port}: models {', '.join(got.get('models') or []) or 'none'}")
    for r in got.get("routes", []):
        state = "in rotation" if r.get("in_rotation") else f"OUT: {r.get('reason')}"
        what = ", ".join(r.get("models", []) + r.get("paths", []))  # a service's routes (issue 60)
        click.echo(f"  {what} -> {r.get('deployment')} ({r.get('upstream')}): {state}")


@gateway.command("down")
@click.option("--purge-usage", is_flag=True, help="Also delete its usage ledger (kept otherwise; keys stay).")
@click.pass_obj
def gateway_down(obj, purge_usage: bool) -> None:
    """Stop the gateway (its streams drain first) and remove its container; deployments, keys and usage stay."""

    inv = obj.inventory()
    cluster, unreachable = connect_reachable(inv)
    removed = []
    with cluster:
        for name, host in cluster.hosts.items():
            api = host.docker().api
            c = gateway_registry.find(api, inv.cluster.name)
            if c is not None:
                deploy.stop(api, c["Id"])
                removed.append(f"{name}: removed {c['Names'][0].lstrip('/')} (port {c['Labels'].get(PORT_LABEL)})")
        # the usage ledger is where the gateway ran (else on the head, where `up` puts it)
        purged = []
        for name in ([r.split(":", 1)[0] for r in removed] or [inv.head.name]) if purge_usage else []:
            if name in cluster.hosts:
                folder = store.folder(cluster.hosts[name], inv.cluster.name)
                store.purge(cluster.hosts[name], folder)
                purged.append(f"{name}: deleted the usage ledger in {folder}/usage (the keys stay)")
    for line in removed + purged:
        click.echo(line)
    if not removed:
        click.echo("no gateway" + (" on the nodes that answer" if unreachable else ""))
    for n, e in sorted(unreachable.items()):
        click.echo(f"{n}: UNREACHABLE, not looked at: {e.message}")
    if unreachable:  # README, "Exit codes": a node could not be reached
        raise click.exceptions.Exit(EXIT_UNREACHABLE)


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


@gateway.command("status")
@click.option("--json", "as_json", is_flag=True, help="As JSON.")
@_env_file_option
@click.pass_obj
def gateway_status(obj, as_json: bool, env_file) -> None:
    """Where the gateway runs, the URL clients use, and what it routes (each deployment in rotation or why not).

    Exit 0 when it runs and answers, 1 when it is stopped, does not answer or runs nowhere, 4 when it
    was not found and a node could not be looked at (it may run there)."""

    _, keys = _secrets(env_file)
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
        click.echo(redact.mask(json.dumps({"gateways": out, "unreachable": gone}, indent=2)))
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
            _show(row, row["node"], row["port"])
        elif not keys:
            click.echo(f"  (set {secret_store.GATEWAY_KEYS} to see what it routes)")
    if not out and unreachable:
        raise click.exceptions.Exit(EXIT_UNREACHABLE)
    if not out or any(r.get("state") != "running" or "error" in r for r in out):
        raise click.exceptions.Exit(EXIT_FAILED)


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
    inv, _, cluster, found, loaded, missing = _routes(obj, None)
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


@gateway.command("events")
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
