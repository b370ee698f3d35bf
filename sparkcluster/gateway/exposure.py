"""What a peer on the LAN can hold of the gateway before it has shown a key, whatever uvicorn the
cluster's image ships.

uvicorn bounds some of it itself, and those knobs are passed where the version found has them
(`server_options` reads its `Config`'s signature): `timeout_keep_alive` closes a connection idle
after an answer, `limit_concurrency` answers 503 past a number of connections or tasks, and
`h11_max_incomplete_event_size` (uvicorn 0.18 on, h11's protocol only) bounds a request's head. It
has no deadline on receiving a request: its keep-alive timer starts only once an answer is
complete, and any byte received cancels it, so a connection that never finishes its headers (or
never sends one) is held for as long as its peer likes; with httptools (what `uvicorn[standard]`
picks) nothing bounds the size of those headers either.

So the protocol uvicorn would have picked is wrapped (`protocol_class`: uvicorn accepts a class for
`http` and calls it with its own keyword arguments, from 0.15 to now), and the wrapper, with the
`Guard` the app tells what it learns, holds these bounds:
- a request's head (from its first byte, or from the connection's opening) is complete within
  `header_timeout_s` and `header_bytes`, else the connection is closed (408 or 431 said first);
- a request that showed a key has its body in within `body_timeout_s` (the app reads it; a request
  without a key is answered 401 before its body is read);
- connections that have not yet shown a valid key are capped at `unkeyed_connections`: one more
  closes the oldest of them, so a newcomer (a keyed client's among them) can always send its
  headers; every connection together stays under `max_connections`, both from the process's file
  limit (each request in flight holds two: its client's and its upstream's);
- a request's body is refused with 413 past `body_bytes` (`upload_bytes` on a service's routes,
  where audio uploads go), before anything is forwarded (app.request_body).

Standard library and uvicorn only: shipped into the gateway's container with the rest.
"""

from __future__ import annotations

import asyncio
import inspect
from collections import OrderedDict
from dataclasses import dataclass, fields

HEADER_TIMEOUT_S = 10.0  # a client on the LAN sends its headers in milliseconds
BODY_TIMEOUT_S = 120.0  # a keyed upload of `upload_bytes` over a slow link
HEADER_BYTES = 32 * 1024  # h11's own default is 16 KiB; OpenAI's and Anthropic's clients send under 2
KEEP_ALIVE_S = 5  # uvicorn's default, said here so that every version gets the same
BODY_BYTES = 32 * 1024 * 1024  # a chat request with a few images inline (base64) fits
UPLOAD_BYTES = 100 * 1024 * 1024  # an audio upload to a service's route (OpenAI's own limit is 25 MB)
RESERVED_FDS = 64  # the listener, the loop, the config, the supervisors' looks, logs
MAX_CONNECTIONS = 8192  # with a file limit in the millions, still a bound
HEAD, SENT, IDLE = "head", "sent", "idle"
TIMEOUT, TOO_LARGE = b"408 Request Timeout", b"431 Request Header Fields Too Large"


