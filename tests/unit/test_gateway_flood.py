"""The gateway as its container runs it (`entrypoint.main`: uvicorn with gateway/exposure's bounds),
in a process of its own whose file limit is 1,024, in front of a stub engine on loopback: a flood of
1,100 connections that never show a key leaves a keyed request answered (the client waits 10 s at
most), and a connection whose headers never finish is closed before a 60 s bound. Each waits on its
bound, never on a time of its own."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import httpx
import pytest
from gateway_fakes import KEY, Engine, Served, config, until

from sparkcluster.gateway import exposure

BEARER = {"Authorization": f"Bearer {KEY}"}
NOFILE = 1024
START = (
    "import resource, sys\n"
    f"resource.setrlimit(resource.RLIMIT_NOFILE, ({NOFILE}, {NOFILE}))\n"
    "from sparkcluster.gateway.entrypoint import main\n"
    "sys.exit(main(sys.argv[1]))\n"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    e = Engine(["vision"])
    s = Served(e.app())
    cfg = config({"vision@spark-b": (e, s)})
    cfg["port"] = free_port()
    path = tmp_path_factory.mktemp("gw") / "gateway.json"
    path.write_text(json.dumps(cfg))
    proc = subprocess.Popen([sys.executable, "-c", START, str(path)], stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{cfg['port']}"

    def serving() -> bool:
        try:
            got = httpx.get(f"{url}/gateway/status", headers=BEARER, timeout=5)
        except httpx.HTTPError:
            assert proc.poll() is None, "the gateway exited"
            return False
        return got.status_code == 200 and all(r["in_rotation"] for r in got.json()["routes"])

    until(serving, timeout=60, what="the gateway to serve")
    yield url, cfg["port"], e, proc
    proc.terminate()
    proc.wait(30)
    s.stop()


def files(proc: subprocess.Popen) -> int:
    """How many files the gateway's process holds open (its sockets among them)."""
    return len(os.listdir(f"/proc/{proc.pid}/fd"))


def test_a_flood_of_keyless_connections_leaves_a_keyed_request_answered(gateway):
    url, port, e, proc = gateway
    before = files(proc)
    flood = []
    try:
        for _ in range(1100):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            flood.append(s)
        got = httpx.post(f"{url}/v1/chat/completions", json={"model": "vision"}, headers=BEARER, timeout=10)
        assert got.status_code == 200 and got.json()["served_by"] == "vision"
        # the gateway holds at most its cap of them, and none past the head's deadline (a connection the
        # kernel's queue dropped during the burst never reached it: only its own files are counted)
        lim = exposure.Limits.from_config({}, nofile=NOFILE)
        assert lim.header_timeout_s < 60 and lim.unkeyed_connections + lim.backlog < NOFILE - exposure.RESERVED_FDS
        until(lambda: files(proc) <= before + lim.unkeyed_connections, timeout=60, what="the cap")
        until(lambda: files(proc) <= before + 1, timeout=60, what="the flood closed")
    finally:
        for s in flood:
            s.close()


def test_an_unfinished_header_is_closed_before_the_bound(gateway):
    url, port, e, _proc = gateway
    seen = len(e.seen)
    with socket.create_connection(("127.0.0.1", port), timeout=60) as c:
        c.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nX-Slow: ".encode())
        got = b""
        while chunk := c.recv(4096):  # a timeout here (60 s) fails the test
            got += chunk
    assert got.startswith(b"HTTP/1.1 408") and len(e.seen) == seen
