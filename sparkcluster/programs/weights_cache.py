"""One node's HF cache, as the weights stage sees it. argv: an operation and the hub folder
(HF_HOME/hub), then the operation's own.

`check` (a manifest on stdin) adopts the files a replication left in the incoming folder once they
match their names (a blob is named by its sha256, or git sha1 for small files), hashes every file
it has not verified before, removes what does not match, links the snapshot and the ref like
huggingface_hub does, and says what is missing and how much room there is; `status` lists the
cached snapshots; `cached` (folder, revision) gives the listing of a snapshot once verified
complete (for a run without the hub); `rm` (folder, commit) removes one snapshot and the blobs only
it used. Each prints one JSON value.
"""

import hashlib
import json
import os
import shutil
import sys

from sparkcluster.programs.weights_receive import RECEIVED


def digest(path, name):
    h = hashlib.sha256() if len(name) == 64 else hashlib.sha1(b"blob %d\0" % os.path.getsize(path))
    with open(path, "rb") as f:
        while True:
            b = f.read(1 << 22)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def save(path, data):
    with open(path + ".part", "w") as f:
        json.dump(data, f)
    os.replace(path + ".part", path)


def free_bytes(path):
    while not os.path.isdir(path):
        path = os.path.dirname(path) or "/"
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize, path


def check(hub, m):
    repo = os.path.join(hub, m["folder"])
    blobs, inc = os.path.join(repo, "blobs"), os.path.join(repo, ".sparkcluster-incoming")
    stamp_path = os.path.join(repo, ".sparkcluster-verified.json")
    # rehash: trust no stamp (a change that kept size and mtime is found only this way)
    stamps = {} if m.get("rehash") else load(stamp_path)
    want = {f["blob"]: f["size"] for f in m["files"]}
    corrupt, adopted = [], 0
    os.makedirs(blobs, exist_ok=True)
    # what a replication delivered: kept only when it matches its name, then moved into place; a
    # file hashed while it was received (EXTRACT's record, the same size and mtime) is not read again
    if os.path.isdir(inc):
        hashed = {}
        try:
            with open(os.path.join(inc, RECEIVED)) as f:
                for line in f:
                    try:
                        name, size, mtime, sha = json.loads(line)
                        hashed[name] = [size, mtime, sha]
                    except ValueError:
                        pass  # a line cut by the stream's end
        except OSError:
            pass
        for name in os.listdir(inc):
            p = os.path.join(inc, name)
            st = os.stat(p)
            whole = name in want and st.st_size == want[name]
            if whole and (hashed.get(name) == [st.st_size, st.st_mtime_ns, name] or digest(p, name) == name):
                os.replace(p, os.path.join(blobs, name))
                st = os.stat(os.path.join(blobs, name))
                stamps[name] = [st.st_size, st.st_mtime_ns]
                adopted += 1
            else:
                os.remove(p)
        shutil.rmtree(inc, ignore_errors=True)
    missing, present, partial = [], 0, 0
    for name, size in sorted(want.items()):
        p = os.path.join(blobs, name)
        if os.path.exists(p + ".incomplete"):
            partial += os.path.getsize(p + ".incomplete")
        if not os.path.isfile(p):
            missing.append(name)
            continue
        st = os.stat(p)
        if st.st_size == size and stamps.get(name) == [st.st_size, st.st_mtime_ns]:
            present += size
            continue
        # never verified here, or changed since: hash it (the name is the hash)
        if st.st_size == size and (m.get("hash", True) and digest(p, name) == name):
            stamps[name] = [st.st_size, st.st_mtime_ns]
            present += size
        elif st.st_size == size and not m.get("hash", True):
            missing.append(name)  # unverified: the caller hashes or replaces it
        else:
            corrupt.append(name)
            os.remove(p)
            stamps.pop(name, None)
            missing.append(name)
    if stamps or os.path.exists(stamp_path):
        save(stamp_path, stamps)
    if not missing:
        snap = os.path.join(repo, "snapshots", m["commit"])
        for f in m["files"]:
            link = os.path.join(snap, f["path"])
            os.makedirs(os.path.dirname(link), exist_ok=True)
            target = os.path.relpath(os.path.join(blobs, f["blob"]), os.path.dirname(link))
            if os.path.islink(link) and os.readlink(link) == target:
                continue
            if os.path.lexists(link):
                os.remove(link)
            os.symlink(target, link)
        # the listing, kept so a later run can go on without the hub (`cached`)
        os.makedirs(os.path.join(repo, ".sparkcluster-manifests"), exist_ok=True)
        save(os.path.join(repo, ".sparkcluster-manifests", m["commit"] + ".json"), m)
        if m.get("ref"):
            os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
            ref = os.path.join(repo, "refs", m["ref"])
            os.makedirs(os.path.dirname(ref), exist_ok=True)
            with open(ref, "w") as f:
                f.write(m["commit"])
    free, where = free_bytes(repo)
    return {
        "missing": missing,
        "missing_bytes": sum(want[n] for n in missing),
        "present_bytes": present,
        "partial_bytes": partial,
        "corrupt": corrupt,
        "adopted": adopted,
        "free": free,
        "free_path": where,
    }


