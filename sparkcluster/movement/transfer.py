"""Send the cluster image from the head to a worker over the link between them.

`docker save` on the head streams into a one-shot TCP receiver on the worker that feeds
`docker load`. The bytes never pass through the controller, and no SSH trust between the nodes is
needed or added: the receiver listens on the worker's control-link address only, accepts one
connection from the head's control-link address only, and the image ID compared afterwards
authenticates what arrived (docker load checks every layer against the image config, whose
digest is the ID).
"""

from __future__ import annotations

import shlex

# Both ends are python3, which every DGX OS host has; no netcat flavour to guess at.
#
# The stream is framed (4-byte length, then data; a zero length ends it) so the receiver can tell a
# finished archive from a connection that broke: it then kills docker load instead of closing its
# input, since a tar cut at an entry boundary can read as a short but valid archive.
# The pipe between a stream's end and its producer or sink at 1 MiB (Linux's default limit for any
# user) instead of 64 KiB: docker load of 274 MB took 3.2 s instead of 4.0 (issue 40 item 7). Not a
# pipe, or refused: left as it is. Every sender (FRAMING) and receiver script starts with it.
WIDE_PIPE = r"""
def wide_pipe(f):
    try:
        import fcntl
        fcntl.fcntl(f.fileno(), getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
    except (ImportError, OSError, ValueError):
        pass
"""

RECEIVER = (
    WIDE_PIPE
    + r"""
import socket, struct, subprocess, sys
bind, peer = sys.argv[1], sys.argv[2]
# the sink: docker load (the image), or "stdout" (a byte pipe: the weights' tar of files);
# "next=ADDR,PORT,SRC": a relay, forwarding every frame to the next node's receiver as it arrives
to_stdout = "stdout" in sys.argv[3:]
hop = [a[5:].split(",") for a in sys.argv[3:] if a.startswith("next=")]
s = socket.socket()
s.bind((bind, 0))
s.listen(1)
s.settimeout(60)
nxt, relay_err = None, ""
if hop:
    dst, port, src = hop[0][0], int(hop[0][1]), hop[0][2]
    try:
        nxt = socket.create_connection((dst, port), timeout=30, source_address=(src, 0))
        nxt.settimeout(600)
    except OSError as e:
        print("relay: cannot reach the next hop %s:%d from %s: %s" % (dst, port, src, e), file=sys.stderr, flush=True)
        sys.exit(76)  # transfer.RELAY_FAILED
print("@@port %d" % s.getsockname()[1], file=sys.stderr, flush=True)
while True:
    c, addr = s.accept()
    if addr[0] == peer:
        break
    c.close()
s.close()
c.settimeout(600)
f = c.makefile("rb", buffering=1 << 20)
load = None if to_stdout else subprocess.Popen(["docker", "load"], stdin=subprocess.PIPE)
sink = sys.stdout.buffer if to_stdout else load.stdin
wide_pipe(sink)
sink_err = ""
done = False
try:
    while True:
        h = f.read(4)
        if len(h) < 4:
            break
        n = struct.unpack(">I", h)[0]
        if n == 0:
            done = True
            break
        b = f.read(n)
        if len(b) < n:
            break
        # forwarded first, so the next node receives while this one writes; a next hop that stops
        # taking data ends the relay, never this node's own copy
        if nxt is not None:
            try:
                nxt.sendall(h + b)
            except OSError as e:
                relay_err = "relay: the next hop %s:%d stopped taking data: %s" % (dst, port, e)
                print(relay_err, file=sys.stderr, flush=True)
                nxt.close()
                nxt = None
        if sink is not None:
            try:
                sink.write(b)
            except OSError as e:
                sink_err = "receive: the sink stopped taking data: %s" % e
                print(sink_err, file=sys.stderr, flush=True)
                sink = None
                if nxt is None:
                    break  # nothing left to feed
except (OSError, socket.timeout) as e:
    print("receive: %s" % e, file=sys.stderr)
if not done:
    # closed without the end frame: the next node sees a cut stream and loads nothing either
    if nxt is not None:
        nxt.close()
    if load:
        load.kill()
        load.wait()
        print("receive: the stream ended before the archive did; docker load stopped, nothing loaded", file=sys.stderr)
    else:
        sys.stdout.flush()
        print("receive: the stream ended before the sender finished", file=sys.stderr)
    sys.exit(75)  # transfer.STREAM_CUT
if nxt is not None:
    try:
        nxt.sendall(struct.pack(">I", 0))
        nxt.shutdown(socket.SHUT_WR)
    except OSError as e:
        relay_err = "relay: the next hop %s:%d did not take the end of the stream: %s" % (dst, port, e)
        print(relay_err, file=sys.stderr, flush=True)
        nxt = None
rc = 0
if sink is not None:
    try:
        sink.close()
    except OSError as e:
        sink_err = sink_err or "receive: the sink stopped taking data: %s" % e
if load:
    rc = load.wait()
if sink_err and not rc:
    rc = 1
if nxt is not None:
    try:
        nxt.recv(1)  # the next node closes when it is done (its own load, and its next hop's)
    except OSError:
        pass
if relay_err and not rc:
    print("relay: this node's own copy is complete; the nodes after it did not get theirs", file=sys.stderr, flush=True)
    rc = 76  # transfer.RELAY_FAILED
sys.exit(rc)
"""
)

