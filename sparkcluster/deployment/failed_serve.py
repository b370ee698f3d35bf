"""A `vllm serve` that failed to start: the first failure across its ranks, and its logs kept on the
controller before a rollback removes the containers (issue 62).

Each node's container holds the server's log and NCCL's (node/contract: /var/log/sparkcluster/);
one `docker exec` per node reads their ends. They are written under the state folder,
`failed/<UTC time>-<deployment>/<node>.log` (the newest KEEP folders stay, each file its last
CAP_BYTES), and the first failure among them (node/engine_failure) becomes the stage's error, naming
the rank and node it came from, with the folder in its fix. `sparkcluster logs` and `events` name the
newest folder when no container is left to read.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import docker.errors

from sparkcluster import log, redact
from sparkcluster.errors import SparkError
from sparkcluster.node import contract, engine_failure
from sparkcluster.remote.dockerapi import UNREACHABLE, run_in

KEEP = 10  # folders of failed starts kept, newest first
CAP_BYTES = 2 * 1024 * 1024  # the end of each log file kept
FOLDER = "failed"


@dataclass(frozen=True)
class Kept:
    folder: Path
    first: tuple[str, engine_failure.Failure] | None  # (node, failure) that happened first

    def cause(self) -> engine_failure.Cause | None:
        return self.first[1].cause() if self.first else None

    def error(self, node_of_ip: dict[str, str]) -> tuple[str, str] | None:
        """(the reason line, the failure lines by rank and node) of the first failure, or None."""
        if not self.first:
            return None
        node, failure = self.first

        def where(ln: engine_failure.Line) -> str:
            at = node_of_ip.get(ln.ip, node) if ln.ip else node
            return f"{ln.proc} on {at}" if ln.proc else at

        cause = failure.cause()
        head = f"{cause.what}: " if cause else ""
        return f"{head}{failure.first.text} ({where(failure.first)})", failure.render(where)


def read_logs(api, container: str) -> str:
    """The ends of every log under /var/log/sparkcluster in the container, `tail`'s `==> f <==` headers
    between them; an empty string where the container or its logs are gone."""
    script = f"tail -c {CAP_BYTES} {contract.NCCL_LOG_DIR}/*.log 2>/dev/null; true"
    try:
        return redact.mask(run_in(api, container, ["sh", "-c", script], warn=True).stdout)
    except (SparkError, docker.errors.DockerException, *UNREACHABLE):  # best effort: an error is on its way
        return ""


def first_failure(logs: dict[str, str]) -> tuple[str, engine_failure.Failure] | None:
    """The earliest failure by vLLM's own timestamps (MM-DD HH:MM:SS) where both sides carry one, else
    in the order the nodes are given (the head first)."""
    found = [(n, f) for n, text in logs.items() if (f := engine_failure.read(text))]
    if not found:
        return None
    stamped = [(f.first.ts, i) for i, (_, f) in enumerate(found) if f.first.ts]
    if len(stamped) == len(found):
        return found[min(stamped)[1]]
    return found[0]


def root() -> Path:
    return log.state_dir() / FOLDER


def keep(deployment: str, logs: dict[str, str], now: float | None = None) -> Kept:
    """Write each node's logs under a new folder (the owner's only: 0700, files 0600), keep the newest
    KEEP folders, and find the first failure among them."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    safe = "".join(c if c.isalnum() or c in "-_.+@" else "_" for c in deployment)
    folder = root() / f"{stamp}-{safe}"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    for node, text in logs.items():
        path = folder / f"{node}.log"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text[-CAP_BYTES * 4 :])  # every file's end, several files a node
    for old in sorted(root().iterdir(), reverse=True)[KEEP:]:
        for p in old.glob("*"):
            p.unlink(missing_ok=True)
        old.rmdir()
    return Kept(folder, first_failure(logs))


def newest() -> Path | None:
    """The folder of the last failed start kept on this controller, or None."""
    try:
        folders = sorted(p for p in root().iterdir() if p.is_dir())
    except FileNotFoundError:
        return None
    return folders[-1] if folders else None
