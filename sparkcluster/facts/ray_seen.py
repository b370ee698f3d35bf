"""Image IDs in which Ray has been seen to work, remembered on the controller.

Starting a throwaway container to run `ray --version` is most of a preflight's time. An image ID
is the digest of the image's content: once Ray has worked in one ID (`ray --version` ran, or a
container of ours runs `ray start` on it), the image holds a working Ray wherever it is loaded, and
only a new ID needs the container again. Whether a node can start containers at all is what the
docker checks ask.
"""

from __future__ import annotations

import re
from pathlib import Path

from sparkcluster.facts.image_memo import IMAGE_ID, ImageMemo

KEEP = 20  # most recent IDs; a cluster uses one image at a time
_VERSION = re.compile(r"ray, version \S+")
_MEMO = ImageMemo("ray-in-images.json", KEEP)


def path() -> Path:
    return _MEMO.path()


def load() -> dict[str, str]:
    """image ID -> the `ray --version` line seen in it; {} when absent or unreadable."""
    return _MEMO.load()


def version_line(text: str) -> str:
    """`ray, version 2.60.0 (running in abc)` -> `ray, version 2.60.0`."""
    return text.split(" (", 1)[0].strip()


def remember(seen: dict[str, str]) -> None:
    """Adds image ID -> version line pairs as the most recent, keeping KEEP; best effort."""
    _MEMO.remember(
        {k: version_line(v) for k, v in seen.items() if IMAGE_ID.fullmatch(k) and _VERSION.fullmatch(version_line(v))}
    )
