"""`sparkcluster profile import SOURCE` and `profile export NAME --format sparkrun`: the field's recipes
read as profiles of your own (written to your profile folder), and a profile written out as a
sparkrun v2 recipe. The reading is sparkcluster/importer's; this module composes it with lint, the
performance record's format (bench/perf_record) and the files."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import click
import yaml

from sparkcluster import redact
from sparkcluster.bench import perf_record
from sparkcluster.config.lint import failures
from sparkcluster.config.profile import USER_PROFILES, Profile, load_profile
from sparkcluster.errors import EXIT_FAILED, InputError
from sparkcluster.importer import build, export, formats, sources
from sparkcluster.importer.formats import Refused, Unmapped


@dataclass
class Written:
    imported: build.Imported
    perf_text: str | None


def make(
    source: str,
    name: str | None = None,
    hardware: str | None = None,
    pin: bool = False,
    source_url: str | None = None,
) -> Written:
    """What an import writes (nothing is written here): the profile's text and its record's."""
    try:
        fetched = sources.fetch(source, hardware=hardware)
        if source_url:
            fetched.origin = sources.origin_of(source_url)
            if not fetched.origin.known:
                raise Refused(f"--source-url {source_url}: not an https URL", "give the file's https address")
        _registry(fetched)
        imported = build.build(fetched, name=name, hardware=hardware, pin=pin)
    except Refused as e:
        raise InputError(f"cannot import {source}: {e.why}", e.fix) from None
    perf_text = None
    if imported.perf is not None:
        try:
            perf_text = perf_record.dumps(perf_record.PerfRecord.model_validate(imported.perf))
        except ValueError as e:
            imported.unmapped.append(Unmapped(None, "performance.yaml", f"not a record sparkcluster reads: {e}"))
    return Written(imported, perf_text)


def _registry(fetched: sources.Fetched) -> None:
    """A sparkrun registry manifest lists its recipes: the owner picks one."""
    text = fetched.data.decode("utf-8", errors="replace")
    try:
        kind, doc = formats.detect(text, fetched.name)
    except Refused:
        return
    if kind != "registry":
        return
    where = Path(fetched.where).expanduser()
    listed = sources.registry_recipes(where if where.is_file() else where / ".sparkrun" / "registry.yaml", doc)
    details = []
    for reg, files in listed:
        details.append(f"registry {reg}: {len(files)} recipe(s)" + (":" if files else ""))
        details += [f"  {f}" for f in files]
    raise InputError(
        f"{fetched.where} is a sparkrun registry manifest, not a recipe",
        "import one of the recipes it lists: sparkcluster profile import PATH",
        details=details,
    )


def _echo(text: str = "", err: bool = False) -> None:
    click.echo(redact.mask(text), err=err)


@click.command("import")
@click.argument("source")
@click.option("--name", help="The profile's name (default: from the recipe).")
@click.option(
    "--hardware", metavar="ID", help="NVIDIA's hardware id the recipe must be for (dgx-spark, dgx-spark-2gpu, ...)."
)
@click.option("--pin", is_flag=True, help="Pin a mutable image tag (:latest, nightly) to the digest the source states.")
@click.option(
    "--source-url",
    metavar="URL",
    help="Where a local copy is published (a GitHub blob or raw URL at a commit), recorded as the profile's [source].",
)
@click.option("--force", is_flag=True, help="Replace a profile of yours of the same name.")
@click.option("--json", "as_json", is_flag=True, help="As JSON: the files written, what did not map, lint's problems.")
@click.pass_context
def import_cmd(
    ctx: click.Context,
    source: str,
    name: str | None,
    hardware: str | None,
    pin: bool,
    source_url: str | None,
    force: bool,
    as_json: bool,
) -> None:
    """Read a recipe (NVIDIA, eugr, sparkrun v1/v2, sparkring) as a profile of your own.

    SOURCE: a file, a folder holding one recipe, or a URL of a raw file. Exit 0: written and clean;
    1: written, with what did not map and lint's problems listed; 2: refused, nothing written."""
    w = make(source, name, hardware, pin, source_url)
    imp = w.imported
    folder = USER_PROFILES.expanduser()
    path = folder / f"{imp.name}.toml"
    if path.exists() and not force:
        raise InputError(
            f"{path} exists: a profile of yours named {imp.name!r}",
            f"pick another name (--name NAME) or replace it: sparkcluster profile import {source} --force",
        )
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path.write_text(imp.text)
        perf_path = perf_record.record_path(path)
        if w.perf_text is not None:
            perf_path.write_text(w.perf_text)
    except OSError as e:
        raise InputError(f"cannot write {path}: {e.strerror}", f"check that {folder} is writable") from None
    clean = not imp.unmapped and not imp.problems
    if as_json:
        body = {
            "profile": imp.name,
            "path": str(path),
            "format": imp.format,
            "performance_record": str(perf_path) if w.perf_text else None,
            "mutable_image": imp.mutable,
            "unmapped": [{"line": u.line, "item": u.item, "why": u.why} for u in imp.unmapped],
            "problems": [{"rule": p.rule, "severity": p.severity, "message": p.message} for p in imp.problems],
        }
        _echo(json.dumps(body, indent=2))
    else:
        _report(imp, path, perf_path if w.perf_text else None)
    if not clean:
        ctx.exit(EXIT_FAILED)


def _report(imp: build.Imported, path: Path, perf_path: Path | None) -> None:
    _echo(f"wrote {path}  ({imp.format} recipe; sparkcluster up --profile {imp.name})")
    if perf_path:
        _echo(f"wrote {perf_path}  (the source's performance record for this recipe)")
    if imp.mutable and not imp.profile.image.digest:
        _echo(
            f"image {imp.mutable}: a mutable tag, what it serves changes when its publisher pushes: "
            "pin it with --pin where the source states a digest, or set [image] digest to the RepoDigests "
            "entry of the image you pulled (docker image inspect)"
        )
    elif imp.profile.image.digest:
        _echo(f"image pinned: {imp.profile.image.ref}")
    if imp.unmapped:
        _echo(f"not mapped ({len(imp.unmapped)}):")
        for u in imp.unmapped:
            _echo(f"  {u.text()}")
    for p in imp.problems:
        _echo(f"lint: {p.line()}")
    if not imp.unmapped and not imp.problems:
        _echo(f"{imp.name}: ok")
    elif failures(imp.problems):
        _echo(f"fix the profile before `up`: sparkcluster profile lint {imp.name}")


@click.command("export")
@click.argument("name")
@click.option("--format", "fmt", type=click.Choice(["sparkrun"]), required=True, help="The recipe format to write.")
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Write to this file (default: stdout)."
)
def export_cmd(name: str, fmt: str, output: Path | None) -> None:
    """Write profile NAME as a recipe another tool runs (sparkrun v2)."""
    prof = load_profile(name)
    assert isinstance(prof, Profile)
    text = export.sparkrun_recipe(prof)
    yaml.safe_load(text)  # what is written reads back
    if output is None:
        _echo(text.rstrip("\n"))
        return
    try:
        output.write_text(text)
    except OSError as e:
        raise InputError(f"cannot write {output}: {e.strerror}", "check the path") from None
    _echo(f"wrote {output}  (sparkrun run {output})")
