"""Image IDs in which Ray has been seen to work, remembered on the controller.

Starting a throwaway container to run `ray --version` is most of a preflight's time. An image ID
is the digest of the image's content: once Ray has worked in one ID (`ray --version` ran, or a
container of ours runs `ray start` on it), the image holds a working Ray wherever it is loaded, and
only a new ID needs the container again. Whether a node can start containers at all is what the
docker checks ask.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

from sparkcluster import log

KEEP = 20  # most recent IDs; a cluster uses one image at a time
_ID = re.compile(r"sha256:[0-9a-f]{64}")
_VERSION = re.compile(r"ray, version \S+")


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
    """Adds image ID -> version line pairs as the most recent, keeping KEEP; best effort."""
    new = {k: version_line(v) for k, v in seen.items() if _ID.fullmatch(k) and _VERSION.fullmatch(version_line(v))}
    if not new:
        return
    old = load()
    merged = {k: v for k, v in old.items() if k not in new} | new
    merged = dict(list(merged.items())[-KEEP:])
    if list(merged.items()) == list(old.items()):
        return
    p = path()
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        # a private temporary name: doctor and up may both write, and os.replace keeps the file whole
        with tempfile.NamedTemporaryFile("w", dir=p.parent, prefix=".ray-in-images.", delete=False) as f:
            json.dump(merged, f, indent=1)
        os.replace(f.name, p)
    except OSError as e:
        log.get(__name__).debug("could not remember ray in images", error=str(e))
