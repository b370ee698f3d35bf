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

from sparkcluster import programs

# The reader (programs/layer_reader): the archive on stdout; argv: the docker root as mounted, the
# image ID (hex), the tag to give it, then "=<hex>" the image's diff IDs bottom up and "-<hex>" those
# every receiving worker holds (left out)
READER = "sparkcluster.programs.layer_reader"
# The reader sending the archive itself to the worker's receiver, framed (programs/layer_sender:
# argv[1:4] the receiver's address and port, the sender's address; then the reader's)
SENDING_READER = "sparkcluster.programs.layer_sender"

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
    line after the stream key (the container starts while the receivers do: stream.run's
    `port_on_stdin`). The container's stdin is the command's: the key's first line (framing)."""
    args = [dst_ip, "-" if port is None else str(int(port)), src_ip, *_args(image, image_id, root_dir, order, skip)]
    return shlex.join(_container(image, root_dir, "host", SENDING_READER, args, stdin=True))


def _args(image: str, image_id: str, root_dir: str, order: tuple[str, ...], skip: tuple[str, ...]) -> list[str]:
    """The reader's own arguments (programs/layer_reader's)."""
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


def _container(
    image: str, root_dir: str, network: str, program: str, argv: list[str], stdin: bool = False
) -> list[str]:
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
        *programs.argv(program, *argv)[1:],
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
