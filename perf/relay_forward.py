"""What a relay's forwarding alone costs (issue 77): a file streamed over loopback from a sender to a
relay process to a sink, nothing hashed or written, the relay's getrusage (user + sys) per GB for
each way of forwarding:
- `leaf`: the relay only receives (recv_into its buffer), nothing forwarded: the floor;
- `copy`: programs/receiver's Relay: recv_into, then sendall from the same buffer (the default);
- `splice`: programs/receiver's Spliced (argument relay=splice): splice into a pipe, tee into a
  second one that a thread splices into the next socket, read the first into the buffer;
- `peek`: programs/receiver's Peeked (argument relay=peek): recv_into with MSG_PEEK, then the same
  bytes spliced out of the socket into a pipe and on into the next socket;
- `pure`: splice into a pipe and from it into the next socket, nothing read: no copy through the
  process at all, and no copy for its own sink either (what no verifying relay can be).
Over loopback part of the kernel's receive work for a stream is done in its sender's context, so
`copy`, `splice` and `pure` also carry some of the sink's.

Usage: `python3 perf/relay_forward.py [--gb 1] [--reps 2] [--src /dev/shm/relay-forward.bin]`, from a
checkout (its sparkcluster is the one measured). Prints one line per run and the medians.
"""

from __future__ import annotations

import argparse
import mmap
import os
import socket
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sparkcluster.programs import receiver  # noqa: E402

MODES = ("leaf", "copy", "splice", "peek", "pure")
IP = "127.0.0.1"


def sink(ls: socket.socket) -> None:
    c, _ = ls.accept()
    mv = memoryview(bytearray(1 << 20))
    while c.recv_into(mv):
        pass
    c.close()


def relay(mode: str, rs: socket.socket, nxt_port: int, size: int) -> None:
    c, _ = rs.accept()
    c.settimeout(600)
    hop = [IP, str(nxt_port), IP]
    if mode == "pure":
        nxt = socket.create_connection((IP, nxt_port))
        a = receiver._pipe()
        c.setblocking(True)
        while k := os.splice(c.fileno(), a[1], receiver.PIPE):
            while k:
                k -= os.splice(a[0], nxt.fileno(), k)
        nxt.shutdown(socket.SHUT_WR)
        nxt.recv(1)
        return
    r = receiver.relay_to(hop if mode != "leaf" else None, mode)
    assert mode in ("leaf", "copy") or type(r) is not receiver.Relay, f"this machine does not splice: {mode}"
    buf = memoryview(mmap.mmap(-1, 1 << 22))
    left = size
    while left:
        n = min(left, 1 << 22)
        r.fill(c, buf[:n])
        left -= n
    r.end()
    r.wait()


def once(mode: str, src: Path, size: int) -> tuple[float, float]:
    ls, rs = socket.create_server((IP, 0)), socket.create_server((IP, 0))
    pids = []
    if mode != "leaf":
        pid = os.fork()
        if pid == 0:
            sink(ls)
            os._exit(0)
        pids.append(pid)
    rp = os.fork()
    if rp == 0:
        relay(mode, rs, ls.getsockname()[1], size)
        os._exit(0)
    t = time.monotonic()
    s = socket.create_connection((IP, rs.getsockname()[1]))
    with open(src, "rb") as f:
        off = 0
        while off < size:
            off += s.sendfile(f, off, size - off)
    s.shutdown(socket.SHUT_WR)
    _, _, ru = os.wait4(rp, 0)
    secs = time.monotonic() - t
    s.close()
    for pid in pids:
        os.waitpid(pid, 0)
    ls.close()
    rs.close()
    return (ru.ru_utime + ru.ru_stime) / (size / 1e9), size / secs / 1e9


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--src", type=Path, default=Path("/dev/shm/relay-forward.bin"))
    a = ap.parse_args(argv)
    size = int(a.gb * 1e9) // (1 << 24) * (1 << 24)
    with open(a.src, "wb") as f:
        for _ in range(size // (1 << 24)):
            f.write(os.urandom(1 << 24))
    got: dict[str, list[float]] = {m: [] for m in MODES}
    try:
        for rep in range(a.reps):
            for m in MODES:
                cost, gbs = once(m, a.src, size)
                got[m].append(cost)
                print(f"{m} rep {rep}: {cost:.3f} core-s per GB, {gbs:.2f} GB/s", flush=True)
    finally:
        a.src.unlink()
    print("| forward | relay core-s per GB (median, min-max) |\n|---|---:|")
    for m, xs in got.items():
        print(f"| {m} | {statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f}) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
