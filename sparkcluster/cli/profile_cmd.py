"""`sparkcluster profile list|show|lint`: model profiles and what each node's container gets."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import click

from sparkcluster import redact
from sparkcluster.cli import profile_recipes
from sparkcluster.cli.main import cli
from sparkcluster.cli.options import env_file_option, inventory_option
from sparkcluster.config import compile_cache, inventory
from sparkcluster.config.flags import engine_host, serve_argv
from sparkcluster.config.images import image_ref
from sparkcluster.config.inventory import HOME_HF_CACHE
from sparkcluster.config.lint import CLUSTER_RULES, failures, lint, memory_fit_notes, unchecked_flags
from sparkcluster.config.profile import (
    PROFILES_ENV_VAR,
    USER_PROFILES,
    Profile,
    available,
    container_env,
    load_profile,
    non_carry_over_file,
    per_host_env,
    reasoning_plugin,
    required_env_names,
    search_places,
    secret_env_names,
)
from sparkcluster.config.secrets import API_KEY, ENV_FILE_HELP, key_file, load_secrets, masked
from sparkcluster.config.service_profile import is_service
from sparkcluster.errors import EXIT_FAILED, SparkError

# the Dockerfile's default pin (images/Dockerfile.vllm-ray ARG RAY_VERSION)
DEFAULT_RAY_VERSION = "2.60.0"


def _inventory(ctx: click.Context, local: Path | None, *, required: bool = False):
    """The inventory when one is named or exists at the default path; else None."""
    if local is not None:
        return inventory.load(local)
    obj = ctx.find_root().obj
    if obj is not None and (obj.inventory_path is not None or os.environ.get(inventory.ENV_VAR)):
        return obj.inventory()
    if inventory.default_path().is_file():
        return obj.inventory() if obj is not None else inventory.load()
    if required:
        return inventory.load()  # raises the usual "no inventory" InputError
    return None


def _echo(text: str = "", err: bool = False) -> None:
    click.echo(redact.mask(text), err=err)


@cli.group("profile")
def profile_group() -> None:
    """Model profiles: list, show what each node gets, lint."""


@profile_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="As JSON: each profile and the folders searched.")
def list_cmd(as_json: bool) -> None:
    """List the profiles on the search path, then the folders searched (first match wins)."""
    found = available()
    width = max((len(n) for n in found), default=0)
    rows = []
    for name, path in found.items():
        try:
            p = load_profile(str(path), service=True)
            if is_service(p):  # issue 60: a service's routes and image
                row = {"name": name, "model": p.served_name, "image": p.image, "path": str(path), "error": None}
                row["kind"], row["routes"] = p.kind, list(p.routes)
                what = f"service: {', '.join(p.routes)} ({p.image})"
            else:
                row = {"name": name, "model": p.model, "image": p.image.ref, "path": str(path), "error": None}
                what = f"{p.model} ({p.image.ref})"
        except Exception as e:  # one bad profile must not hide the others
            row = {
                "name": name,
                "model": None,
                "image": None,
                "path": str(path),
                "error": getattr(e, "message", str(e)),
            }
            what = f"(invalid: {row['error']})"
        rows.append(row)
        if not as_json:
            _echo(f"{name.ljust(width)}  {what}  [{path}]")
    places = search_places()
    if as_json and found:
        searched = [{"path": str(d), "from": where, "exists": d.is_dir()} for d, where in places]
        _echo(json.dumps({"profiles": rows, "searched": searched}, indent=2))
        return
    if found:
        _echo()
    _echo("searched, first match wins:")
    for d, where in places:
        _echo(f"  {d}  ({where}{'' if d.is_dir() else '; absent'})")
    if not found:
        raise SparkError(
            "no profiles found in the folders above",
            f"reinstall sparkcluster (README, Install: its profiles ship with it), or put NAME.toml files in "
            f"${PROFILES_ENV_VAR} or {USER_PROFILES}",
        )


def _resolved(p: Profile, inv, secrets: dict[str, str], ray_version: str) -> dict:
    hf_cache = inv.hf_cache(inv.head.name, unresolved_ok=True) if inv else HOME_HF_CACHE
    port = inv.cluster.api_port if inv else None
    nco_path, nco_text = non_carry_over_file(p)
    out: dict = {
        "profile": p.name,
        "path": str(p.path) if p.path else None,
        "model": p.model,
        "served_name": p.served_model_name,
        "image": {
            "base": p.image.ref,
            "kind": p.image.kind,
            "vllm_version": p.image.vllm_version,
            "built_tag": p.image_tag(ray_version),
            "built": f"{inv.cluster.image_repo}:{p.image_tag(ray_version)}" if inv else None,
        },
        "shm_size": p.shm_size,
        "security_opt": list(p.security_opt),
        "privileged": p.privileged,
        "drop_page_cache": p.drop_page_cache,
        "forwarded_env": p.forwarded_env(),
        "required_env_names": required_env_names(p),
        "non_carry_over_file": {"path": nco_path, "content": nco_text.strip()},
        "secrets_exec_env": masked(secrets, secret_env_names(p)),
        "secrets_missing": [n for n in secret_env_names(p) if not secrets.get(n)],
        # where the engine listens: the inventory's engines_listen decides (its head's, on a subset)
        "serve_argv": serve_argv(p, port=port, hf_cache=hf_cache, host=engine_host(inv, p) if inv else None),
        "reasoning_plugin": None,
        # the compile caches' folder on the head; its key (image ID, model and flags) waits for the
        # image's ID, which only `up` reads from the head (config/compile_cache)
        "compile_cache": (
            {
                "dir": compile_cache.folder(
                    inv.compile_cache(inv.head.name, unresolved_ok=True), p, image_ref(inv, p), None
                ),
                "max_gb": inv.cluster.compile_cache_max_gb,
            }
            if inv and not compile_cache.in_place(p)
            else None
        ),
        "nodes": [],
    }
    plugin = reasoning_plugin(p, hf_cache)
    if plugin:
        out["reasoning_plugin"] = {"url": plugin[0], "path": plugin[1]}
    if inv:
        for node in inv.nodes:
            out["nodes"].append(
                {
                    "name": node.name,
                    "role": node.role,
                    "per_host_env": per_host_env(p, inv, node),
                    "container_env": container_env(p, inv, node),
                }
            )
    return out


def _published(p: Profile) -> dict | None:
    """The performance record shipped beside the profile (NAME.perf.toml), in short."""
    from sparkcluster.bench import perf_record  # only `profile show` reads records

    rec = perf_record.published_for(p)
    if rec is None:
        return None
    return {
        "path": str(perf_record.record_path(Path(p.path))),
        "url": rec.source.url,
        "publisher": rec.source.publisher,
        "measured_at": str(rec.source.measured_at),
        "hardware": rec.hardware.label or f"{rec.hardware.nodes} x {rec.hardware.accelerator}",
        "harness": f"{rec.harness.name} {rec.harness.version}",
        "runs": [{"conditions": r.conditions.describe(), "figures": r.figures.present()} for r in rec.runs],
    }


@profile_group.command("show")
@click.argument("name")
@inventory_option("Inventory TOML (overrides the global --inventory).")
@env_file_option(f"The .env holding HF_TOKEN / VLLM_API_KEY (mode 0600; {ENV_FILE_HELP}); values are never shown.")
@click.option(
    "--ray-version",
    default=DEFAULT_RAY_VERSION,
    show_default=True,
    help="Ray version of the built image (for its tag).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def show_cmd(
    ctx: click.Context, name: str, inventory_path: Path | None, env_file: Path | None, ray_version: str, as_json: bool
) -> None:
    """What each node's container gets for profile NAME, and the serve command (secrets masked)."""
    p = load_profile(name)
    inv = _inventory(ctx, inventory_path)
    secrets = load_secrets(env_file, p)
    r = _resolved(p, inv, secrets, ray_version)
    r["published"] = _published(p)
    if as_json:
        _echo(json.dumps(redact.mask_obj(r), indent=2))
        return
    _echo(f"profile {r['profile']}  ({r['path']})")
    _echo(f"model:   {r['model']}  served as {r['served_name']}")
    img = r["image"]
    _echo(f"image:   {img['base']}  (kind {img['kind']}, vLLM {img['vllm_version'] or 'not stated'})")
    _echo(f"built:   {img['built'] or '<image_repo>:' + img['built_tag']}  (Ray {ray_version})")
    _echo(
        f"docker run: --shm-size {r['shm_size']}; drop page cache before load: "
        f"{'yes' if r['drop_page_cache'] else 'no'}"
    )
    if r["security_opt"] or r["privileged"]:
        opts = [f"--security-opt={o}" for o in r["security_opt"]] + (["--privileged"] if r["privileged"] else [])
        _echo(f"container options: {' '.join(opts)}")
    _echo(f"file in every container: {r['non_carry_over_file']['path']}")
    _echo(f"  {r['non_carry_over_file']['content']}")
    if r["reasoning_plugin"]:
        _echo(f"reasoning-parser plugin: {r['reasoning_plugin']['url']}")
        _echo(f"  staged at {r['reasoning_plugin']['path']} (HF cache, mounted)")
    _echo("probe: equal on every node: " + ", ".join(r["required_env_names"]))
    if r["compile_cache"]:
        cc = r["compile_cache"]
        _echo(
            f"compile cache: {cc['dir']}  (the key of this image's ID, model and flags: `up` computes it once "
            f"the image is on the head; all keys capped at {cc['max_gb']:g} GiB)"
        )
    elif inv is not None:
        _echo('compile cache: the image\'s own, in place (compile_cache = "image"): nothing mounted')
    if inv is None:
        _echo("forwarded to every container:")
        for k, v in r["forwarded_env"].items():
            _echo(f"  {k}={v}")
        _echo("per-host variables: no inventory given (--inventory PATH to see each node's)")
    else:
        for node in r["nodes"]:
            _echo(f"node {node['name']} ({node['role']}): container environment")
            for k, v in node["container_env"].items():
                tag = "  (per host)" if k in node["per_host_env"] else ""
                _echo(f"  {k}={v}{tag}")
    _echo(
        "vllm serve (docker exec in the head container), exec environment: "
        + " ".join(f"{k}={v}" for k, v in r["secrets_exec_env"].items())
    )
    _echo(f"  {shlex.join(r['serve_argv'])}")
    for name in r["secrets_missing"]:  # said before anything starts: never claimed as passed
        if name == API_KEY:
            _echo(f"note: no {name} found: `up` generates one and writes it to {key_file(env_file)} (mode 0600)")
        else:
            _echo(f"warning: {name} is not set, so `up` does not pass it (a gated model's download is refused)")
    pub = r["published"]
    if pub is None:
        _echo("published record: none beside this profile (sparkcluster bench measures this cluster's own)")
    else:
        _echo(f"published record: {pub['path']}")
        _echo(
            f"  {pub['publisher'] or pub['url']}, measured {pub['measured_at']} "
            f"on {pub['hardware']} with {pub['harness']}"
        )
        for run in pub["runs"]:
            figs = ", ".join(f"{k} {v:g}" for k, v in run["figures"].items())
            _echo(f"  {run['conditions']}: {figs}")
        _echo(f"  compare this cluster with it: sparkcluster bench --profile {p.name} --compare published")


