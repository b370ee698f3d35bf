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


def disk_needed(size: int, layers: list[str], present: list[tuple[list[str], int]]) -> int:
    """Bytes `docker load` needs free on the receiving node's docker root.

    docker load first unpacks the whole saved image into a temporary directory under the docker
    root, then registers the layers the node lacks. `present` is (layers, size) of each image on
    the node. Sizes are known per image, not per layer, so only two kinds of image count as
    holding our bytes: one built on ours holds all of them, and one ours is built on (its base)
    holds its own size.
    """
    def shared(ls: list[str], sz: int) -> int:
        if not ls:
            return 0
        if ls[:len(layers)] == layers:
            return size
        return sz if layers[:len(ls)] == ls else 0

    return size + max(size - max((shared(ls, sz) for ls, sz in present), default=0), 0)


def describe(image: str, src_node: str, src_ip: str, dst_node: str, dst_ip: str) -> str:
    return (f"{src_node}: docker save {image} | tcp {src_ip} -> {dst_ip} | {dst_node}: docker load "
            "(one connection, head's address only; image ID verified after)")
