"""The testbed's model hub: `start_hub` serves the tiny model, a gated copy of it and a synthetic
repo of a few hundred MB on the controller's LAN address; `stop_hub` stops it. Huggingface_hub
reaches it through HF_ENDPOINT (the inventory's `hf_endpoint`). See server.py for the protocol."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from http.server import ThreadingHTTPServer

from .server import Hub, Repo, make_server, serve_forever_in_thread, synthetic_repo

TINY = "sparkcluster/testbed-tiny"
GATED = "sparkcluster/testbed-tiny-gated"
SYNTHETIC = "sparkcluster/testbed-synthetic"
GRANTED_TOKEN = "hf_testbed_granted_0123456789"  # accepted for the gated repo
REFUSED_TOKEN = "hf_testbed_not_granted_987654"  # a valid-looking token without access


@dataclass
class Running:
    hub: Hub
    server: ThreadingHTTPServer

    @property
    def endpoint(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"


_running: Running | None = None


def build_hub(model_dir: Path, state_dir: Path, *, synthetic_mb: int = 300, tiny_sha: str | None = None) -> Hub:
    memo = state_dir / "hashes"
    repos = [Repo(TINY, model_dir, memo_dir=memo, sha=tiny_sha or "").load(),
             Repo(GATED, model_dir, gated=True, memo_dir=memo).load()]
    if synthetic_mb:
        repos.append(Repo(SYNTHETIC, synthetic_repo(state_dir / "synthetic", synthetic_mb), memo_dir=memo).load())
    return Hub(repos, {GRANTED_TOKEN})


def start_hub(host: str = "198.18.0.1", port: int = 8090, *, model_dir: Path | None = None,
              state_dir: Path | None = None, synthetic_mb: int = 300) -> Running:
    """Start the hub in a thread of this process; returns it (endpoint, knobs, byte counter)."""
    global _running
    if _running is not None:
        return _running
    from .. import artifacts
    model_dir = model_dir or artifacts.model_dir()
    state_dir = state_dir or artifacts.CACHE / "hub"
    hub = build_hub(model_dir, state_dir, synthetic_mb=synthetic_mb, tiny_sha=artifacts.TINY_REVISION)
    srv = make_server(hub, host, port)
    serve_forever_in_thread(srv)
    _running = Running(hub, srv)
    return _running


def stop_hub() -> None:
    global _running
    if _running is not None:
        _running.server.shutdown()
        _running.server.server_close()
        _running = None
