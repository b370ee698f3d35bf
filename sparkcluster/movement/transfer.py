"""Send the cluster image from the head to a worker over the link between them.

`docker save` on the head streams into a one-shot TCP receiver on the worker that feeds
`docker load`. The bytes never pass through the controller, and no SSH trust between the nodes is
needed or added: the receiver listens on the worker's control-link address only, accepts one
connection from the head's control-link address only, checks every frame's tag under the stream's
own key (programs/framing; the key reaches both ends on their stdin over SSH, movement/stream)
before docker load sees its bytes, and the image ID compared afterwards checks what was loaded
(docker load checks every layer against the image config, whose digest is the ID).
"""

from __future__ import annotations

import shlex

from sparkcluster import programs
from sparkcluster.programs import receiver

# Both ends are python3, which every DGX OS host has; no netcat flavour to guess at. The programs
# are modules of sparkcluster/programs: the receiver (`receiver`), the senders' framing (`framing`),
# the image's sender that leaves out the layers the worker holds (`image_sender`), a plain byte pipe
# from stdin (`stream_sender`) and the hang-up (`hang_up`); the weights have their own sender and
# receiver on the same framing (`weights_send`, `weights_receive`: movement/hfcache).
RECEIVER = "sparkcluster.programs.receiver"
SENDER = "sparkcluster.programs.image_sender"
STREAM_SENDER = "sparkcluster.programs.stream_sender"
HANG_UP = "sparkcluster.programs.hang_up"

# the receiver's exit status when the connection ended before the sender's end frame
STREAM_CUT = receiver.STREAM_CUT
# a relaying receiver's exit status when the next hop could not be reached or stopped taking data
# (its own copy, when it started, is complete: a failure of its own exits with that failure's status)
RELAY_FAILED = receiver.RELAY_FAILED
# a receiver's exit status when a frame was not the head's (framing's tag, or its length) or it had no key
REFUSED = receiver.REFUSED

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


def hang_up_command(dst_ip: str, port: int, src_ip: str) -> str:
    """One connection from the sender's address that sends nothing (programs/hang_up)."""
    return programs.command(HANG_UP, dst_ip, str(int(port)), src_ip)


def receive_command(bind_ip: str, peer_ip: str, forward: str | None = None) -> str:
    """`forward`: next_hop(...) to relay the stream to the next node as it arrives."""
    return programs.command(RECEIVER, bind_ip, peer_ip, *([forward] if forward else []))


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
    return f"set -o pipefail; {keyed(producer)} | " + programs.command(SENDER, dst_ip, str(int(port)), src_ip, *args)


def keyed(producer: str) -> str:
    """`producer`'s output after the stream key, the first line of this command's stdin (framing: a
    sender's stdin starts with the key). `read` and `printf` are bash's own: the key is in no argv."""
    return f"{{ IFS= read -r key && printf '%s\\n' \"$key\" && {producer} ; }}"


def rate_arg(bytes_per_s: float | None) -> list[str]:
    """A sender's argument that caps its stream (programs/framing), or none for an uncapped one."""
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
