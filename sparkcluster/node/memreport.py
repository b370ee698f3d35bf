"""Each node's memory report: MemAvailable (whether Ray runs, when the agent started) on a read-only HTTP endpoint at
the node's control IP, which the head's supervisor reads for its peers. The same endpoint answers
`/metrics` (node/metrics) for Prometheus: one listener per node, one port to open."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from . import aer
from .readings import held, mem_available, mem_total


def node_report(node: str, ray: subprocess.Popen, agent_started: float) -> dict:
    """`agent_started`: when this node's agent started (time.time(), before it started Ray): a live
    Ray node at this node's IP that started before it is the previous container's (node/raynodes)."""
    with open("/proc/meminfo") as f:
        text = f.read()
    return {
        "node": node,
        "mem_available": mem_available(text),
        "mem_total": mem_total(text),  # the supervisor's wait before a restart needs the pool's size
        "mem_held": held(text),  # what a start refused for memory names (issue 36)
        "ray_alive": ray.poll() is None,
        "agent_started": agent_started,
        "aer": aer.read(),  # the CX7's PCIe AER counters, which the head's supervisor journals a rise of
        "ts": time.time(),
    }


def peer_memory(ip: str, port: int, timeout: float = 1.0, seen: dict | None = None) -> tuple[int | None, str]:
    """A peer's MemAvailable from its report, or (None, why not): a report that does not answer is
    unknown memory, never "enough". `seen` gets the whole report under "report" (None unanswered)."""
    seen = {} if seen is None else seen
    seen["report"] = None
    try:
        with urllib.request.urlopen(f"http://{ip}:{port}/", timeout=timeout) as r:
            seen["report"] = json.loads(r.read())
            value = seen["report"].get("mem_available")
    except (OSError, ValueError, AttributeError) as e:
        return None, f"its memory report at {ip}:{port} does not answer ({e})"
    if not isinstance(value, int):
        return None, f"its memory report at {ip}:{port} has no MemAvailable"
    return value, ""


# what one peer may hold of the report server: its readers (the head's supervisor, Prometheus, the
# gateway) ask a few times a second and are answered in milliseconds
CONNECTIONS = 32  # open at once; one more closes the oldest, so a newcomer is always read
CONNECTION_S = 5.0  # a connection's whole life: its request read, answered and closed
REAP_S = 0.5  # how often connections past their life are looked for


class BoundedServer(ThreadingHTTPServer):
    """http.server's threaded server, which gives every connection a thread for as long as its peer
    keeps it open, with two bounds: at most `connections` open at once (one more closes the oldest)
    and `lifetime_s` each (a reaper shuts down a connection's socket past it, which ends its thread's
    read). The handler answers one request per connection (HTTP/1.0, http.server's default)."""

    daemon_threads = True
    request_queue_size = 128  # socketserver's 5 drops a reader's connection attempt behind a burst of others

    def __init__(self, address, handler, connections: int = CONNECTIONS, lifetime_s: float = CONNECTION_S):
        super().__init__(address, handler)
        self.connections, self.lifetime_s = connections, lifetime_s
        self.open: dict[socket.socket, float] = {}  # socket -> its deadline (monotonic), oldest first
        self.lock = threading.Lock()
        threading.Thread(target=self._reap, daemon=True).start()

    def process_request(self, request, client_address):
        with self.lock:
            while len(self.open) >= self.connections:
                _cut(next(iter(self.open)), self.open)
            self.open[request] = time.monotonic() + self.lifetime_s
        super().process_request(request, client_address)

    def shutdown_request(self, request):
        with self.lock:
            self.open.pop(request, None)
        super().shutdown_request(request)

    def _reap(self) -> None:
        while True:
            time.sleep(REAP_S)
            now = time.monotonic()
            with self.lock:
                for sock in [s for s, deadline in self.open.items() if deadline < now]:
                    _cut(sock, self.open)


def _cut(sock: socket.socket, open_: dict) -> None:
    """End a connection's thread's read or write: its socket shut down (closed by its thread)."""
    open_.pop(sock, None)
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def serve_reports(
    address: str, port: int, report, metrics=None, wake=None, status=None, yield_=None, console=None, ask=None
) -> BoundedServer:
    """`/` the report (JSON), `/metrics` the text `metrics()` returns (Prometheus' format). With
    `wake` (the head of an on-demand deployment), `POST /wake` is its one input: `wake(token)` with
    the bearer token presented gets (HTTP status, JSON document); no body is read. With `status`,
    `/status` is the text `status()` returns (node/container_status), answered only to a caller on
    this node (from `address` itself): it carries the journal's last lines, which are no peer's.
    With `yield_`, `POST /yield` (the same token) asks a serving engine on demand to stop and go back
    on standby, so that another deployment on its nodes fits (issue 60: the gateway's rule chose it).
    With `console` (the head; node/console_calls.read), `GET /journal` and `GET /log` answer the
    gateway's console with the same token; with `ask` (node/supervisor `ask`), `POST /restart` and
    `POST /standby` are its actions, `ask(what, token, who)` with the name `X-Sparkcluster-By` gives.
    Every connection is bounded (BoundedServer): a peer that opens many, or sends nothing, holds
    neither threads nor the readers' turn for long. Returns the server."""

    class Handler(BaseHTTPRequestHandler):
        timeout = CONNECTION_S  # each read and write on its socket (the reaper bounds the whole)

        def _answer(self, code: int, body: bytes, kind: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _token(self) -> str:
            scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
            return token.strip() if scheme.lower() == "bearer" else ""

        def do_GET(self):  # noqa: N802 (http.server's name)
            path, _, q = self.path.partition("?")
            if console is not None and path in ("/journal", "/log"):
                query = {k: v[-1] for k, v in urllib.parse.parse_qs(q).items()}
                code, doc = console(path, self._token(), query)
                self._answer(code, json.dumps(doc).encode(), "application/json")
            elif metrics is not None and path == "/metrics":
                self._answer(200, metrics().encode(), "text/plain; version=0.0.4; charset=utf-8")
            elif status is not None and path == "/status":
                if self.client_address[0] != address:
                    self._answer(403, b'{"error": "answered to this node only"}', "application/json")
                else:
                    self._answer(200, status().encode(), "text/plain; charset=utf-8")
            else:
                self._answer(200, json.dumps(report()).encode(), "application/json")

        def do_POST(self):  # noqa: N802
            path = self.path.split("?")[0]
            if ask is not None and path in ("/restart", "/standby"):
                who = (self.headers.get("X-Sparkcluster-By") or "")[:64] or "unnamed"
                code, doc = ask(path[1:], self._token(), who)
                self._answer(code, json.dumps(doc).encode(), "application/json")
                return
            act = {"/wake": wake, "/yield": yield_}.get(path)
            if act is None:
                self._answer(404, b'{"error": "not found"}', "application/json")
                return
            code, doc = act(self._token())
            self._answer(code, json.dumps(doc).encode(), "application/json")

        def log_message(self, *args):  # one line per poll would drown the container's log
            pass

    httpd = BoundedServer((address, port), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd
