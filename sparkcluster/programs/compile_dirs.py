"""The compile caches on one node (deployment/compile_caches says what they are for), run over SSH
as the SSH user with the host's python3, so every folder it makes is that user's. argv: the layout
(JSON: `key_len`, the name of the `stamp`, `about` and `in_use` files in a key's folder, the `subs`
folders made in a key's folder before a start: config/compile_cache's), an operation and the caches'
root, then the operation's own. `list` says every key with its bytes, last start and about; `prepare`
(key, cap in bytes, about as JSON) makes the key's folders, stamps it and removes the other keys
oldest start first while the total is over the cap; `purge` removes every key. A key whose `in_use`
file a running container's agent holds locked (a shared flock) is never removed: it is kept and said
so. Each prints one JSON object.
"""

import fcntl
import json
import os
import re
import shutil
import sys
import time


class Layout:
    def __init__(self, doc):
        self.key = re.compile("^[0-9a-f]{" + str(int(doc["key_len"])) + "}$")
        self.stamp, self.about, self.subs = doc["stamp"], doc["about"], doc["subs"]
        self.in_use = doc["in_use"]


def size(p):
    n = 0
    for d, _dirs, files in os.walk(p):
        for f in files:
            try:
                n += os.lstat(os.path.join(d, f)).st_size
            except OSError:
                pass
    return n


def keys(lay, root):
    out = []
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return out
    for k in names:
        p = os.path.join(root, k)
        if not lay.key.match(k) or not os.path.isdir(p):
            continue
        try:
            used = os.stat(os.path.join(p, lay.stamp)).st_mtime
        except OSError:
            used = os.stat(p).st_mtime
        about = {}
        try:
            with open(os.path.join(p, lay.about)) as f:
                about = json.load(f)
        except (OSError, ValueError):
            pass
        out.append({"key": k, "bytes": size(p), "last_start": used, "about": about})
    return out


def busy(lay, root, k):
    """Whether an agent holds the key's in-use file locked (it does while its container runs)."""
    try:
        f = open(os.path.join(root, k, lay.in_use))
    except OSError:
        return False
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        f.close()


def remove(lay, root, k):
    if busy(lay, root, k):
        return [f"{k}: in use by a running container (kept)"]
    errors = []
    shutil.rmtree(os.path.join(root, k), onerror=lambda fn, p, e: errors.append(f"{p}: {e[1]}"))
    return errors[:3]


def prepare(lay, root, key, cap, about):
    assert lay.key.match(key)
    here = os.path.join(root, key)
    for sub in lay.subs:
        os.makedirs(os.path.join(here, sub), exist_ok=True)
    with open(os.path.join(here, lay.about), "w") as f:
        json.dump(about, f, sort_keys=True)
    with open(os.path.join(here, lay.stamp), "w") as f:
        f.write(f"{int(time.time())}\n")
    got = keys(lay, root)
    total = sum(k["bytes"] for k in got)
    evicted, errors = [], []
    for k in sorted((k for k in got if k["key"] != key), key=lambda k: k["last_start"]):
        if total <= cap:
            break
        errs = remove(lay, root, k["key"])
        errors += errs
        if not errs:
            evicted.append({"key": k["key"], "bytes": k["bytes"]})
            total -= k["bytes"]
    return {"key": key, "evicted": evicted, "bytes": total, "errors": errors}


def purge(lay, root):
    removed, errors = [], []
    for k in keys(lay, root):
        errs = remove(lay, root, k["key"])
        errors += errs
        if not errs:
            removed.append({"key": k["key"], "bytes": k["bytes"]})
    return {"removed": removed, "errors": errors}


def main(argv):
    lay, op, root = Layout(json.loads(argv[1])), argv[2], argv[3]
    if op == "list":
        got = keys(lay, root)
        print(json.dumps({"root": root, "keys": got, "bytes": sum(k["bytes"] for k in got)}))
    elif op == "prepare":
        print(json.dumps(prepare(lay, root, argv[4], int(argv[5]), json.loads(argv[6]))))
    elif op == "purge":
        print(json.dumps(purge(lay, root)))


if __name__ == "__main__":
    main(sys.argv)
