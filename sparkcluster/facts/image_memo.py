"""What the controller remembers per image ID, for the probes that would otherwise start a throwaway
container of the image to read it (`ray_seen`: Ray runs in it; `image_nccl`: the NCCL it loads).

An image ID is the digest of the image's content, so what was read in one holds wherever that image
is loaded: one small JSON file per fact, image ID -> text, the most recently seen last, at most
`keep` of them. Writing is best effort (a failed write only costs a re-read) and atomic through a
private temporary name, since doctor and up may both write.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sparkcluster import log

IMAGE_ID = re.compile(r"sha256:[0-9a-f]{64}")


@dataclass(frozen=True)
class ImageMemo:
    filename: str  # in the controller's state folder
    keep: int  # most recent IDs; a cluster uses one image at a time

    def path(self) -> Path:
        return log.state_dir() / self.filename

    def load(self) -> dict[str, str]:
        """image ID -> what was read in it; {} when absent or unreadable."""
        try:
            doc = json.loads(self.path().read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(doc, dict):
            return {}
        return {k: v for k, v in doc.items() if isinstance(k, str) and IMAGE_ID.fullmatch(k) and isinstance(v, str)}

    def remember(self, new: dict[str, str]) -> None:
        """Adds `new` as the most recent, keeping `keep`; writes only when that changes the file."""
        if not new:
            return
        old = self.load()
        merged = {k: v for k, v in old.items() if k not in new} | new
        merged = dict(list(merged.items())[-self.keep :])
        if list(merged.items()) == list(old.items()):
            return
        p = self.path()
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            prefix = "." + self.filename.removesuffix(".json") + "."
            with tempfile.NamedTemporaryFile("w", dir=p.parent, prefix=prefix, delete=False) as f:
                json.dump(merged, f, indent=1)
            os.replace(f.name, p)
        except OSError as e:
            log.get(__name__).debug("could not remember what an image holds", file=self.filename, error=str(e))
