"""`sparkcluster weights pull|status|rm`: the model weights in every node's HF cache, without serving."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import click
from rich.console import Console

from sparkcluster.cli.common import load_profile_for, profile_or_usage
from sparkcluster.cli.main import cli
from sparkcluster.cli.options import env_file_option
from sparkcluster.cli.up_cmd import RichProgress
from sparkcluster.config.images import image_ref
from sparkcluster.config.secrets import ENV_FILE_HELP, load_secrets
from sparkcluster.deployment import compile_caches
from sparkcluster.errors import InputError
from sparkcluster.facts.access import learn_homes
from sparkcluster.movement import hfcache
from sparkcluster.remote.fanout import ConnectedHosts
from sparkcluster.remote.lock import ClusterLock
from sparkcluster.up.stages import weights as weights_stage
from sparkcluster.up.stages.image import image_id


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
@click.option("--json", "as_json", is_flag=True, help="As JSON at the end: each repository, its commit and state.")
@click.pass_obj
def pull(obj, profile_name: str | None, env_file: Path | None, verify: bool, as_json: bool) -> None:
    """Fetch every repository the profile needs (model, tokenizer, draft model, plugin file) once on the
    head and replicate it to every worker, verified."""
    inv = obj.inventory()
    prof = profile_or_usage(inv, profile_name)
    want = weights_stage.wanted(prof)
    if not want:
        raise InputError(
            f"profile '{prof.name}' serves {prof.model}, a path inside the container, not a hub model",
            "nothing to pull: place that path on every node yourself",
        )
    secrets = load_secrets(env_file, prof)
    image = image_ref(inv, prof)
    err = Console(stderr=True, highlight=False)
    with (
        ConnectedHosts.connect(inv) as cluster,
        ClusterLock(cluster.head, inv.cluster.name, f"weights pull --profile {prof.name}"),
    ):
        learn_homes(cluster)  # the HF cache's `~`, and whom the download's files belong to
        sts = [
            weights_stage.Staging(cluster, inv, image, need.repo, need.revision, secrets, RichProgress(err), need)
            for need in want
        ]
        for st in sts:
            st.resolve()
            st.check_all(rehash=verify)
        # with --json, what is said on the way goes to stderr and stdout holds one JSON object
        say = (lambda text: click.echo(text, err=True)) if as_json else click.echo
        done = []
        for st in sts:
            if not st.lacking():
                m = st.manifest
                done.append({"repo": m.repo, "commit": m.commit, "role": st.role, "bytes": m.size, "state": "complete"})
                say(
                    f"{m.repo}@{m.commit[:12]} ({st.role}, {m.size / 1e9:.2f} GB) is complete and verified "
                    "on every node"
                )
        lacking = [st for st in sts if st.lacking()]
        if not lacking:
            if as_json:
                click.echo(json.dumps({"ok": True, "profile": prof.name, "repos": done}, indent=2))
            return
        weights_stage.disk(lacking)
        if any(inv.head.name in st.lacking() for st in lacking):
            # the download runs in a throwaway container: the cluster image once `up` built it, else
            # the profile's base image (vLLM ships huggingface_hub), so weights can be staged first
            if image_id(cluster.head, image) is None:
                image = prof.image.ref
            if image_id(cluster.head, image) is None:
                raise InputError(
                    f"the head has neither the cluster image {image_ref(inv, prof)} nor its base "
                    f"{prof.image.ref}, one of which does the download",
                    f"docker pull {prof.image.ref} on {inv.head.name}, or sparkcluster up --profile "
                    f"{prof.name} (it builds the image and stages the weights)",
                )
            lacking[0].write_token()
        fx = None
        if any(len([w for w in inv.workers if w.name in st.lacking()]) >= 2 for st in lacking):
            # a chain's hops go over the data plane where two nodes share a subnet, as `up` sends them
            from sparkcluster import facts

            fx = cluster.each(lambda h: facts.gather(h, inv, None, ray=False)).values_or_raise("facts")
        for st in lacking:
            st.image = image
            if inv.head.name in st.lacking():
                say(st.download())
            for note in st.replicate_all(fx):
                say(note)
            m = st.manifest
            done.append({"repo": st.repo, "commit": m.commit, "role": st.role, "bytes": m.size, "state": "staged"})
            say(f"{st.repo}@{m.commit[:12]} ({st.role}) staged on every node")
    if as_json:
        click.echo(json.dumps({"ok": True, "profile": prof.name, "repos": done}, indent=2))


def _status(cluster: ConnectedHosts, inv) -> dict[str, list[dict]]:
    learn_homes(cluster)
    got = cluster.each(
        lambda h: hfcache.parse_json(h.run(hfcache.status_command(inv.hf_cache(h.name)), timeout=120).stdout)
    )
    return got.values_or_raise("weights")


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


@weights.command()
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
        per_node = _status(cluster, inv)
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


@weights.command()
@click.argument("repo")
@click.option("--commit", default=None, help="Only this snapshot (default: every cached snapshot of REPO).")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option(
    "--json", "as_json", is_flag=True, help="As JSON: each snapshot removed and the space freed (with --yes)."
)
@click.pass_obj
def rm(obj, repo: str, commit: str | None, yes: bool, as_json: bool) -> None:
    """Remove a model's snapshot(s) from every node's HF cache (`down` never does)."""
    hfcache.check_repo(repo)
    if as_json and not yes:
        raise click.UsageError("--json goes with --yes (a script cannot answer the question)")
    inv = obj.inventory()
    with ConnectedHosts.connect(inv) as cluster, ClusterLock(cluster.head, inv.cluster.name, f"weights rm {repo}"):
        per_node = _status(cluster, inv)
        targets = {
            n: sorted({s["commit"] for s in snaps if s["repo"] == repo and (commit is None or s["commit"] == commit)})
            for n, snaps in per_node.items()
        }
        if not any(targets.values()):
            said = f"{repo}{'@' + commit if commit else ''} is not cached on any node"
            click.echo(json.dumps({"ok": True, "message": said, "removed": []}, indent=2) if as_json else said)
            return
        for n, cs in targets.items():
            for c in cs if not as_json else []:
                click.echo(f"  {n}: {repo}@{c}")
        if not yes and not click.confirm("remove these snapshots?", default=False):
            raise click.exceptions.Abort()
        removed = []
        for n, cs in targets.items():
            for c in cs:
                got = hfcache.parse_json(
                    cluster.hosts[n].run(hfcache.rm_command(inv.hf_cache(n), repo, c), timeout=600).stdout
                )
                removed.append({"node": n, "repo": repo, "commit": c, "freed_bytes": got["freed"]})
                if not as_json:
                    click.echo(f"{n}: removed {repo}@{c[:12]}, freed {got['freed'] / 1e9:.2f} GB")
    if as_json:
        click.echo(json.dumps({"ok": True, "removed": removed}, indent=2))
