"""Image IDs in which `ray --version` has been seen to run, remembered on the controller.

Starting a throwaway container to run `ray --version` is most of a preflight's time. An image ID
is the digest of the image's content, so once Ray has run in one ID it runs in that ID on every
node of the cluster; only a new ID needs the container again.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from . import log

KEEP = 20  # most recent IDs; a cluster uses one image at a time
_ID = re.compile(r"sha256:[0-9a-f]{64}")


def path() -> Path:
    return log.state_dir() / "ray-in-images.json"


def load() -> dict[str, str]:
    """image ID -> the `ray --version` line seen in it; {} when absent or unreadable."""
    try:
        doc = json.loads(path().read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict):
        return {}
    return {k: v for k, v in doc.items() if isinstance(k, str) and _ID.fullmatch(k) and isinstance(v, str)}


def version_line(text: str) -> str:
    """`ray, version 2.60.0 (running in abc)` -> `ray, version 2.60.0`."""
    return text.split(" (", 1)[0].strip()


def remember(seen: dict[str, str]) -> None:
    """Adds image ID -> version line pairs, keeping the KEEP most recent; best effort."""
    new = {k: version_line(v) for k, v in seen.items() if _ID.fullmatch(k) and version_line(v).startswith("ray, version")}
    if not new:
        return
    old = load()
    if all(old.get(k) == v for k, v in new.items()):
        return
    merged = {k: v for k, v in old.items() if k not in new} | new
    merged = dict(list(merged.items())[-KEEP:])
    p = path()
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(".tmp")
        tmp.write_text(json.dumps(merged, indent=1))
        os.replace(tmp, p)
    except OSError as e:
        log.get(__name__).debug("could not remember ray in images", error=str(e))