# What every sender script starts with, after its own imports (socket, struct, sys, time): the one
# connection from the sender's own address to the receiver's announced port (argv[1:4]: the
# receiver's address and port, the sender's address); `out` sends one frame (4-byte length, then
# data) and says "@@sent N" on stderr at most four times a second, for the controller's progress
# bar; `pump` frames a file to its end; `finish` sends the end frame and waits for the receiver to
# close, which it does once its own sink and the next hop's are done. A port "-" is read from the
# first line of stdin: a sender that takes a while to start (a container) starts before the
# receivers have announced theirs (stream.run's `port_on_stdin`). An argument "rate=N" caps the
# stream at N bytes a second (issue 40: a replication must not starve an engine serving on the same
# nodes): after each frame the sender sleeps until the bytes sent fit the cap since the start, so
# the link and the receivers' disks see at most that rate, averaged over a frame (1 MiB).
FRAMING = (
    WIDE_PIPE
    + r"""
dst, port, src = sys.argv[1], sys.argv[2], sys.argv[3]
port = int(sys.stdin.readline() if port == "-" else port)  # "-": on stdin's first line (stream.run)
rate = next((float(a[5:]) for a in sys.argv[4:] if a.startswith("rate=")), 0.0)
s = socket.create_connection((dst, port), timeout=30, source_address=(src, 0))
s.settimeout(600)
inp = sys.stdin.buffer
wide_pipe(inp)  # a producer piped in (docker save, tar) hands over 1 MiB at a time
sent, last, began = 0, 0.0, time.monotonic()
def out(b):
    global sent, last
    if not b:
        return
    s.sendall(struct.pack(">I", len(b)) + b)
    sent += len(b)
    now = time.monotonic()
    if rate > 0 and sent / rate > now - began:
        time.sleep(sent / rate - (now - began))
        now = time.monotonic()
    if now - last > 0.25:
        print("@@sent %d" % sent, file=sys.stderr, flush=True)
        last = now
def pump(f):
    while True:
        b = f.read(1 << 20)
        if not b:
            break
        out(b)
def finish():
    s.sendall(struct.pack(">I", 0))
    s.shutdown(socket.SHUT_WR)
    s.recv(1)
    print("@@sent %d" % sent, file=sys.stderr, flush=True)
"""
)

# A plain byte pipe for files (the weights stage), with the receiver's "stdout" sink: the same
# one-shot connection and framing, so a cut stream ends in STREAM_CUT, never in a short tar.
STREAM_SENDER = "\nimport socket, struct, sys, time" + FRAMING + "pump(inp)\nfinish()\n"

