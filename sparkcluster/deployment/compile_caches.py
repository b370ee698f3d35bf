"""The compile caches on the nodes (config/compile_cache says what a key is): made ready before a
container is created, listed for `status` and `weights status`, removed by `down --purge-caches`.

Everything here runs over SSH as the SSH user, with the hosts' python3 (as the weights stage's
programs do: sparkcluster/programs, here compile_dirs), so every folder sparkcluster makes is that user's. Docker
would make a missing bind source as root; `prepare` makes the key's folder and each tool's folder
first. What the engine then writes inside (root in the container) the node agent hands back to the
user's uid:gid once the engine serves (node/compile_reading), so the user can list, evict and purge
without sudo.

`prepare` also keeps the cap: it stamps the key being started, then removes the other keys oldest
start first while the total is over the cap. The key being started is never removed, even alone
over the cap: a cache too big to keep is still cheaper than compiling every start. Nor is a key
a running container uses (its node agent holds a shared lock on the key's IN_USE file): eviction and
purge skip it and say so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from sparkcluster.config import compile_cache
from sparkcluster.movement.hfcache import parse_json, py

PROGRAM = "sparkcluster.programs.compile_dirs"


def _layout() -> str:
    """What the program needs to know of a key's folder (config/compile_cache's), as its first argument."""
    doc = {
        "key_len": compile_cache.KEY_LEN,
        "stamp": compile_cache.STAMP,
        "about": compile_cache.ABOUT,
        "in_use": compile_cache.IN_USE,
        "subs": compile_cache.subfolders(),
    }
    return json.dumps(doc, sort_keys=True)


@dataclass(frozen=True)
class CacheKey:
    key: str
    bytes: int
    last_start: float
    about: dict = field(default_factory=dict)


@dataclass(frozen=True)
class NodeCaches:
    root: str
    keys: list[CacheKey]

    @property
    def bytes(self) -> int:
        return sum(k.bytes for k in self.keys)


def list_command(root: str) -> str:
    return py(PROGRAM, _layout(), "list", root)


def prepare_command(root: str, key: str, cap_bytes: int, about: dict) -> str:
    compile_cache.key_dir(root, key)  # a key, never a path
    return "umask 022; " + py(
        PROGRAM, _layout(), "prepare", root, key, str(int(cap_bytes)), json.dumps(about, sort_keys=True)
    )


def purge_command(root: str) -> str:
    return py(PROGRAM, _layout(), "purge", root)


def parse_list(out: str) -> NodeCaches:
    doc = parse_json(out)
    return NodeCaches(
        doc["root"],
        [CacheKey(k["key"], int(k["bytes"]), float(k["last_start"]), k.get("about") or {}) for k in doc["keys"]],
    )


def parse_result(out: str) -> dict:
    """`prepare`'s or `purge`'s answer: what was evicted or removed, and what could not be."""
    return parse_json(out)


def describe(c: CacheKey) -> str:
    """One line for a person: key, size, what it was compiled for."""
    a = c.about
    what = f"{a.get('model', '?')} on {a.get('image', '?')}" if a else "(no key.json)"
    return f"{c.key}  {c.bytes / 2**30:.2f} GiB  {what}"
