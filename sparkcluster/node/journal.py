"""The agent's files: JSON documents written atomically, and the journal of what it saw and did."""

from __future__ import annotations

import json
import os
import threading
import time

from .contract import JOURNAL_KEEP, JOURNAL_PATH


def read_json(path: str) -> dict | None:
    try:
        with open(path) as f:
            doc = json.load(f)
        return doc if isinstance(doc, dict) else None
    except (OSError, ValueError):
        return None


def write_json(path: str, doc: dict, mode: int = 0o644) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)


class Journal:
    def __init__(self, path: str = JOURNAL_PATH):
        self.path = path
        self.lines = 0
        self._lock = threading.Lock()  # the canary's check (node/canary) writes from a thread of its own

    def write(self, event: str, **detail) -> None:
        with self._lock:
            self._write(event, detail)

    def _write(self, event: str, detail: dict) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        entry = {"ts": round(time.time(), 3), "event": event, **detail}
        with open(self.path, "a") as f:
            f.write(json.dumps(entry) + "\n")
        print(f"sparkcluster-agent: {event} {json.dumps(detail)}", flush=True)
        self.lines += 1
        if self.lines % 200 == 0:
            self._trim()

    def _trim(self) -> None:
        with open(self.path) as f:
            kept = f.readlines()[-JOURNAL_KEEP:]
        with open(self.path + ".tmp", "w") as f:
            f.writelines(kept)
        os.replace(self.path + ".tmp", self.path)
