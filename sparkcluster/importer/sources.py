"""Where a recipe is read from: a local file, a folder holding one recipe, or the URL of a raw file
(fetched with httpx, the project's HTTP client). Beside it: NVIDIA's performance.yaml, sparkring's
image lock. A file saved under its repository path with `/` written `__` (how field samples are
kept) finds its neighbours under the same naming."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from sparkcluster.importer.formats import Refused

MAX_BYTES = 1_000_000
RECIPE_NAMES = ("recipe.yaml", "recipe.yml")
_GITHUB = re.compile(
    r"^https://(?:raw\.githubusercontent\.com/(?P<o1>[^/]+)/(?P<r1>[^/]+)/(?P<c1>[0-9a-f]{40})/(?P<p1>.+)"
    r"|github\.com/(?P<o2>[^/]+)/(?P<r2>[^/]+)/(?:blob|raw)/(?P<c2>[0-9a-f]{40})/(?P<p2>.+))$"
)


@dataclass
class Origin:
    """Where the recipe is published: repo + path + commit, or a URL; None of them for a local file."""

    repo: str | None = None
    path: str | None = None
    commit: str | None = None
    url: str | None = None

    @property
    def known(self) -> bool:
        return bool(self.url or self.repo)


def origin_of(url: str) -> Origin:
    """A GitHub file at a commit (raw or blob URL) as repo + path + commit; any other https URL as itself."""
    m = _GITHUB.match(url)
    if m:
        g = {k: v for k, v in m.groupdict().items() if v}
        owner, repo = g.get("o1") or g["o2"], g.get("r1") or g["r2"]
        return Origin(f"{owner}/{repo}", g.get("p1") or g["p2"], g.get("c1") or g["c2"])
    return Origin(url=url) if url.startswith("https://") else Origin()


@dataclass
class Fetched:
    name: str  # the file's name (for the format and the default profile name)
    data: bytes
    where: str  # as the user named it
    neighbours: dict[str, bytes] = field(default_factory=dict)  # "performance.yaml", "lock" -> bytes
    origin: Origin = field(default_factory=Origin)


def _is_url(source: str) -> bool:
    return source.startswith(("http://", "https://"))


def _get(client: httpx.Client, url: str) -> bytes | None:
    try:
        r = client.get(url)
    except httpx.HTTPError as e:
        raise Refused(f"cannot fetch {url}: {e}", "check the URL and the network") from None
    if r.status_code == 404:
        return None
    if r.status_code != 200:
        raise Refused(f"cannot fetch {url}: HTTP {r.status_code}", "check the URL (a raw file's)")
    if len(r.content) > MAX_BYTES:
        raise Refused(f"{url}: larger than {MAX_BYTES} bytes: not a recipe", "name a recipe file")
    return r.content


def _raw(url: str) -> str:
    """A GitHub blob page's URL as its raw file's (the page itself is HTML)."""
    m = re.match(r"^https://github\.com/([^/]+)/([^/]+)/blob/(.+)$", url)
    return f"https://raw.githubusercontent.com/{m.group(1)}/{m.group(2)}/{m.group(3)}" if m else url


def fetch(source: str, timeout: float = 30.0, hardware: str | None = None) -> Fetched:
    if _is_url(source):
        url = _raw(source)
        with httpx.Client(timeout=timeout, follow_redirects=True) as client:
            data = _get(client, url)
            if data is None:
                raise Refused(f"cannot fetch {url}: HTTP 404", "check the URL (a raw file's)")
            name = url.rsplit("/", 1)[-1].split("?", 1)[0]
            out = Fetched(name, data, source, origin=origin_of(source))
            base = url.rsplit("/", 1)[0]
            if name in RECIPE_NAMES:
                perf = _get(client, f"{base}/performance.yaml")
                if perf is not None:
                    out.neighbours["performance.yaml"] = perf
            if name.endswith(".json") and "/recipes/" in url:
                lock = _get(client, url.split("/recipes/", 1)[0] + "/runtime/faststart-lock.json")
                if lock is not None:
                    out.neighbours["lock"] = lock
            return out
    path = Path(source).expanduser()
    if path.is_dir():
        path = _one_in(path, hardware)
    if not path.is_file():
        raise Refused(f"no file or folder at {path}", "name a recipe file, a folder holding one, or a URL")
    try:
        if path.stat().st_size > MAX_BYTES:
            raise Refused(f"{path}: larger than {MAX_BYTES} bytes: not a recipe", "name a recipe file")
        out = Fetched(path.name, path.read_bytes(), source)
        for key, cand in _neighbours(path).items():
            if cand.is_file():
                out.neighbours[key] = cand.read_bytes()
    except OSError as e:
        raise Refused(f"cannot read {path}: {e.strerror}", "check the file's permissions") from None
    return out


def _one_in(folder: Path, hardware: str | None = None) -> Path:
    for name in RECIPE_NAMES:
        if (folder / name).is_file():
            return folder / name
    # NVIDIA's layout: models/<builder>/<model>/<hardware>/<os>/<backend>/[<NN>gb/][<precision>/]recipe.yaml
    nested = sorted(p for name in RECIPE_NAMES for p in folder.rglob(name))
    if hardware:
        nested = [p for p in nested if hardware in p.relative_to(folder).parts]
    if len(nested) == 1:
        return nested[0]
    if nested:
        raise Refused(
            f"{folder}: {len(nested)} recipes"
            + (f" for {hardware}" if hardware else "")
            + ": "
            + ", ".join(str(p.relative_to(folder)) for p in nested[:8]),
            "name one of them" + ("" if hardware else ", or pass --hardware ID"),
        )
    manifest = folder / ".sparkrun" / "registry.yaml"
    if manifest.is_file():
        return manifest
    found = sorted(p for p in folder.iterdir() if p.suffix in (".yaml", ".yml", ".json") and p.is_file())
    if len(found) == 1:
        return found[0]
    raise Refused(
        f"{folder}: {len(found)} recipe files" + (f" ({', '.join(p.name for p in found[:5])})" if found else ""),
        "name one file",
    )


def _neighbours(path: Path) -> dict[str, Path]:
    out: dict[str, Path] = {}
    name = path.name
    if name in RECIPE_NAMES:
        out["performance.yaml"] = path.with_name("performance.yaml")
    elif name.endswith("__recipe.yaml"):
        out["performance.yaml"] = path.with_name(name.removesuffix("recipe.yaml") + "performance.yaml")
    if name.endswith(".json"):
        if path.parent.name == "recipes":
            out["lock"] = path.parent.parent / "runtime" / "faststart-lock.json"
        else:
            out["lock"] = path.with_name("runtime__faststart-lock.json")
    return out


def registry_recipes(manifest: Path, doc: dict) -> list[tuple[str, list[str]]]:
    """(registry name, its recipe files relative to the repository) of a sparkrun registry manifest."""
    root = manifest.parent.parent if manifest.parent.name == ".sparkrun" else manifest.parent
    out = []
    for reg in doc.get("registries") or []:
        d = root / str(reg.get("recipes") or "")
        files = sorted(str(p.relative_to(root)) for p in d.rglob("*.yaml")) if d.is_dir() and reg.get("recipes") else []
        # saved under the repository path with `/` as `__` (field samples)
        files += sorted(p.name for p in manifest.parent.glob(f"{reg.get('recipes')}__*.yaml"))
        out.append((str(reg.get("name")), files))
    return out
