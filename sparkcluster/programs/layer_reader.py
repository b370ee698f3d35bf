"""Runs in a throwaway container of the cluster image (movement/layerstore says why and how): the
layers a worker lacks, rebuilt from the head's own layer store as `docker load` takes them, written
to stdout. argv: the docker root as mounted, the image ID (hex), the tag to give it, then "=<hex>"
the image's diff IDs bottom up and "-<hex>" those every receiving worker holds (left out).

Each layer's tar is rebuilt from its `tar-split.json.gz` (every header and padding as registered,
type 2 entries; each file's name and size, type 1) and the files under the overlay2 driver's
`diff` directory, as the engine does for `docker save` (moby layer/layer_store.go assembleTarTo,
vbatts/tar-split tar/asm); its sha256 is checked against the diff ID as it streams.
"""

import base64
import gzip
import hashlib
import json
import os
import sys
import tarfile


def fail(why):
    print("layer store: " + why, file=sys.stderr, flush=True)
    sys.exit(3)


def entry(sink, name, size, chunks):
    ti = tarfile.TarInfo(name)
    ti.size, ti.mode, ti.mtime = size, 0o644, 0
    sink.write(ti.tobuf(tarfile.USTAR_FORMAT))
    n = 0
    for c in chunks:
        sink.write(c)
        n += len(c)
    if n != size:
        fail(f"{name} came to {n} bytes, its tar-split says {size}")
    sink.write(b"\0" * (-size % 512))


def records(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def layer(root, d, chain):
    """The size of layer `d`'s tar (chain ID `chain`) and its bytes, checked against `d` as they go."""
    ldir = root + "/image/overlay2/layerdb/sha256/" + chain
    try:
        with open(ldir + "/cache-id") as f:
            files = os.path.join(root, "overlay2", f.read().strip(), "diff").encode()
        size = sum(
            len(base64.b64decode(e.get("payload") or "")) if e["type"] == 2 else e.get("size") or 0
            for e in records(ldir + "/tar-split.json.gz")
        )
    except (OSError, ValueError, KeyError) as e:
        fail(f"layer {d[:12]} (chain {chain[:12]}): {e}")
    if not os.path.isdir(files):
        fail(f"layer {d[:12]}: no {files.decode()} (not the overlay2 driver?)")

    def chunks():
        h = hashlib.sha256()
        for e in records(ldir + "/tar-split.json.gz"):
            if e["type"] == 2:
                b = base64.b64decode(e.get("payload") or "")
                h.update(b)
                yield b
            elif e.get("size"):
                name = base64.b64decode(e["name_raw"]) if e.get("name_raw") else e["name"].encode("utf-8")
                left = e["size"]
                with open(os.path.join(files, name.lstrip(b"/")), "rb") as f:
                    while left:
                        b = f.read(min(left, 1 << 20))
                        if not b:
                            what = name.decode("utf-8", "replace")
                            fail(f"layer {d[:12]}: {what} is shorter than its tar entry")
                        left -= len(b)
                        h.update(b)
                        yield b
        if h.hexdigest() != d:
            fail(f"layer {d} rebuilt to sha256:{h.hexdigest()}")

    return size, chunks()


def run(args, sink):
    """The archive for `args` (this program's argv[1:]) written to `sink` (write, flush)."""
    root, image_id, ref = args[0], args[1], args[2]
    order = [a[1:] for a in args[3:] if a[0] == "="]
    skip = {a[1:] for a in args[3:] if a[0] == "-"}
    try:
        with open(root + "/image/overlay2/imagedb/content/sha256/" + image_id, "rb") as f:
            config = f.read()
    except OSError as e:
        fail(f"the image config: {e} (not the classic image store?)")
    if hashlib.sha256(config).hexdigest() != image_id:
        fail("the image config does not hash to the image ID")
    entry(sink, image_id + ".json", len(config), [config])
    chain, done = None, set()
    for d in order:
        chain = d if chain is None else hashlib.sha256(f"sha256:{chain} sha256:{d}".encode()).hexdigest()
        if d in skip or d in done:
            continue
        done.add(d)
        size, chunks = layer(root, d, chain)
        entry(sink, d + "/layer.tar", size, chunks)
    manifest = json.dumps(
        [{"Config": image_id + ".json", "RepoTags": [ref], "Layers": [d + "/layer.tar" for d in order]}]
    )
    entry(sink, "manifest.json", len(manifest), [manifest.encode()])
    sink.write(b"\0" * 1024)
    sink.flush()


if __name__ == "__main__":
    run(sys.argv[1:], sys.stdout.buffer)