# Reads `docker save` on stdin and sends it framed, leaving out the layer tars whose diff ID the
# worker holds: it holds those chains, and docker load does not open their files. Every layer file
# is judged by its name, without reading it, wherever the name can say which layer it is:
# - `blobs/sha256/<hex>` (the OCI layout of Docker 25 and later): an uncompressed layer's digest is
#   its diff ID;
# - `<v1 id>/layer.tar` (Docker 20.10 to 24): the v1 ID is the digest of the directory's own `json`
#   (which the archive holds just before the tar: `json` sorts before `layer.tar`) with its `id`
#   removed and its layer's chain ID added (moby image/v1/imagev1.go CreateID, called by
#   image/tarexport/save.go saveImage; the bottom layers' json got its `os` after the ID was made,
#   the top layer's before). The sender recomputes that digest for each of the image's chain IDs
#   (argv "=<hex>": its diff IDs in order) and so learns which layer the directory holds.
# A layer file that neither names (a json that matches no chain, a blob named by another digest)
# is hashed while spooled to disk, then sent or dropped: the old way, correct but reading and
# writing the layer once more on the head. Every other entry (manifest.json, the config,
# VERSION/json, index.json) passes through byte for byte.
SENDER = (
    "\nimport hashlib, os, re, socket, struct, sys, tempfile, time, json"
    + FRAMING
    + r"""
# argv[4:]: "-<hex>" a diff ID to leave out, "+<hex>" one of the image's other diff IDs, "=<hex>"
# the image's diff IDs bottom up (with repeats)
skip = {a[1:] for a in sys.argv[4:] if a[0] == "-"}
keep = {a[1:] for a in sys.argv[4:] if a[0] == "+"}
order = [a[1:] for a in sys.argv[4:] if a[0] == "="]
chains = []
for d in order:
    chains.append(hashlib.sha256(("sha256:%s sha256:%s" % (chains[-1], d)).encode()).hexdigest() if chains else d)
dropped, ndrop, hashed, nhash = 0, 0, 0, 0
named = {}  # v1 directory -> the diff ID of the layer it holds
def members(s):
    # a JSON object's members as the raw text of each value, as the engine wrote them
    dec, out, i = json.JSONDecoder(), {}, s.index("{") + 1
    while True:
        while s[i] in " \t\r\n,":
            i += 1
        if s[i] == "}":
            return out
        k, i = dec.raw_decode(s, i)
        while s[i] in " \t\r\n:":
            i += 1
        j = dec.raw_decode(s, i)[1]
        out[k], i = s[i:j], j
def v1_layer(v1, data):
    # the diff ID whose chain makes `v1` the digest of this json (moby's v1.CreateID), else None
    f = members(data.decode("utf-8"))
    for with_os in (False, True):
        c = {k: v for k, v in f.items() if k not in ("id", "parent") and (with_os or k != "os")}
        if "parent" in f:
            c["parent"] = json.dumps("sha256:" + json.loads(f["parent"]))
        for i, chain in enumerate(chains):
            c["layer_id"] = '"sha256:%s"' % chain
            text = "{" + ",".join(json.dumps(k) + ":" + c[k] for k in sorted(c)) + "}"
            if hashlib.sha256(text.encode("utf-8")).hexdigest() == v1:
                return order[i]
    return None
def read(n):
    b = inp.read(n)
    if len(b) != n:
        raise SystemExit("the image archive ended early (docker save, or the layer store reader, stopped)")
    return b
def size(h):
    f = h[124:136]
    if f[0] & 0x80:
        return int.from_bytes(f[1:], "big")
    return int(f.rstrip(b"\0 ").decode() or "0", 8)
def blocks(n):
    return (n + 511) // 512 * 512
def copy(n, sink):
    while n:
        b = read(min(n, 1 << 20))
        n -= len(b)
        sink(b)
BLOB = re.compile(r"(?:.*/)?blobs/sha256/([0-9a-f]{64})$")
V1JSON = re.compile(r"(?:.*/)?([0-9a-f]{64})/json$")
V1TAR = re.compile(r"(?:.*/)?([0-9a-f]{64})/layer\.tar$")
# a docker save that dies mid-way closes the pipe like one that finished (and a cut after a layer
# ends in that layer's own zero blocks): the archive is walked entry by entry even when nothing is
# left out, and only one that reaches tar's end-of-archive block is complete
meta, longname = b"", None
while True:
    h = inp.read(512)
    if len(h) < 512:
        raise SystemExit("the image archive ended early (docker save, or the layer store reader, stopped)")
    if h == b"\0" * 512:
        out(meta + h)
        pump(inp)
        break
    n, kind = size(h), h[156:157]
    if kind in (b"x", b"L", b"g"):
        data = read(blocks(n))
        meta += h + data
        if kind == b"L":
            longname = data[:n].rstrip(b"\0").decode("utf-8", "replace")
        elif kind == b"x":
            for rec in data[:n].decode("utf-8", "replace").split("\n"):
                if " path=" in rec:
                    longname = rec.split(" path=", 1)[1]
        continue
    name = longname or (
        (h[345:500].rstrip(b"\0").decode("utf-8", "replace") + "/" if h[345] else "")
        + h[:100].rstrip(b"\0").decode("utf-8", "replace"))
    longname = None
    m, regular = BLOB.match(name), kind in (b"0", b"\0")
    v1j = V1JSON.match(name) if regular and skip and n < (1 << 20) else None
    v1t = V1TAR.match(name) if regular else None
    if v1t and v1t.group(1) in named:
        m = BLOB.match("blobs/sha256/" + named[v1t.group(1)])  # judged as the blob it is
    if v1j:
        data = read(blocks(n))
        out(meta + h + data)
        meta = b""
        try:
            d = v1_layer(v1j.group(1), data[:n])
        except (ValueError, IndexError, UnicodeDecodeError):
            d = None
        if d:
            named[v1j.group(1)] = d
    elif regular and m and m.group(1) in skip:
        copy(blocks(n), lambda b: None)
        dropped, ndrop, meta = dropped + n, ndrop + 1, b""
    elif regular and skip and not (m and m.group(1) in keep) and (
            name.endswith("/layer.tar") or (m and n > (1 << 20))):
        # a layer whose name does not say its diff ID: hashed on the way, spooled to disk meanwhile
        # (/var/tmp: disk-backed, where /tmp may be memory)
        sha = hashlib.sha256()
        with tempfile.TemporaryFile(dir="/var/tmp" if os.path.isdir("/var/tmp") else None) as t:
            copy(n, lambda b: (sha.update(b), t.write(b)))
            pad = read(blocks(n) - n)
            hashed, nhash = hashed + n, nhash + 1
            if sha.hexdigest() in skip:
                dropped, ndrop = dropped + n, ndrop + 1
            else:
                out(meta + h)
                t.seek(0)
                pump(t)
                out(pad)
        meta = b""
    else:
        out(meta + h)
        meta = b""
        copy(blocks(n), out)
finish()
print("@@dropped %d %d" % (ndrop, dropped), file=sys.stderr, flush=True)
print("@@hashed %d %d" % (nhash, hashed), file=sys.stderr, flush=True)
"""
)

