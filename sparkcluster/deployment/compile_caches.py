"""The compile caches on the nodes (config/compile_cache says what a key is): made ready before a
container is created, listed for `status` and `weights status`, removed by `down --purge-caches`.

Everything here runs over SSH as the SSH user, with the hosts' python3 (as the weights stage's
programs do: movement/hfcache_node), so every folder sparkcluster makes is that user's. Docker
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

PROGRAM = r"""
import fcntl, json, os, re, shutil, sys, time
KEY = re.compile(r"^[0-9a-f]{@KEY_LEN@}$")
STAMP, ABOUT, IN_USE = @STAMP@, @ABOUT@, @IN_USE@
SUBS = @SUBS@
op, root = sys.argv[1], sys.argv[2]

def size(p):
    n = 0
    for d, dirs, files in os.walk(p):
        for f in files:
            try:
                n += os.lstat(os.path.join(d, f)).st_size
            except OSError:
                pass
    return n

def keys():
    out = []
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return out
    for k in names:
        p = os.path.join(root, k)
        if not KEY.match(k) or not os.path.isdir(p):
            continue
        try:
            used = os.stat(os.path.join(p, STAMP)).st_mtime
        except OSError:
            used = os.stat(p).st_mtime
        about = {}
        try:
            with open(os.path.join(p, ABOUT)) as f:
                about = json.load(f)
        except (OSError, ValueError):
            pass
        out.append({"key": k, "bytes": size(p), "last_start": used, "about": about})
    return out

def busy(k):
    try:
        f = open(os.path.join(root, k, IN_USE))
    except OSError:
        return False
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        f.close()

def remove(k):
    if busy(k):
        return ["%s: in use by a running container (kept)" % k]
    errors = []
    shutil.rmtree(os.path.join(root, k), onerror=lambda fn, p, e: errors.append("%s: %s" % (p, e[1])))
    return errors[:3]

if op == "list":
    got = keys()
    print(json.dumps({"root": root, "keys": got, "bytes": sum(k["bytes"] for k in got)}))
elif op == "prepare":
    key, cap, about = sys.argv[3], int(sys.argv[4]), json.loads(sys.argv[5])
    assert KEY.match(key)
    here = os.path.join(root, key)
    for sub in SUBS:
        os.makedirs(os.path.join(here, sub), exist_ok=True)
    with open(os.path.join(here, ABOUT), "w") as f:
        json.dump(about, f, sort_keys=True)
    with open(os.path.join(here, STAMP), "w") as f:
        f.write("%d\n" % time.time())
    got = keys()
    total = sum(k["bytes"] for k in got)
    evicted, errors = [], []
    for k in sorted((k for k in got if k["key"] != key), key=lambda k: k["last_start"]):
        if total <= cap:
            break
        errs = remove(k["key"])
        errors += errs
        if not errs:
            evicted.append({"key": k["key"], "bytes": k["bytes"]})
            total -= k["bytes"]
    print(json.dumps({"key": key, "evicted": evicted, "bytes": total, "errors": errors}))
elif op == "purge":
    removed, errors = [], []
    for k in keys():
        errs = remove(k["key"])
        errors += errs
        if not errs:
            removed.append({"key": k["key"], "bytes": k["bytes"]})
    print(json.dumps({"removed": removed, "errors": errors}))
"""
for _name, _value in {
    "@KEY_LEN@": str(compile_cache.KEY_LEN),
    "@STAMP@": repr(compile_cache.STAMP),
    "@ABOUT@": repr(compile_cache.ABOUT),
    "@IN_USE@": repr(compile_cache.IN_USE),
    "@SUBS@": repr(compile_cache.subfolders()),
}.items():
    PROGRAM = PROGRAM.replace(_name, _value)


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
    return py(PROGRAM, "list", root)


def prepare_command(root: str, key: str, cap_bytes: int, about: dict) -> str:
    compile_cache.key_dir(root, key)  # a key, never a path
    return "umask 022; " + py(PROGRAM, "prepare", root, key, str(int(cap_bytes)), json.dumps(about, sort_keys=True))


def purge_command(root: str) -> str:
    return py(PROGRAM, "purge", root)


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
