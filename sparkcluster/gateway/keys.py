"""Who a request's key belongs to: the keys of `GATEWAY_API_KEYS` (unnamed, named `env:1`, `env:2`
in the usage ledger and the journal: the controller's own, which can do everything but the
gateway's actions) and the named keys of the key file (`sparkcluster gateway keys add`), each with
its limits and whether it is an admin's.

The key file (KEYS_FILE, in the gateway's folder on its node, 0600, written by the controller over
SSH, aside and renamed into place) holds no key: only each key's SHA-256. A key is 32 random bytes
(256 bits: `secrets.token_urlsafe`), so a plain hash is as good as a slow one; nothing in the file
lets anyone present a key. The gateway reads the file again when it changes (its inode, time or size)
(`Keyring.reload_if_changed`, once a poll): a key added, changed, rotated or revoked takes effect
within one poll, without a restart, and a stream already under way is never cut.

A presented key is hashed once and compared with every key known, in constant time and with no
early exit, as gateway/auth compares the configured keys. Standard library only (shipped into the
gateway's container).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import time
from dataclasses import dataclass, field

KEYS_FILE = "keys.json"
PREFIX = "sk-spark-"  # so a leaked key is recognisable as one of these (secret scanners match prefixes)
NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.@")


def new_key() -> str:
    return PREFIX + secrets.token_urlsafe(32)


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def valid_name(name: str) -> bool:
    return 0 < len(name) <= 64 and set(name) <= NAME_CHARS and not name.startswith("env:")


@dataclass(frozen=True)
class Identity:
    """The owner of a request's key: its name and what it may do (0 or empty: no limit)."""

    name: str
    admin: bool = False
    env: bool = False  # one of GATEWAY_API_KEYS
    models: tuple[str, ...] = ()
    requests_per_minute: int = 0
    tokens_per_day: int = 0
    max_concurrent: int = 0

    def may_use(self, model: str) -> bool:
        return not self.models or model in self.models

    @property
    def operator(self) -> bool:
        """May read the gateway's own pages (`/metrics`, `/gateway/status`): the controller's keys and admins."""
        return self.env or self.admin


@dataclass
class Entry:
    """A named key as the key file holds it."""

    name: str
    sha256: str
    created: float = 0.0
    admin: bool = False
    models: list[str] = field(default_factory=list)
    requests_per_minute: int = 0
    tokens_per_day: int = 0
    max_concurrent: int = 0
    expires: float = 0.0  # epoch seconds; 0: never
    previous: list[dict] = field(default_factory=list)  # rotated out: {"sha256", "until"} (a grace)

    @classmethod
    def of(cls, d: dict) -> Entry:
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        return cls(**known)

    def identity(self) -> Identity:
        return Identity(
            self.name,
            admin=self.admin,
            models=tuple(self.models),
            requests_per_minute=self.requests_per_minute,
            tokens_per_day=self.tokens_per_day,
            max_concurrent=self.max_concurrent,
        )

    def public(self, now: float) -> dict:
        """What `keys list` shows: everything but the hashes."""
        d = {k: v for k, v in self.__dict__.items() if k not in ("sha256", "previous")}
        d["rotated_valid_until"] = max((p.get("until", 0) for p in self.previous if p.get("until", 0) > now), default=0)
        return d


# -- the key file's text, edited by the controller (pure)
def parse(text: str | None) -> list[Entry]:
    if not text or not text.strip():
        return []
    doc = json.loads(text)
    return [Entry.of(d) for d in doc.get("keys", []) if isinstance(d, dict) and d.get("name") and d.get("sha256")]


def render(entries: list[Entry]) -> str:
    return json.dumps({"version": 1, "keys": [e.__dict__ for e in entries]}, indent=1, sort_keys=True) + "\n"


def find(entries: list[Entry], name: str) -> Entry | None:
    return next((e for e in entries if e.name == name), None)


def rotate(entry: Entry, key: str, grace_s: float, now: float) -> None:
    """`entry` takes `key`; its old key stays valid for `grace_s` (0: not at all)."""
    kept = [p for p in entry.previous if p.get("until", 0) > now]
    if grace_s > 0:
        kept.append({"sha256": entry.sha256, "until": now + grace_s})
    entry.sha256, entry.previous = digest(key), kept


class Keyring:
    """The gateway's side: the configured keys and the key file's, and who a presented key is."""

    def __init__(self, env_keys: list[str], path: str | None = None):
        self.env = [(k.encode(), Identity(f"env:{i}", env=True)) for i, k in enumerate(env_keys, 1)]
        self.path = path
        self.named: list[tuple[bytes, float, float, Identity]] = []  # (sha256, valid until, expires, who)
        self._mtime: tuple | None = None
        self.reload_if_changed()

    def set_env(self, env_keys: list[str]) -> None:
        self.env = [(k.encode(), Identity(f"env:{i}", env=True)) for i, k in enumerate(env_keys, 1)]

    def names(self) -> list[str]:
        return [who.name for _, who in self.env] + list(dict.fromkeys(who.name for *_, who in self.named))

    def reload_if_changed(self) -> bool:
        """Read the key file again when it changed (True then); one caught unreadable keeps the keys
        read before (the controller renames a whole file into place: the next look has it)."""
        if not self.path:
            return False
        try:  # a file renamed into place is a new inode: seen even where two writes share a timestamp
            st = os.stat(self.path)
            seen = (st.st_ino, st.st_mtime_ns, st.st_size)
        except OSError:
            seen = None
        if seen == self._mtime:
            return False
        try:
            if seen is None:
                entries = []
            else:
                with open(self.path) as f:
                    entries = parse(f.read())
        except (OSError, ValueError, TypeError):
            return False
        self._mtime = seen
        named = []
        for e in entries:
            who = e.identity()
            named.append((e.sha256.encode(), float("inf"), e.expires, who))
            named += [(p["sha256"].encode(), float(p.get("until", 0)), e.expires, who) for p in e.previous]
        self.named = named
        return True

    def holder(self, hashed: str, now: float | None = None) -> Identity | None:
        """Whose key has the SHA-256 `hashed` now (None: none, or expired): the console's session keeps
        the hash, never the key, and asks at every request, so a revoked or rotated key ends it and a
        key's rights are read as they are now. Every key is compared, whatever matched."""
        now = time.time() if now is None else now
        probe = hashed.encode()
        found = None
        for k, who in self.env:
            if hmac.compare_digest(probe, digest(k.decode()).encode()) and found is None:
                found = who
        for h, until, expires, who in self.named:
            if hmac.compare_digest(probe, h) and found is None and until > now and not (expires and expires <= now):
                found = who
        return found

    def identify(self, given: str | None, now: float | None = None) -> Identity | None:
        """Whose key `given` is (None: nobody's, or expired). Every key is compared, whatever matched."""
        if given is None:
            return None
        now = time.time() if now is None else now
        probe, hashed = given.encode(), digest(given).encode()
        found = None
        for k, who in self.env:
            if hmac.compare_digest(probe, k) and found is None:
                found = who
        for h, until, expires, who in self.named:
            if hmac.compare_digest(hashed, h) and found is None and until > now and not (expires and expires <= now):
                found = who
        return found
