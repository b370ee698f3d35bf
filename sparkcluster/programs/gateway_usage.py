"""The gateway's usage ledger: one SQLite file in its folder on the node (bound into its container),
written by the gateway (gateway/app, through `Ledger`) and read on the host by `sparkcluster gateway
usage` (this module run as a program over SSH: `main`). Standard library only: the gateway's image
and every DGX OS host's python3 have sqlite3.

What it keeps, per key name, model and UTC hour: requests, prompt and completion tokens (as the
engine reported them in its answer's `usage`), errors (answers of 400 and over, streams broken
off), and the time to the first token of streamed answers (its sum and count, so an average can be
made of any rows added together). Beside it, each key's request bucket (gateway/quota), so a limit
holds across a restart of the gateway. Rows older than the retention are deleted (`prune`).

WAL mode (https://sqlite.org/wal.html): the reader on the host never blocks the gateway's writes,
and `synchronous=NORMAL` makes a commit cost no fsync (WAL mode stays consistent after a crash with
it; only the last commits may be lost). The gateway runs as root in its container and the folder is
the SSH user's: `Ledger` gives the database file the folder's owner, and SQLite, running as root,
gives its -wal and -shm files the database file's owner (`robustFchown` in SQLite's os_unix.c), so
the SSH user reads, and `gateway down --purge-usage` removes, all of them.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import threading
import time

FILENAME = "usage.db"
USAGE_DIR = "usage"  # in the gateway's folder (its config's `data`): the ledger's own
HOUR = 3600
DAY = 86400
RETENTION_DAYS = 400  # a year of bills and a month to settle the last
COLUMNS = ("requests", "prompt_tokens", "completion_tokens", "errors", "ttft_s_sum", "ttft_count")
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS usage (hour INTEGER NOT NULL, key TEXT NOT NULL, model TEXT NOT NULL, "
    "requests INTEGER NOT NULL DEFAULT 0, prompt_tokens INTEGER NOT NULL DEFAULT 0, "
    "completion_tokens INTEGER NOT NULL DEFAULT 0, errors INTEGER NOT NULL DEFAULT 0, "
    "ttft_s_sum REAL NOT NULL DEFAULT 0, ttft_count INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (hour, key, model))",
    "CREATE TABLE IF NOT EXISTS buckets (key TEXT PRIMARY KEY, tokens REAL NOT NULL, at REAL NOT NULL)",
)


def connect(path: str, write: bool) -> sqlite3.Connection:
    db = sqlite3.connect(path, timeout=10.0, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA busy_timeout=10000")
    if write:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        for statement in SCHEMA:
            db.execute(statement)
    return db


class Ledger:
    """The gateway's side: what it adds, kept in memory and written in one transaction per `flush`
    (the gateway flushes once a poll and when it stops); `folder` None keeps it in memory only."""

    def __init__(self, folder: str | None, retention_days: int = RETENTION_DAYS):
        self.retention_days = retention_days
        self.pending: dict[tuple[int, str, str], list] = {}
        self.buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, at): changed since the last flush
        self.today: tuple[int, dict[str, int]] = (0, {})  # the UTC day's start, key -> its tokens that day
        self.db = None
        self.lock = threading.Lock()  # one writer at a time: a flush off the loop, the last one at stop
        if folder:
            path = os.path.join(folder, FILENAME)
            self.db = connect(path, write=True)
            _owned_like(path, folder)
            self.prune()

    # -- what the gateway reads back at start
    def saved_buckets(self) -> dict[str, tuple[float, float]]:
        if self.db is None:
            return {}
        return {k: (t, a) for k, t, a in self.db.execute("SELECT key, tokens, at FROM buckets")}

    def tokens_today(self, key: str, now: float) -> int:
        day = int(now // DAY * DAY)
        if self.today[0] != day:
            counted: dict[str, int] = {}
            if self.db is not None:
                q = "SELECT key, SUM(prompt_tokens + completion_tokens) FROM usage WHERE hour >= ? GROUP BY key"
                counted = {k: int(n or 0) for k, n in self.db.execute(q, (day,))}
            for (hour, k, _), row in self.pending.items():
                if hour >= day:
                    counted[k] = counted.get(k, 0) + row[1] + row[2]
            self.today = (day, counted)
        return self.today[1].get(key, 0)

    # -- what the gateway adds
    def record(self, key: str, model: str, now: float, prompt=0, completion=0, error=False, ttft_s=None) -> None:
        self.tokens_today(key, now)  # the day's count is current before it is added to
        row = self.pending.setdefault((int(now // HOUR * HOUR), key, model), [0, 0, 0, 0, 0.0, 0])
        row[0] += 1
        row[1] += int(prompt)
        row[2] += int(completion)
        row[3] += 1 if error else 0
        if ttft_s is not None:
            row[4] += float(ttft_s)
            row[5] += 1
        self.today[1][key] = self.today[1].get(key, 0) + int(prompt) + int(completion)

    def bucket(self, key: str, tokens: float, at: float) -> None:
        self.buckets[key] = (tokens, at)

    def take(self) -> tuple[dict, dict]:
        """What is to be written, handed over (the gateway writes it off its event loop)."""
        out = (self.pending, self.buckets)
        self.pending, self.buckets = {}, {}
        return out

    def write(self, batch: tuple[dict, dict]) -> None:
        pending, buckets = batch
        add = ", ".join(f"{c} = {c} + excluded.{c}" for c in COLUMNS)
        with self.lock:
            if self.db is None or not (pending or buckets):
                return
            with _transaction(self.db):
                self.db.executemany(
                    f"INSERT INTO usage (hour, key, model, {', '.join(COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
                    f"ON CONFLICT (hour, key, model) DO UPDATE SET {add}",
                    [(*k, *row) for k, row in pending.items()],
                )
                self.db.executemany(
                    "INSERT INTO buckets (key, tokens, at) VALUES (?, ?, ?) "
                    "ON CONFLICT (key) DO UPDATE SET tokens = excluded.tokens, at = excluded.at",
                    [(k, t, a) for k, (t, a) in buckets.items()],
                )

    def flush(self) -> None:
        self.write(self.take())

    def prune(self, now: float | None = None) -> None:
        if self.db is not None:
            cut = int(((now or time.time()) - self.retention_days * DAY) // HOUR * HOUR)
            with self.lock:
                if self.db is not None:
                    self.db.execute("DELETE FROM usage WHERE hour < ?", (cut,))

    def close(self) -> None:
        if self.db is not None:
            self.flush()
            with self.lock:
                self.db.close()
                self.db = None


class _transaction:
    def __init__(self, db):
        self.db = db

    def __enter__(self):
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind, *_):
        self.db.execute("ROLLBACK" if kind else "COMMIT")


def _owned_like(path: str, folder: str) -> None:
    """The database file owned as its folder is (the gateway runs as root; the folder is the SSH
    user's, made by the controller over SSH)."""
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        st = os.stat(folder)
        for p in (path, path + "-wal", path + "-shm"):
            if os.path.exists(p):
                os.chown(p, st.st_uid, st.st_gid)


def rows(path: str, since: int = 0, key: str | None = None, model: str | None = None) -> list[dict]:
    """The ledger's rows from `since` (epoch seconds) on, for one key and model where named, oldest first."""
    if not os.path.exists(path):
        return []
    db = connect(path, write=False)
    try:
        where, args = ["hour >= ?"], [int(since // HOUR * HOUR)]
        if key:
            where.append("key = ?")
            args.append(key)
        if model:
            where.append("model = ?")
            args.append(model)
        cur = db.execute(
            f"SELECT hour, key, model, {', '.join(COLUMNS)} FROM usage WHERE {' AND '.join(where)} "
            "ORDER BY hour, key, model",
            args,
        )
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r)) for r in cur]
    except sqlite3.OperationalError as e:  # no table yet: the gateway has not opened it
        if "no such table" in str(e):
            return []
        raise
    finally:
        db.close()


def main(argv: list[str]) -> int:
    """`gateway_usage FOLDER SINCE [KEY] [MODEL]`: the rows as one JSON list on stdout."""
    folder, since = os.path.expanduser(argv[1]), int(argv[2])
    key = argv[3] if len(argv) > 3 and argv[3] else None
    model = argv[4] if len(argv) > 4 and argv[4] else None
    print(json.dumps(rows(os.path.join(folder, FILENAME), since, key, model)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
