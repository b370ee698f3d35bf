"""Each node's memory report: MemAvailable (and whether Ray runs) on a read-only HTTP endpoint at
the node's control IP, which the head's supervisor reads for its peers. The same endpoint answers
`/metrics` (node/metrics) for Prometheus: one listener per node, one port to open."""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .readings import mem_available, mem_total


def node_report(node: str, ray: subprocess.Popen) -> dict:
    with open("/proc/meminfo") as f:
        text = f.read()
    return {
        "node": node,
        "mem_available": mem_available(text),
        "mem_total": mem_total(text),  # the supervisor's wait before a restart needs the pool's size
        "ray_alive": ray.poll() is None,
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


def serve_reports(address: str, port: int, report, metrics=None) -> None:
    """`/` the report (JSON), `/metrics` the text `metrics()` returns (Prometheus' format)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            if metrics is not None and self.path.split("?")[0] == "/metrics":
                body, kind = metrics().encode(), "text/plain; version=0.0.4; charset=utf-8"
            else:
                body, kind = json.dumps(report()).encode(), "application/json"
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):  # one line per poll would drown the container's log
            pass

    httpd = ThreadingHTTPServer((address, port), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