@dataclass(frozen=True)
class Limits:
    header_timeout_s: float = HEADER_TIMEOUT_S
    body_timeout_s: float = BODY_TIMEOUT_S
    header_bytes: int = HEADER_BYTES
    keep_alive_s: int = KEEP_ALIVE_S
    body_bytes: int = BODY_BYTES
    upload_bytes: int = UPLOAD_BYTES
    max_connections: int = 0  # 0: from the file limit
    unkeyed_connections: int = 0  # 0: half of max_connections
    backlog: int = 0  # 0: a quarter of max_connections (uvicorn's own is 2048)

    @classmethod
    def from_config(cls, cfg: dict, nofile: int | None = None) -> Limits:
        """The config's `limits` (each optional) over the defaults; the connection caps from the
        process's soft file limit unless the config names them."""
        given = {f.name: cfg[f.name] for f in fields(cls) if cfg.get(f.name)}
        got = cls(**given)
        most = got.max_connections or connections_for(file_limit() if nofile is None else nofile)
        return cls(
            **{
                **given,
                "max_connections": most,
                "unkeyed_connections": got.unkeyed_connections or most // 2,
                "backlog": got.backlog or max(64, most // 4),
            }
        )


def file_limit() -> int:
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return MAX_CONNECTIONS * 2 if soft == resource.RLIM_INFINITY else soft


def connections_for(nofile: int) -> int:
    """Client connections the file limit carries: each request in flight holds its client's file and
    its upstream's, and some are the process's own."""
    return max(16, min(MAX_CONNECTIONS, (nofile - RESERVED_FDS) // 2))


def peer(transport) -> tuple[str, int] | None:
    """The peer as uvicorn puts it in the ASGI scope's `client` (host as a string, port as an int)."""
    info = transport.get_extra_info("peername")
    if isinstance(info, (list, tuple)) and len(info) >= 2:
        return (str(info[0]), int(info[1]))
    return None


class Guard:
    """Every connection the wrapper serves, by peer; the app tells it, by the scope's `client`, when
    a request reached it (`begin`), showed a valid key (`keyed`), had its body read (`received`) and
    was answered (`end`). A client it does not know (an app served without the wrapper) is ignored."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self.conns: dict[tuple[str, int], _Conn] = {}
        self.unkeyed: OrderedDict[_Conn, None] = OrderedDict()  # oldest first
        self.evicted = 0
        self.timed_out = 0

    def opened(self, conn: _Conn) -> None:
        if conn.peer is not None:
            self.conns[conn.peer] = conn
        self.unkeyed[conn] = None
        while len(self.unkeyed) > self.limits.unkeyed_connections or len(self.conns) > self.limits.max_connections:
            oldest = next(iter(self.unkeyed), None)
            if oldest is None:  # every one has shown a key: the newcomer is the one refused
                oldest = conn
            self.unkeyed.pop(oldest, None)
            self.evicted += 1
            oldest.close()
            if oldest is conn:
                return

    def closed(self, conn: _Conn) -> None:
        if conn.peer is not None and self.conns.get(conn.peer) is conn:
            del self.conns[conn.peer]
        self.unkeyed.pop(conn, None)

    def _conn(self, client) -> _Conn | None:
        return self.conns.get(tuple(client)) if client else None

    def begin(self, client) -> None:
        if (c := self._conn(client)) is not None:
            c.begin()

    def keyed(self, client) -> None:
        if (c := self._conn(client)) is not None:
            self.unkeyed.pop(c, None)

    def received(self, client) -> None:
        if (c := self._conn(client)) is not None:
            c.received()

    def end(self, client) -> None:
        if (c := self._conn(client)) is not None:
            c.end()


class _Conn(asyncio.Protocol):
    """The wrapper around uvicorn's own protocol for one connection: every event passes through to
    it; this only keeps the deadlines and counts a request head's bytes."""

    inner_class: type = asyncio.Protocol
    guard: Guard

    def __init__(self, **kwargs):
        self.inner = self.inner_class(**kwargs)
        self.transport = None
        self.peer = None
        self.timer: asyncio.TimerHandle | None = None
        self.state = HEAD  # HEAD: reading a request's head; SENT: its head is in; IDLE: between requests
        self.head = 0  # bytes of the head received so far
        self.tail = b""  # the head's last bytes, where its end may straddle two reads
        self.in_app = False
        self.body_in = False  # the app has read the request's body
        self.more = False  # bytes arrived after that: the next request's

    # -- asyncio's protocol, passed through
    def connection_made(self, transport) -> None:
        self.transport, self.peer = transport, peer(transport)
        self.inner.connection_made(transport)
        self.arm(self.guard.limits.header_timeout_s, TIMEOUT)
        self.guard.opened(self)

    def data_received(self, data: bytes) -> None:
        if self.state == IDLE:  # the first byte of the next request: its head's deadline starts
            self.state, self.head, self.tail = HEAD, 0, b""
            self.arm(self.guard.limits.header_timeout_s, TIMEOUT)
        if self.state == HEAD:
            if not self._head_read(data):
                return
        elif self.body_in:
            self.more = True
        self.inner.data_received(data)

    def _head_read(self, data: bytes) -> bool:
        seen = self.tail + data
        end = min((i for i in (seen.find(b"\r\n\r\n"), seen.find(b"\n\n")) if i >= 0), default=-1)
        self.head += len(data) if end < 0 else max(0, end - len(self.tail))
        if self.head > self.guard.limits.header_bytes:
            self.refuse(TOO_LARGE)
            return False
        if end >= 0:
            self.state = SENT  # its body, if any, is the app's to bound
        else:
            self.tail = seen[-3:]
        return True

    def connection_lost(self, exc) -> None:
        self.disarm()
        self.guard.closed(self)
        self.inner.connection_lost(exc)

    def eof_received(self):
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    # -- the deadlines
    def arm(self, seconds: float, status: bytes) -> None:
        self.disarm()
        self.timer = asyncio.get_running_loop().call_later(seconds, self._expired, status)

    def disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _expired(self, status: bytes) -> None:
        self.timer = None
        self.guard.timed_out += 1
        if self.in_app:  # a body not in by its deadline: the app's receive() sees the disconnect
            self.close()
        else:
            self.refuse(status)

    def refuse(self, status: bytes) -> None:
        """Before the app has the request: an answer of our own, then the connection closed."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"HTTP/1.1 " + status + b"\r\nconnection: close\r\ncontent-length: 0\r\n\r\n")
        self.close()

    def close(self) -> None:
        self.disarm()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    # -- what the app says
    def begin(self) -> None:
        self.state, self.in_app, self.body_in, self.more = SENT, True, False, False
        self.arm(self.guard.limits.body_timeout_s, TIMEOUT)

    def received(self) -> None:
        self.body_in = True
        self.disarm()

    def end(self) -> None:
        self.in_app = self.body_in = False
        self.disarm()
        self.state = IDLE
        if self.more:  # part of the next request may be in already: its head's deadline runs now
            self.state, self.head, self.tail = HEAD, 0, b""
            self.arm(self.guard.limits.header_timeout_s, TIMEOUT)


def protocol_class(guard: Guard, inner: type) -> type:
    """A protocol class for uvicorn's `http` option: `inner` (the protocol uvicorn would pick)
    wrapped, every connection known to `guard`."""
    return type("GuardedProtocol", (_Conn,), {"inner_class": inner, "guard": guard})


def server_options(guard: Guard, config_class=None) -> dict:
    """uvicorn's keyword arguments for the limits, as far as the uvicorn found takes them, and the
    wrapped protocol."""
    import uvicorn
    from uvicorn.config import HTTP_PROTOCOLS
    from uvicorn.importer import import_from_string

    config_class = config_class or uvicorn.Config
    takes = inspect.signature(config_class.__init__).parameters
    lim = guard.limits
    wanted = {
        "http": protocol_class(guard, import_from_string(HTTP_PROTOCOLS["auto"])),
        "timeout_keep_alive": lim.keep_alive_s,
        # past the guard's cap only while evicted connections are still being closed: a backstop
        "limit_concurrency": lim.max_connections + RESERVED_FDS,
        "h11_max_incomplete_event_size": lim.header_bytes,
        # connections accepted at once (asyncio accepts up to this many per wake-up, before any is
        # seen by the guard; libuv until the queue is empty): a burst stays within the file limit
        "backlog": lim.backlog,
        "proxy_headers": False,  # the scope's client is the socket's peer: no X-Forwarded-For taken
        "server_header": False,
    }
    return {k: v for k, v in wanted.items() if k in takes}
