"""`sparkcluster init`: connect, discover links, HCAs, IPs and GPUs, write a draft inventory."""

from __future__ import annotations

import json
import os
import re
import shlex
import time
from pathlib import Path

import click

from sparkcluster.cli.main import cli
from sparkcluster.config import inventory
from sparkcluster.config.topology import MAX_NODES
from sparkcluster.errors import InputError
from sparkcluster.facts import discover
from sparkcluster.remote import ssh


def _abs(p: Path | None) -> Path | None:
    return p.expanduser().resolve() if p is not None else None


@cli.command()
@click.option(
    "--head",
    "head",
    required=True,
    metavar="TARGET",
    help="The head (the only node of one Spark): a Host alias from ~/.ssh/config, or user@host[:port].",
)
@click.option(
    "--worker",
    "workers",
    multiple=True,
    metavar="TARGET",
    help="A worker (repeat for more; none: a one-Spark inventory).",
)
@click.option(
    "--ssh-config",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="ssh client config to use (default: ~/.ssh/config).",
)
@click.option(
    "--known-hosts",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="known_hosts to check host keys against (unknown keys are refused).",
)
@click.option("--name", default="sparks", show_default=True, help="Cluster name.")
@click.option(
    "--output",
    "-o",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Where to write the draft "
    "(default: --inventory, $SPARKCLUSTER_INVENTORY, else ~/.config/sparkcluster/cluster.toml).",
)
@click.option("--force", is_flag=True, help="Overwrite an existing file.")
@click.option("--json", "as_json", is_flag=True, help="As JSON: the file written and each node as drafted.")
@click.pass_obj
def init(
    obj,
    head: str,
    workers: tuple[str, ...],
    ssh_config: Path | None,
    known_hosts: Path | None,
    name: str,
    output: Path | None,
    force: bool,
    as_json: bool,
) -> None:
    """Discover the hosts and write a draft inventory to review."""
    out = (output or obj.inventory_path or inventory.default_path()).expanduser()
    # everything the user typed is checked before any connection
    if out.exists() and not force:
        raise InputError(
            f"{out} already exists; not overwriting it",
            "pass --force to replace it, or --output PATH to write elsewhere",
        )
    if not re.match(inventory._NAME, name):
        raise InputError(
            f"--name {name!r} is not a valid cluster name",
            "use letters, digits, '.', '_' or '-' (up to 63, starting with a letter or digit)",
        )
    targets = [head, *workers]
    if len(targets) > MAX_NODES:
        raise InputError(
            f"{len(targets)} hosts given; an inventory holds at most {MAX_NODES} nodes (one head)",
            f"give the head and at most {MAX_NODES - 1} --worker",
        )
    if len(set(targets)) != len(targets):
        raise InputError("the same ssh target is given twice", "each --head/--worker must be a different host")
    for i, t in enumerate(targets):
        discover.provisional_node(t, "head" if i == 0 else "worker", i)  # InputError on a bad target
    ssh_config, known_hosts = _abs(ssh_config), _abs(known_hosts)
    if ssh_config is not None and not ssh_config.is_file():
        raise InputError(f"no ssh config at {ssh_config}", "pass an existing file to --ssh-config")
    settings = ssh.Settings(ssh_config, known_hosts, connect_timeout=None, attempts=2)

    found = discover.discover_hosts(targets, settings)
    dr = discover.draft(name, found, ssh_config, known_hosts)
    text, inv = discover.render(dr, source=str(out), when=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, out)
    if as_json:
        click.echo(json.dumps(_as_json(out, inv, found), indent=2))
        return
    click.echo(f"wrote {out} ({HEADER_NOTE})")
    for n in inv.nodes:
        click.echo(
            f"  {n.role:6} {n.name}: control {n.control_if} {n.control_ip}, "
            f"data plane {', '.join(f'{link.hca}->{link.netdev}' for link in n.data_plane)}"
        )
    # who sparkcluster logs in as on each node, and where the HF cache will be (its ~/.cache/huggingface)
    for n, d in zip(inv.nodes, found):
        a = d.account
        if a is not None:
            cache = (
                (a.home.rstrip("/") + inv.cluster.hf_cache[1:])
                if inv.cluster.hf_cache.startswith("~")
                else inv.cluster.hf_cache
            )
            grp = (
                "root"
                if a.uid == 0
                else (
                    "in docker"
                    if "docker" in a.groups
                    else "NOT in docker: sudo usermod -aG docker " + a.user + ", then log in again"
                )
            )
            click.echo(f"  {n.name}: ssh user {a.user} (uid {a.uid}, {grp}), HF cache {cache}")
    # what was found but not listed, and why: never dropped silently (link-local, no address, twins)
    for dn in dr.nodes:
        for c in dn.comments:
            if "left out" in c:
                click.echo(f"  {dn.name}: {c}")
    click.echo(f"next: review it, then `sparkcluster -i {shlex.quote(str(out))} doctor`")


def _as_json(out: Path, inv, found) -> dict:
    nodes = []
    for n, d in zip(inv.nodes, found):
        a = d.account
        nodes.append(
            {
                "name": n.name,
                "role": n.role,
                "ssh": n.ssh,
                "control_if": n.control_if,
                "control_ip": str(n.control_ip),
                "data_plane": [{"hca": x.hca, "netdev": x.netdev} for x in n.data_plane],
                "user": a.user if a else None,
                "in_docker_group": (a.uid == 0 or "docker" in a.groups) if a else None,
            }
        )
    return {
        "ok": True,
        "wrote": str(out),
        "review": HEADER_NOTE,
        "nodes": nodes,
        "next": f"sparkcluster -i {out} doctor",
    }


HEADER_NOTE = discover.HEADER