def status(hub):
    out = []
    if not os.path.isdir(hub):
        return out
    for folder in sorted(os.listdir(hub)):
        if not folder.startswith("models--"):
            continue
        repo = os.path.join(hub, folder)
        stamps = load(os.path.join(repo, ".sparkcluster-verified.json"))
        refs = {}
        for root, _, names in os.walk(os.path.join(repo, "refs")):
            for n in names:
                with open(os.path.join(root, n)) as f:
                    refs.setdefault(f.read().strip(), []).append(
                        os.path.relpath(os.path.join(root, n), os.path.join(repo, "refs"))
                    )
        partial = (
            [n for n in os.listdir(os.path.join(repo, "blobs"))] if os.path.isdir(os.path.join(repo, "blobs")) else []
        )
        partial = sum(os.path.getsize(os.path.join(repo, "blobs", n)) for n in partial if n.endswith(".incomplete"))
        snaps = os.path.join(repo, "snapshots")
        for commit in sorted(os.listdir(snaps)) if os.path.isdir(snaps) else []:
            size, files, broken, verified = 0, 0, 0, True
            for root, _, names in os.walk(os.path.join(snaps, commit)):
                for n in names:
                    p = os.path.join(root, n)
                    files += 1
                    if not os.path.exists(p):
                        broken += 1
                        continue
                    size += os.path.getsize(p)
                    real = os.path.realpath(p)
                    st = os.stat(real)
                    if stamps.get(os.path.basename(real)) != [st.st_size, st.st_mtime_ns]:
                        verified = False
            out.append(
                {
                    "repo": folder[len("models--") :].replace("--", "/", 1),
                    "commit": commit,
                    "refs": refs.get(commit, []),
                    "files": files,
                    "size": size,
                    "broken": broken,
                    "verified": verified and not broken,
                    "partial_bytes": partial,
                }
            )
    return out


def cached(hub, folder, rev):
    repo = os.path.join(hub, folder)
    commit = rev
    try:
        with open(os.path.join(repo, "refs", rev)) as f:
            commit = f.read().strip()
    except OSError:
        pass
    return load(os.path.join(repo, ".sparkcluster-manifests", commit + ".json")) if commit.isalnum() else {}


def rm(hub, folder, commit):
    repo = os.path.join(hub, folder)
    snaps = os.path.join(repo, "snapshots")
    used = {}
    for c in os.listdir(snaps) if os.path.isdir(snaps) else []:
        for root, _, names in os.walk(os.path.join(snaps, c)):
            for n in names:
                used.setdefault(os.path.basename(os.path.realpath(os.path.join(root, n))), set()).add(c)
    freed = 0
    for blob, commits in used.items():
        p = os.path.join(repo, "blobs", blob)
        if commits == {commit} and os.path.isfile(p):
            freed += os.path.getsize(p)
            os.remove(p)
    shutil.rmtree(os.path.join(snaps, commit), ignore_errors=True)
    for root, _, names in os.walk(os.path.join(repo, "refs")):
        for n in names:
            with open(os.path.join(root, n)) as f:
                if f.read().strip() == commit:
                    os.remove(os.path.join(root, n))
    if not os.listdir(snaps) if os.path.isdir(snaps) else True:
        shutil.rmtree(repo, ignore_errors=True)  # nothing else cached for this repo
    return {"freed": freed}


def main(argv):
    cmd, hub = argv[1], argv[2]
    if cmd == "check":
        print(json.dumps(check(hub, json.load(sys.stdin))))
    elif cmd == "status":
        print(json.dumps(status(hub)))
    elif cmd == "cached":
        print(json.dumps(cached(hub, argv[3], argv[4])))
    elif cmd == "rm":
        print(json.dumps(rm(hub, argv[3], argv[4])))


if __name__ == "__main__":
    main(sys.argv)
