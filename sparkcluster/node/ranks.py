"""Executor "mp" across nodes (issue 28): each node runs its own rank(s) of `vllm serve`, and the set
lives and dies together.

vLLM's multi-node mp executor fixes its torch.distributed world at start: a rank that dies cannot
join the running world again, and a headless worker whose head died keeps waiting on the head's
message queue (vLLM 0.32's headless executor watches only its own ranks:
`MultiprocExecutor.start_worker_monitor(inline=True)`). So the head's supervisor owns the set: every
start of its own server is an *epoch* (a fresh token), published on its report; each worker's agent
runs its rank for the head's current epoch only (`RankKeeper`), stops it when the head no longer
runs one or has started another, never restarts it alone, and says on its own report whether its
rank for that epoch is alive. The head reads those reports (`rank_problem`, `ranks_waiting`) and
restarts the whole set within its bounds when a rank is gone. Standard library only.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request

from .contract import DESIRED_PATH, RANK_PATH, SERVE_LOG, Desired
from .engine_log import SERVE_MARK
from .journal import Journal, read_json, write_json
from .procgroup import stop_group

RANK_START_S = 60.0  # a worker's rank must be running for the head's epoch within this bound
STOP_GRACE_S = 15.0


def head_set(ip: str, port: int, timeout: float = 1.0) -> dict | None:
    """The head's published set ({generation, epoch, run}), or None when its report does not answer."""
    try:
        with urllib.request.urlopen(f"http://{ip}:{port}/", timeout=timeout) as r:
            return json.loads(r.read()).get("set") or {}
    except (OSError, ValueError):
        return None


class RankKeeper:
    """A worker's agent side: its node's rank(s) of `vllm serve --headless` for the head's epoch."""

    def __init__(self, cfg: dict, journal: Journal):
        self.cfg, self.journal = cfg, journal
        self.proc: subprocess.Popen | None = None
        before = read_json(RANK_PATH) or {}  # survives a container restart: that epoch's rank is gone
        self.epoch, self.exit = before.get("epoch"), before.get("exit")
        if before.get("pid") and self.exit is None:
            self.exit = "the container restarted"

    def report(self) -> dict:
        desired = Desired.of(read_json(DESIRED_PATH))
        return {
            "rank": self.cfg["rank"],
            "generation": desired.generation if desired else None,
            "epoch": self.epoch,
            "alive": self.proc is not None and self.proc.poll() is None,
            "pid": self.proc.pid if self.proc else None,
            "exit": self.exit,
        }

    def save(self) -> None:
        write_json(RANK_PATH, {"epoch": self.epoch, "pid": self.proc.pid if self.proc else None, "exit": self.exit})

    def tick(self) -> None:
        raw = read_json(DESIRED_PATH)
        if raw is None and os.path.exists(DESIRED_PATH):  # caught mid-write
            return
        desired = Desired.of(raw)
        head = self.cfg["head"]
        published = head_set(head["ip"], self.cfg["report_port"]) if desired else {}
        if self.proc is not None and self.proc.poll() is not None:
            self.exit = self.proc.returncode
            self.journal.write("rank exited", rank=self.cfg["rank"], epoch=self.epoch, code=self.exit)
            self.proc = None
            self.save()
        if published is None:  # the head does not answer (rebooting?): leave the rank as it is
            return
        want = (
            published.get("epoch")
            if desired and published.get("run") and published.get("generation") == desired.generation
            else None
        )
        if self.proc is not None and want != self.epoch:
            self.stop("the head no longer runs this set" if want is None else "the head started a new set")
        if self.proc is None and want is not None and want != self.epoch:
            self.start(desired, want)

    def start(self, desired: Desired, epoch: str) -> None:
        os.makedirs(os.path.dirname(SERVE_LOG), exist_ok=True)
        log = open(SERVE_LOG, "ab")
        # this start's lines follow the mark (node/engine_log: its phases and all-reduce backend)
        log.write(f"{SERVE_MARK} {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n".encode())
        log.flush()
        # no secret: a headless rank serves no API and finds the weights in its own HF cache
        self.proc = subprocess.Popen(
            list(desired.argv), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        self.epoch, self.exit = epoch, None
        self.save()
        self.journal.write("rank started", rank=self.cfg["rank"], epoch=epoch, pid=self.proc.pid)

    def stop(self, why: str) -> None:
        if self.proc is None:
            return
        pid = self.proc.pid
        self.exit = stop_group(self.proc, STOP_GRACE_S)
        self.journal.write("rank stopped", rank=self.cfg["rank"], epoch=self.epoch, pid=pid, why=why)
        self.proc = None
        self.save()


def ranks_waiting(cfg: dict, reports: dict[str, dict | None], generation: str | None) -> str | None:
    """Before the head starts a set: None when every worker's agent answers and holds the same
    server (its desired state), else what is missing."""
    for peer in cfg.get("peers", []):
        rep = reports.get(peer["name"])
        if rep is None:
            return f"{peer['name']}'s agent does not answer at {peer['ip']}:{cfg['report_port']}"
        rank = rep.get("rank") or {}
        if rank.get("generation") != generation:
            return f"{peer['name']} has not been handed this server yet"
        if rank.get("alive"):
            return f"{peer['name']} still runs the rank of an earlier set"
    return None


def rank_problem(cfg: dict, reports: dict[str, dict | None], epoch: str, started: float, now: float) -> str:
    """While the head's server runs: why a worker's rank of this epoch is gone ("" when none is).
    An unanswered report judges nothing (memory says "unknown" for it); a report that comes back
    after a reboot says its rank is gone."""
    for peer in cfg.get("peers", []):
        rep = reports.get(peer["name"])
        if rep is None:
            continue
        rank = rep.get("rank") or {}
        who = f"rank {rank.get('rank', '?')} on {peer['name']}"
        if rank.get("epoch") == epoch:
            if not rank.get("alive"):
                return f"{who} exited ({rank.get('exit')}); a rank cannot rejoin a running set alone"
        elif now - started > RANK_START_S:
            return f"{who} did not start within {RANK_START_S:g}s"
    return ""
