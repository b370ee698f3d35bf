"""The testbed's model hub: serves the tiny model (and a `retrained` branch of it whose answers differ), a gated copy of it, copies of it as a separate
tokenizer repository and a draft model (issue 24), a synthetic repo of a few hundred MB, and a stand-in of the dataset nvidia/SPEED-Bench
(issue 58, speed_bench.py) on the controller's LAN address; huggingface_hub reaches it through HF_ENDPOINT (the
inventory's `hf_endpoint`). See server.py for the protocol and why it is not an existing mirror.

`start_hub` runs it as its own process (like the pip mirror, so it outlives the command that
started the testbed) and returns its pid and endpoint; `stop_hub(pid)` stops it. `knobs` and
`stats` reach a running hub over HTTP (faults, slowness, the byte counter). `serve_in_thread`
is for tests that want it inside their own process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from pathlib import Path

from . import speed_bench
from .server import (
    Hub,
    Repo,
    large_repo,
    make_server,
    retrained_copy,
    scale_repo,
    serve_forever_in_thread,
    synthetic_repo,
)

TINY = "sparkcluster/testbed-tiny"
# a branch of the tiny model whose weights differ (its output rows reversed): another revision of the
# same repository, whose greedy answers the canary must tell from main's (issue 38)
RETRAINED = "retrained"
GATED = "sparkcluster/testbed-tiny-gated"
SYNTHETIC = "sparkcluster/testbed-synthetic"
# issue 40: weights at scale, several GB of random (incompressible) safetensors shards, served by a
# hub of its own that the bench starts (perf/weights_scale.py), not by the testbed's
SCALE = "sparkcluster/testbed-weights-scale"
SCALE_PORT = 3143
# issue 24: repositories a profile needs beside its model. Both hold the tiny model's files: a separate
# tokenizer repository is, like seed 004's Qwen/Qwen3.6-35B-A3B, a whole model of which the tokenizer
# needs only the small files; the draft stands in for a speculative-decoding drafter.
TOKENIZER = "sparkcluster/testbed-tiny-tokenizer"
DRAFT = "sparkcluster/testbed-tiny-draft"
# issue 52: a model sized for a 128 GB Spark (nemotron3-super-nvfp4-single's weights are about 75 GB):
# the tiny model's config.json with 75 GB of sparse shards, listed, never downloaded
LARGE = "sparkcluster/testbed-large"
LARGE_BYTES = 75 * 10**9
GRANTED_TOKEN = "hf_testbed_granted_0123456789"  # accepted for the gated repo
REFUSED_TOKEN = "hf_testbed_not_granted_987654"  # a valid-looking token without access
HUB_IP, HUB_PORT = "198.18.0.1", 3142  # next to the pip mirror (3141) on the controller's LAN address
ENDPOINT = f"http://{HUB_IP}:{HUB_PORT}"
INVENTORY_LINE = f'hf_endpoint = "{ENDPOINT}"'  # for the testbed's [cluster] table
REPO_ROOT = Path(__file__).resolve().parents[3]


def build_hub(
    model_dir: Path,
    state_dir: Path,
    *,
    synthetic_mb: int = 300,
    tiny_sha: str | None = None,
    scale_mb: int = 0,
    retrained: bool = True,
    large: bool = False,
) -> Hub:
    """`retrained`: serve the tiny model's `retrained` branch, made from `model_dir`'s
    model.safetensors (which must then be one with an `lm_head.weight`)."""
    memo = state_dir / "hashes"
    branches = {}
    if retrained:
        branches[RETRAINED] = Repo(TINY, retrained_copy(model_dir, state_dir / RETRAINED), memo_dir=memo).load()
    repos = [
        Repo(TINY, model_dir, memo_dir=memo, sha=tiny_sha or "", branches=branches).load(),
        Repo(GATED, model_dir, gated=True, memo_dir=memo).load(),
        Repo(TOKENIZER, model_dir, memo_dir=memo).load(),
        Repo(DRAFT, model_dir, memo_dir=memo).load(),
    ]
    if synthetic_mb:
        repos.append(Repo(SYNTHETIC, synthetic_repo(state_dir / "synthetic", synthetic_mb), memo_dir=memo).load())
    if large:
        big = large_repo(state_dir / "large", model_dir / "config.json", LARGE_BYTES)
        repos.append(Repo(LARGE, big, memo_dir=memo).load())
    if scale_mb:
        repos.append(Repo(SCALE, scale_repo(state_dir / "scale", scale_mb), memo_dir=memo).load())
    # issue 58: the dataset the shipped records were measured on, a stand-in (speed_bench.py)
    dataset = Repo(speed_bench.REPO, speed_bench.standin(state_dir / "speed-bench"), memo_dir=memo).load()
    return Hub(repos, {GRANTED_TOKEN}, [dataset])


@dataclass
class Running:
    hub: Hub
    server: ThreadingHTTPServer

    @property
    def endpoint(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def serve_in_thread(
    model_dir: Path,
    state_dir: Path,
    host: str = "127.0.0.1",
    port: int = 0,
    synthetic_mb: int = 300,
    retrained: bool = False,
) -> Running:
    """The hub in this process; the `retrained` branch only when asked (a test's model files are
    often not a real safetensors file)."""
    srv = make_server(build_hub(model_dir, state_dir, synthetic_mb=synthetic_mb, retrained=retrained), host, port)
    serve_forever_in_thread(srv)
    return Running(srv.RequestHandlerClass.hub, srv)


@dataclass
class HubProcess:
    pid: int
    endpoint: str


def start_hub(
    host: str = HUB_IP,
    port: int = HUB_PORT,
    *,
    model_dir: Path | None = None,
    state_dir: Path | None = None,
    synthetic_mb: int = 300,
    log_path: Path | None = None,
    timeout: float = 120.0,
    scale_mb: int = 0,
    large: bool = False,
) -> HubProcess:
    """Start the hub as a process of its own; returns once it answers. Defaults: the tiny model
    artifacts.py built, state (hash memo, the synthetic repo) in the testbed cache."""
    from .. import artifacts

    model_dir = model_dir or artifacts.model_dir()
    state_dir = state_dir or artifacts.CACHE / "hub"
    argv = [
        sys.executable,
        "-m",
        "tests.testbed.hub",
        "--host",
        host,
        "--port",
        str(port),
        "--model-dir",
        str(model_dir),
        "--state-dir",
        str(state_dir),
        "--synthetic-mb",
        str(synthetic_mb),
        "--tiny-sha",
        artifacts.TINY_REVISION,
        "--scale-mb",
        str(scale_mb),
        *(["--large"] if large else []),
    ]
    logf = open(log_path, "ab") if log_path else subprocess.DEVNULL
    p = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True, cwd=str(REPO_ROOT)
    )
    endpoint = f"http://{host}:{port}"
    deadline = time.monotonic() + timeout  # the first start hashes the synthetic repo once
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise RuntimeError(f"the testbed hub exited with {p.returncode} (log: {log_path})")
        try:
            stats(endpoint)
            return HubProcess(p.pid, endpoint)
        except OSError:
            time.sleep(0.2)
    stop_hub(p.pid)
    raise RuntimeError(f"the testbed hub did not answer at {endpoint} within {timeout:.0f}s")


def stop_hub(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass


def stats(endpoint: str) -> dict:
    """bytes_served, requests, and each repo's commit and size."""
    with urllib.request.urlopen(f"{endpoint}/_hub/stats", timeout=5) as r:
        return json.load(r)


def knobs(endpoint: str, **values) -> dict:
    """Set faults on a running hub: fail_after (bytes into a file) + fail_times, fail_status (e.g.
    500), rate_bps, bytes_served=0 to reset the counter, reset=True for all."""
    req = urllib.request.Request(
        f"{endpoint}/_hub/knobs",
        data=json.dumps(values).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.load(r)
