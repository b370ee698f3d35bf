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
RECEIVER = r"""
import socket, sys
bind, peer = sys.argv[1], sys.argv[2]
s = socket.socket()
s.bind((bind, 0))
s.listen(1)
s.settimeout(60)
print("@@port %d" % s.getsockname()[1], file=sys.stderr, flush=True)
while True:
    c, addr = s.accept()
    if addr[0] == peer:
        break
    c.close()
s.close()
out = sys.stdout.buffer
while True:
    b = c.recv(1 << 20)
    if not b:
        break
    out.write(b)
out.flush()
"""

SENDER = r"""
import socket, sys, time
dst, port, src = sys.argv[1], int(sys.argv[2]), sys.argv[3]
s = socket.create_connection((dst, port), timeout=30, source_address=(src, 0))
inp = sys.stdin.buffer
sent, last = 0, 0.0
while True:
    b = inp.read(1 << 20)
    if not b:
        break
    s.sendall(b)
    sent += len(b)
    now = time.monotonic()
    if now - last > 0.25:
        print("@@sent %d" % sent, file=sys.stderr, flush=True)
        last = now
s.shutdown(socket.SHUT_WR)
s.recv(1)
print("@@sent %d" % sent, file=sys.stderr, flush=True)
"""


def receive_command(bind_ip: str, peer_ip: str) -> str:
    return ("set -o pipefail; python3 -c " + shlex.quote(RECEIVER) + " " + shlex.quote(bind_ip) + " "
            + shlex.quote(peer_ip) + " | docker load")


def send_command(image: str, dst_ip: str, port: int, src_ip: str) -> str:
    return ("set -o pipefail; docker save " + shlex.quote(image) + " | python3 -c " + shlex.quote(SENDER) + " "
            + shlex.quote(dst_ip) + " " + str(int(port)) + " " + shlex.quote(src_ip))


def bash(cmd: str) -> list[str]:
    return ["bash", "-c", cmd]


def disk_needed(size: int, layers: list[str], present: list[tuple[list[str], int]],
                layer_sizes: list[int] | None = None) -> int:
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
    shared = max((sz for ls, sz in present if ls and layers[:len(ls)] == ls), default=0)
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
    return (f"{src_node}: docker save {image} | tcp {src_ip} -> {dst_ip} | {dst_node}: docker load "
            "(one connection, head's address only; image ID verified after)")
