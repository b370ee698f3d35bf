"""`sparkcluster weights status`: per node, the snapshots in the HF cache and the compile caches beside
it. It reads the nodes and changes nothing; `weights_cmd` adds it to its group."""

from __future__ import annotations

import dataclasses
import json

import click

from sparkcluster.cli.common import load_profile_for
from sparkcluster.deployment import compile_caches
from sparkcluster.remote.fanout import ConnectedHosts
from sparkcluster.up import weights_only
from sparkcluster.up.stages import weights as weights_stage


def _caches(cluster: ConnectedHosts, inv) -> dict[str, compile_caches.NodeCaches]:
    """Per node, the compile caches beside the HF cache (homes already learnt by _status)."""
    got = cluster.each(
        lambda h: compile_caches.parse_list(
            h.run(compile_caches.list_command(inv.compile_cache(h.name)), timeout=120).stdout
        )
    )
    return got.values_or_raise("compile caches")


def state_word(s: dict) -> str:
    if s["broken"]:
        return f"partial ({s['broken']} of {s['files']} files missing)"
    return "complete, verified" if s["verified"] else "complete (not verified by sparkcluster)"


def profile_repos(prof, per_node: dict[str, list[dict]]) -> list[dict]:
    """Each repository the profile needs, and per node the snapshots of it cached there (a
    revision that is a branch or tag matches by ref, a commit by itself)."""
    out = []
    for need in weights_stage.wanted(prof) if prof is not None else []:
        nodes = {}
        for n, snaps in per_node.items():
            got = [
                s
                for s in snaps
                if s["repo"] == need.repo and (need.revision in s["refs"] or s["commit"] == need.revision)
            ]
            nodes[n] = [f"{s['commit'][:12]} {'partial' if s['broken'] else 'complete'}" for s in got] or ["not cached"]
        out.append(
            {
                "role": need.role,
                "repo": need.repo,
                "revision": need.revision,
                "files": list(need.files) if need.files is not None else None,
                "weights": need.weights,
                "nodes": nodes,
            }
        )
    return out


@click.command()
@click.option(
    "--profile",
    "-p",
    "profile_name",
    default=None,
    help="List the repositories this profile needs (default: the inventory's profile).",
)
@click.option("--json", "as_json", is_flag=True, help="Per node, the snapshots as JSON.")
@click.pass_obj
def status(obj, profile_name: str | None, as_json: bool) -> None:
    """Per node: which snapshots of which repos are cached, complete or partial, and their size; first,
    each repository the profile needs (model, tokenizer, draft model, plugin file) and where it is."""
    inv = obj.inventory()
    prof = load_profile_for(inv, profile_name)
    with ConnectedHosts.connect(inv) as cluster:
        per_node = weights_only.cached(cluster, inv)
        caches = _caches(cluster, inv)
    needed = profile_repos(prof, per_node)
    if as_json:
        # the per-node listing as before; with --profile, the profile's repositories beside it
        click.echo(
            json.dumps(
                per_node
                if profile_name is None
                else {
                    "profile": prof.name,
                    "needs": needed,
                    "nodes": per_node,
                    "compile_caches": {n: dataclasses.asdict(c) for n, c in caches.items()},
                },
                indent=2,
            )
        )
        return
    if needed:
        click.echo(f"profile {prof.name} needs:")
        for x in needed:
            what = (
                f" (only {', '.join(x['files'])})"
                if x["files"] is not None
                else ""
                if x["weights"]
                else " (without weight files)"
            )
            click.echo(f"  {x['role']}: {x['repo']}@{x['revision']}{what}")
            for n, states in x["nodes"].items():
                click.echo(f"    {n}: {'; '.join(states)}")
    for n in inv.nodes:
        snaps = per_node.get(n.name) or []
        click.echo(f"{n.name}: " + ("no models cached" if not snaps else ""))
        for s in snaps:
            refs = f" ({', '.join(s['refs'])})" if s["refs"] else ""
            partial = f", {s['partial_bytes'] / 1e9:.2f} GB downloading" if s["partial_bytes"] else ""
            click.echo(
                f"  {s['repo']}@{s['commit'][:12]}{refs}: {s['files']} files, {s['size'] / 1e9:.2f} GB, "
                f"{state_word(s)}{partial}"
            )
        c = caches.get(n.name)
        if c is not None:
            click.echo(
                f"  compile caches in {c.root}: {len(c.keys)} key(s), {c.bytes / 2**30:.2f} GiB "
                f"(cap {inv.cluster.compile_cache_max_gb:g} GiB)"
            )
            for k in sorted(c.keys, key=lambda k: -k.last_start):
                click.echo(f"    {compile_caches.describe(k)}")
