"""The layers a worker lacks, read from the head's own layer store: only what moves is read.

`docker save` copies the whole image into a temporary directory before it streams a byte (moby
image/tarexport/save.go), so sending one 274 MB layer of a 20-25 GB image read the whole image on
the head (issue 40). The engine API has no call that reads one layer; `docker push` reads only the
layers a registry lacks but gzips each, and a worker's `docker pull` on the classic store skips a
layer only when it already knows that layer's compressed digest (perf/README.md, "How image layers
move"). So the head's layers are read where the engine keeps them, the way the engine itself
rebuilds a layer's tar for `docker save`: the classic store keeps, per layer (its chain ID),
`tar-split.json.gz` (every tar header and padding of the layer as it was registered, in order, and
each file's name and size) and the files themselves under the graph driver's directory
(`overlay2/<cache-id>/diff`). Headers and file bytes, interleaved, give back the layer's tar byte for
byte, so its sha256 is its diff ID (checked here as it streams, and again by `docker load`).

The docker root is readable by root only, and sparkcluster runs as the owner's account (a member of
`docker`, no sudo): the reader runs in a throwaway container of the cluster image (it has python3),
with the docker root mounted read-only and no log driver. It sends the archive itself to the
worker's receiver (the host's network, the framing of movement/transfer), or writes it to stdout
(`read_command`: no network). The archive is what `docker load` takes: the config, the tars of the
layers the workers lack and a manifest naming every layer; `docker load` looks the others up by
chain ID and finds them (the same rule the docker save path relies on, movement/layers). Anything
it cannot find or rebuild (another graph driver, the containerd image store, a layer removed
meanwhile) ends it with a line on stderr, and the image stage sends by `docker save` instead.
"""

from __future__ import annotations

import shlex

from sparkcluster.movement import transfer

# The reader's body, after a head that sets `args` and `sink` (what the archive is written to). args:
# the docker root as mounted, the image ID (hex), the tag to give it, then "=<hex>" the image's diff
# IDs bottom up and "-<hex>" those every receiving worker holds (left out)
_BODY = r"""
import base64, gzip, hashlib, json, os, sys, tarfile
root, image_id, ref = args[0], args[1], args[2]
order = [a[1:] for a in args[3:] if a[0] == "="]
skip = {a[1:] for a in args[3:] if a[0] == "-"}
meta = root + "/image/overlay2"
def fail(why):
    print("layer store: " + why, file=sys.stderr, flush=True)
    sys.exit(3)
def entry(name, size, chunks):
    ti = tarfile.TarInfo(name)
    ti.size, ti.mode, ti.mtime = size, 0o644, 0
    sink.write(ti.tobuf(tarfile.USTAR_FORMAT))
    n = 0
    for c in chunks:
        sink.write(c)
        n += len(c)
    if n != size:
        fail("%s came to %d bytes, its tar-split says %d" % (name, n, size))
    sink.write(b"\0" * (-size % 512))
def records(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)
def layer(d, chain):
    ldir = meta + "/layerdb/sha256/" + chain
    try:
        with open(ldir + "/cache-id") as f:
            files = os.path.join(root, "overlay2", f.read().strip(), "diff").encode()
        size = sum(len(base64.b64decode(e.get("payload") or "")) if e["type"] == 2 else e.get("size") or 0
                   for e in records(ldir + "/tar-split.json.gz"))
    except (OSError, ValueError, KeyError) as e:
        fail("layer %s (chain %s): %s" % (d[:12], chain[:12], e))
    if not os.path.isdir(files):
        fail("layer %s: no %s (not the overlay2 driver?)" % (d[:12], files.decode()))
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
                            fail("layer %s: %s is shorter than its tar entry" % (d[:12], what))
                        left -= len(b)
                        h.update(b)
                        yield b
        if h.hexdigest() != d:
            fail("layer %s rebuilt to sha256:%s" % (d, h.hexdigest()))
    return size, chunks()
try:
    with open(meta + "/imagedb/content/sha256/" + image_id, "rb") as f:
        config = f.read()
except OSError as e:
    fail("the image config: %s (not the classic image store?)" % e)
if hashlib.sha256(config).hexdigest() != image_id:
    fail("the image config does not hash to the image ID")
entry(image_id + ".json", len(config), [config])
chain, done = None, set()
for d in order:
    chain = d if chain is None else hashlib.sha256(("sha256:%s sha256:%s" % (chain, d)).encode()).hexdigest()
    if d in skip or d in done:
        continue
    done.add(d)
    size, chunks = layer(d, chain)
    entry(d + "/layer.tar", size, chunks)
manifest = json.dumps([{"Config": image_id + ".json", "RepoTags": [ref], "Layers": [d + "/layer.tar" for d in order]}])
entry("manifest.json", len(manifest), [manifest.encode()])
sink.write(b"\0" * 1024)
sink.flush()
"""