# the receiver's exit status when the connection ended before the sender's end frame
STREAM_CUT = 75
# a relaying receiver's exit status when the next hop could not be reached or stopped taking data
# (its own copy, when it started, is complete: a failure of its own exits with that failure's status)
RELAY_FAILED = 76

# what `docker info` lists in DriverStatus when images live in containerd (Docker 24+ with the
# containerd image store enabled; the default for fresh installs from Docker 29)
CONTAINERD_STORE = "io.containerd.snapshotter"


def elides(driver_status: list | tuple) -> bool:
    """Whether this engine's docker load skips the tars of layers it holds. The classic
    graph-driver store does; the containerd image store imports the archive's blobs into its
    content store and fails on a layer file the archive omits, so it must get the whole image."""
    return not any(CONTAINERD_STORE in str(v) for pair in driver_status for v in pair)


def next_hop(dst_ip: str, port: int, src_ip: str) -> str:
    """The receiver's argument that makes it a relay: forward to `dst_ip:port`, sending from `src_ip`."""
    for a in (dst_ip, src_ip):
        if not a or any(c in a for c in ", \t\n"):
            raise ValueError(f"not an address: {a!r}")
    return f"next={dst_ip},{int(port)},{src_ip}"


# One connection from the sender's address that sends nothing: a receiver still waiting for a sender
# that ended without connecting (a container that did not start) sees a cut stream and ends at once,
# rather than after its minute of waiting (stream.run)
HANG_UP = (
    "import socket, sys\n"
    "socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5, source_address=(sys.argv[3], 0)).close()\n"
)


def hang_up_command(dst_ip: str, port: int, src_ip: str) -> str:
    return "python3 -c " + shlex.join([HANG_UP, dst_ip, str(int(port)), src_ip])


