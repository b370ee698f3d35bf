"""A local port forwarded through a host's SSH connection to an address that host reaches, as
`ssh -L` does: a listener on 127.0.0.1 (a free port), each connection accepted carried by a channel
the host opens (`direct-tcpip`), bytes pumped both ways.

Why: when the gateway is the only door (issue 36, the inventory's `engines_listen = "control"`),
each engine listens only on its head's control address, which the laptop may not route to; the
controller's own questions (up's readiness, status, bench's checks) still reach it, over the SSH
connection every command already rides, with no port opened on the node.
"""

from __future__ import annotations

import select
import socket
import threading
from collections.abc import Callable

PUMP_CHUNK = 65536
LOOK_S = 0.5  # how often an idle pump or the listener looks whether the forward was closed


class Forward:
    """`open_channel()` gives a socket-like channel (recv, sendall, fileno, close) to the far address
    for each connection; `url(scheme)` is where local clients connect."""

    def __init__(self, open_channel: Callable[[], object]):
        self._open = open_channel
        self._closed = threading.Event()
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self._sock.settimeout(LOOK_S)
        self.port = self._sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True, name=f"forward-{self.port}").start()

    def url(self, scheme: str = "http") -> str:
        return f"{scheme}://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:  # the listener was closed
                return
            threading.Thread(target=self._carry, args=(conn,), daemon=True).start()

    def _carry(self, conn: socket.socket) -> None:
        try:
            chan = self._open()
        except Exception:  # noqa: BLE001 - the far side refused: the local client sees the connection close
            conn.close()
            return
        try:
            pump(conn, chan, self._closed)
        finally:
            for end in (chan, conn):
                try:
                    end.close()
                except OSError:
                    pass

    def close(self) -> None:
        self._closed.set()
        self._sock.close()

    def __enter__(self) -> Forward:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def pump(a, b, closed: threading.Event) -> None:
    """Bytes both ways between two socket-like ends until either closes (or `closed` is set)."""
    ends = [a, b]
    while not closed.is_set():
        ready, _, _ = select.select(ends, [], [], LOOK_S)
        for src in ready:
            data = src.recv(PUMP_CHUNK)
            if not data:
                return
            (b if src is a else a).sendall(data)
