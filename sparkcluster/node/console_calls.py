"""What the head's agent answers the gateway's console (gateway/console), each call with the
deployment's token (WAKE_PATH, the one `POST /wake` asks for; the gateway holds it in its 0600 config):

- `GET /journal?since=TS&limit=N`: the journal's entries after TS, the newest N;
- `GET /log?lines=N`: the last N lines of vllm serve's log, every secret the server was given (its
  secrets file) and the token itself masked, as `sparkcluster logs` masks the secrets it knows;
- `POST /restart`, `POST /standby` (node/supervisor `ask`): the engine restarted, or stopped back to
  standby, journalled with the name the `X-Sparkcluster-By` header gives (the console key's name).

A peer without the token gets 401 and reads nothing: the journal and the log are no peer's (the
agent's `/status`, which carries them too, answers the node itself only). Standard library only.
"""

from __future__ import annotations

import hmac
import json
import os

from .contract import JOURNAL_PATH, SECRETS_PATH, SERVE_LOG, WAKE_PATH

MASK = "******"  # as sparkcluster/redact masks a secret
MAX_LINES = 2000  # one answer's bound, journal or log
TAIL_BYTES = 512 * 1024  # read from the end of a file, never the whole of a long log


def tail(path: str, lines: int, max_bytes: int = TAIL_BYTES) -> list[str]:
    """The last `lines` lines of `path` (read from its last `max_bytes`); [] where it cannot be read."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    got = text.splitlines()
    if size > max_bytes and got:
        got = got[1:]  # the first line read is cut
    return got[-lines:] if lines > 0 else []


def masked(lines: list[str], secrets: list[str]) -> list[str]:
    """`lines` with every secret (4 characters or more, longest first) replaced by MASK."""
    values = sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True)
    out = []
    for line in lines:
        for v in values:
            line = line.replace(v, MASK)
        out.append(line)
    return out


def secrets_known() -> list[str]:
    """The values of the server's secrets file and the token: what a log line must never show."""
    out = []
    try:
        with open(SECRETS_PATH) as f:
            out += [str(v) for v in json.load(f).values()]
    except (OSError, ValueError, AttributeError):
        pass
    try:
        with open(WAKE_PATH) as f:
            out.append(f.read().strip())
    except OSError:
        pass
    return out


def entries(lines: list[str], since: float, limit: int) -> list[dict]:
    """The journal's lines as entries after `since` (epoch seconds), the newest `limit`."""
    out = []
    for line in lines:
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if isinstance(e, dict) and float(e.get("ts") or 0) > since:
            out.append(e)
    return out[-limit:]


def _number(query: dict, name: str, default: float, most: float) -> float:
    try:
        return max(0.0, min(float(query.get(name, default)), most))
    except (TypeError, ValueError):
        return default


def token_ok(token: str) -> bool:
    """The deployment's token (WAKE_PATH), compared in constant time."""
    try:
        with open(WAKE_PATH) as f:
            want = f.read().strip()
    except OSError:
        return False
    return bool(want) and hmac.compare_digest(token.encode(), want.encode())


def read(path: str, token: str, query: dict) -> tuple[int, dict]:
    """A console's read (`/journal`, `/log`): (HTTP status, JSON document)."""
    if not token_ok(token):
        return 401, {"error": "missing or wrong token"}
    if path == "/journal":
        limit = int(_number(query, "limit", 500, MAX_LINES))
        since = _number(query, "since", 0.0, float("inf"))
        got = entries(tail(JOURNAL_PATH, MAX_LINES * 2), since, limit)
        return 200, {"entries": masked_entries(got)}
    if path == "/log":
        lines = int(_number(query, "lines", 200, MAX_LINES))
        return 200, {"lines": masked(tail(SERVE_LOG, lines), secrets_known())}
    return 404, {"error": "not found"}


def masked_entries(got: list[dict]) -> list[dict]:
    """Journal entries with the secrets masked (an engine's first failure quotes its log)."""
    known = secrets_known()
    return [json.loads(masked([json.dumps(e)], known)[0]) for e in got]