@profile_group.command("lint")
@click.argument("name")
@inventory_option("Inventory TOML (overrides the global --inventory).")
@click.option("--json", "as_json", is_flag=True, help="As JSON: ok, and each problem (rule, severity, message, fix).")
@click.pass_context
def lint_cmd(ctx: click.Context, name: str, inventory_path: Path | None, as_json: bool) -> None:
    """Check profile NAME against the field's rules; exit 1 listing every problem."""
    p = load_profile(name)
    inv = _inventory(ctx, inventory_path)
    if inv is None:
        _echo(f"note: no inventory; skipped the cluster rules ({', '.join(CLUSTER_RULES)})", err=True)
    problems = lint(p, inv)
    for note in memory_fit_notes(p, inv):
        _echo(f"note: {note}", err=True)
    unchecked = unchecked_flags(p)
    if unchecked:
        _echo(f"note: {unchecked}", err=True)
    if as_json:
        body = {
            "profile": p.name,
            "ok": not failures(problems),
            "problems": [
                {"rule": x.rule, "severity": x.severity, "message": x.message, "fix": x.fix} for x in problems
            ],
            "skipped_cluster_rules": list(CLUSTER_RULES) if inv is None else [],
        }
        _echo(json.dumps(body, indent=2))
        if failures(problems):
            ctx.exit(EXIT_FAILED)
        return
    if not problems:
        _echo(f"{p.name}: ok")
        return
    for prob in problems:
        _echo(f"{p.name}: {prob.line()}")
    if failures(problems):
        ctx.exit(EXIT_FAILED)


# `profile import` and `profile export` (the field's recipes) live in their own module
profile_group.add_command(profile_recipes.import_cmd)
profile_group.add_command(profile_recipes.export_cmd)