def receive_command(bind_ip: str, peer_ip: str, forward: str | None = None) -> str:
    """`forward`: next_hop(...) to relay the stream to the next node as it arrives."""
    return (
        "python3 -c "
        + shlex.quote(RECEIVER)
        + " "
        + shlex.quote(bind_ip)
        + " "
        + shlex.quote(peer_ip)
        + (" " + shlex.quote(forward) if forward else "")
    )


def send_command(
    image: str,
    dst_ip: str,
    port: int,
    src_ip: str,
    skip: list[str] | tuple[str, ...] = (),
    keep: list[str] | tuple[str, ...] = (),
    order: list[str] | tuple[str, ...] = (),
) -> str:
    """`skip`: diff IDs (sha256:<hex>) the worker holds, left out of the stream; `keep`: the image's
    other diff IDs (their blobs are sent without hashing); `order`: the image's diff IDs bottom up,
    from which the sender names a `<v1 id>/layer.tar` without reading it. No skip: every byte goes,
    unhashed."""

    def hexes(ds, sign: str) -> list[str]:
        out = []
        for d in ds:
            h = d.removeprefix("sha256:")
            if len(h) != 64 or any(c not in "0123456789abcdef" for c in h):
                raise ValueError(f"not a sha256 diff ID: {d!r}")
            out.append(sign + h)
        return out

    args = hexes(skip, "-") + (hexes(keep, "+") + hexes(order, "=") if skip else [])
    return piped_to_sender("docker save " + shlex.quote(image), dst_ip, port, src_ip, args)


def piped_to_sender(producer: str, dst_ip: str, port: int, src_ip: str, args: list[str] = ()) -> str:
    """`producer`'s archive on stdout into the framed sender, to the first receiver's port; the
    pipeline fails when either side does."""
    return (
        f"set -o pipefail; {producer} | python3 -c {shlex.quote(SENDER)} "
        f"{shlex.quote(dst_ip)} {int(port)} {shlex.quote(src_ip)}" + "".join(" " + a for a in args)
    )


def rate_arg(bytes_per_s: float | None) -> list[str]:
    """A sender's argument that caps its stream (FRAMING), or none for an uncapped one."""
    if bytes_per_s is None:
        return []
    if not bytes_per_s > 0:
        raise ValueError(f"not a rate: {bytes_per_s!r}")
    return [f"rate={int(bytes_per_s)}"]


def bash(cmd: str) -> list[str]:
    return ["bash", "-c", cmd]


def disk_needed(
    size: int, layers: list[str], present: list[tuple[list[str], int]], layer_sizes: list[int] | None = None
) -> int:
    """Bytes `docker load` needs free on the receiving node's docker root.

    docker load first unpacks the whole saved image into a temporary directory under the docker
    root, then stores only the layers the node lacks. `present` is (layers, size) of each image on
    the node; layers are shared from the bottom up, so what the node holds of ours is the longest
    common prefix with any of them. `layer_sizes` are the sizes of the image's non-empty history
    entries, oldest first (`docker history`): it lists no layer IDs, and a layer of size 0 may or
    may not have an entry, so a prefix is only credited with the entries that must lie inside it.
    Without them, an image ours is built on (its base) counts with its own size.
    """
    if not layers:
        return 2 * size
    prefix = max((_common_prefix(ls, layers) for ls, _ in present), default=0)
    if prefix == len(layers):
        return size
    shared = max((sz for ls, sz in present if ls and layers[: len(ls)] == ls), default=0)
    if layer_sizes is not None and len(layer_sizes) <= len(layers):
        surely_inside = max(prefix - (len(layers) - len(layer_sizes)), 0)
        shared = max(shared, sum(layer_sizes[:surely_inside]))
    return size + max(size - shared, 0)


def _common_prefix(a: list[str], b: list[str]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def describe(image: str, src_node: str, src_ip: str, dst_node: str, dst_ip: str) -> str:
    return (
        f"{src_node}: docker save {image} | drop the layer tars {dst_node} holds | tcp {src_ip} -> {dst_ip} | "
        f"{dst_node}: docker load (one connection, head's address only; image ID verified after)"
    )