# The archive on stdout (argv as _BODY's args): for a file, or a pipe.
READER = "import sys\nargs = sys.argv[1:]\nsink = sys.stdout.buffer\n" + _BODY

# The archive sent by the reader itself to the worker's receiver, framed (transfer.FRAMING: argv[1:4]
# the receiver's address and port, the sender's address; then _BODY's args). Writing to the
# container's stdout put every byte through dockerd's attach copy and a pipe into the framed
# sender: 274 MB took 2.8-3.0 s that way on the testbed's head, 1.3 s sent from the container
# itself, most of it the container's start (issue 40 item 7). Small writes (a tar header per file)
# are gathered into frames of about 1 MiB. A reader that fails exits before the end frame, so the
# receiver sees a cut stream and stops its docker load: nothing half-read is loaded.
SENDING_READER = (
    "\nimport socket, struct, sys, time"
    + transfer.FRAMING
    + r"""
args = [a for a in sys.argv[4:] if not a.startswith("rate=")]
class Frames:
    def __init__(self):
        self.parts, self.n = [], 0
    def write(self, b):
        self.parts.append(b)
        self.n += len(b)
        if self.n >= 1 << 20:
            self.flush()
    def flush(self):
        if self.n:
            out(b"".join(self.parts))
        self.parts, self.n = [], 0
sink = Frames()
"""
    + _BODY
    + "finish()\n"
)

MOUNT = "/sparkcluster-docker-root"  # where the reader's container sees the docker root


def read_command(image: str, image_id: str, root_dir: str, order: tuple[str, ...], skip: tuple[str, ...]) -> str:
    """The reader in a throwaway container of `image` (on the head), writing the archive to stdout."""
    return shlex.join(_container(image, root_dir, "none", READER, _args(image, image_id, root_dir, order, skip)))


def send_command(
    image: str,
    image_id: str,
    root_dir: str,
    order: tuple[str, ...],
    skip: tuple[str, ...],
    dst_ip: str,
    port: int | None,
    src_ip: str,
) -> str:
    """The reader in a throwaway container of `image` (on the head), sending the archive itself to
    the first receiver's port from the head's address: the container has the host's network, and
    no other way out (no log driver, the docker root read-only). `port` None: read from stdin's
    first line (the container starts while the receivers do: stream.run's `port_on_stdin`)."""
    args = [dst_ip, "-" if port is None else str(int(port)), src_ip, *_args(image, image_id, root_dir, order, skip)]
    return shlex.join(_container(image, root_dir, "host", SENDING_READER, args, stdin=port is None))


def _args(image: str, image_id: str, root_dir: str, order: tuple[str, ...], skip: tuple[str, ...]) -> list[str]:
    """The reader's own arguments (_BODY's `args`)."""
    if not root_dir.startswith("/") or any(c in root_dir for c in ",\n"):
        raise ValueError(f"not a docker root: {root_dir!r}")
    hexes = [_hex(d) for d in (image_id, *order, *skip)]
    return [
        MOUNT,
        hexes[0],
        image,
        *("=" + h for h in hexes[1 : 1 + len(order)]),
        *("-" + h for h in hexes[1 + len(order) :]),
    ]


def _container(image: str, root_dir: str, network: str, script: str, argv: list[str], stdin: bool = False) -> list[str]:
    return [
        "docker",
        "run",
        *(["-i"] if stdin else []),
        "--rm",
        "--network",
        network,
        "--log-driver",
        "none",
        "--user",
        "0:0",
        "--mount",  # not -v: a root that is not there fails here rather than being created
        f"type=bind,source={root_dir},target={MOUNT},readonly",
        "--entrypoint",
        "python3",
        image,
        "-c",
        script,
        *argv,
    ]


def _hex(d: str) -> str:
    h = d.removeprefix("sha256:")
    if len(h) != 64 or any(c not in "0123456789abcdef" for c in h):
        raise ValueError(f"not a sha256 digest: {d!r}")
    return h


def describe(image: str, src_node: str, src_ip: str, dst_node: str, dst_ip: str) -> str:
    return (
        f"{src_node}: the layers of {image} that {dst_node} lacks, read from the head's layer store (a throwaway "
        f"container of the image, the docker root read-only), else docker save {image} leaving out the layers "
        f"{dst_node} holds | tcp {src_ip} -> {dst_ip} | {dst_node}: docker load (one connection, head's address "
        "only; image ID verified after)"
    )
