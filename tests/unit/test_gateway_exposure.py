"""What a peer on the LAN can do to the gateway (and to the node agent's report server), in process
on loopback in front of stub engines: oversized and deeply nested bodies, a Host header the
trailing-slash redirect would have echoed, a flood of model names in the metrics, `/metrics` without
a key, an engine that breaks its stream under the real OpenAI client, a flood of idle connections
on the agent. The connection flood and the unfinished headers against the gateway as its container
runs it (a process of its own, its file limit at 1,024) are test_gateway_flood's."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import urllib.request

import httpx
import openai
import pytest
from gateway_fakes import KEY, Engine, Served, config, in_rotation, start_gateway, until
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from sparkcluster.gateway import exposure
from sparkcluster.gateway.app import OTHER_MODEL
from sparkcluster.node import memreport

BEARER = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture
def one():
    e = Engine(["vision"])
    s = Served(e.app())
    gw, sg = start_gateway(config({"vision@spark-b": (e, s)}))
    until(lambda: in_rotation(gw, "vision@spark-b"), what="in rotation")
    yield gw, sg, e
    sg.stop()
    s.stop()


def test_a_body_over_the_routes_limit_is_413_in_the_clients_shape_and_never_forwarded(one):
    gw, sg, e = one
    limit = gw.guard.limits.body_bytes
    # declared too large: refused on its Content-Length, before a byte of it is read
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {300 * 1024 * 1024}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", sg.port), timeout=30) as c:
        c.sendall(head.encode() + b'{"model": "vision", "x": "' + b"a" * 65536)
        got = b""
        while chunk := c.recv(65536):  # the gateway closes the connection after its answer
            got += chunk
    status, _, body = got.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 413") and b"connection: close" in status.lower()
    assert json.loads(body)["error"]["type"] == "invalid_request_error"
    # sent chunked, no length said: refused once the bytes read pass the limit (Anthropic's shape here)
    big = b'{"model": "vision", "x": "' + b"a" * (limit + 1) + b'"}'
    r = httpx.post(
        f"{sg.url}/v1/messages",
        content=iter([big[i : i + 1 << 20] for i in range(0, len(big), 1 << 20)]),
        headers={"x-api-key": KEY},
        timeout=60,
    )
    assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"
    assert e.seen == []  # the stub engine received nothing
    ok = httpx.post(f"{sg.url}/v1/chat/completions", json={"model": "vision"}, headers=BEARER, timeout=30)
    assert ok.status_code == 200 and len(e.seen) == 1


def test_deep_json_is_a_400_and_a_trailing_slash_redirects_nowhere(one):
    _gw, sg, e = one
    deep = '{"model": "vision", "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    r = httpx.post(f"{sg.url}/v1/chat/completions", content=deep, headers=BEARER, timeout=30)
    assert r.status_code == 400 and "nested too deeply" in r.json()["error"]["message"] and e.seen == []
    r = httpx.post(f"{sg.url}/v1/messages", content=deep, headers={"x-api-key": KEY}, timeout=30)
    assert r.status_code == 400 and r.json()["type"] == "error"
    r = httpx.get(f"{sg.url}/health/", headers={"Host": "attacker.example"}, timeout=30)
    assert r.status_code == 404 and "location" not in r.headers
    assert r.json()["error"]["type"] == "not_found_error"
    r = httpx.get(f"{sg.url}/v1/messages", headers={"x-api-key": KEY}, timeout=30)
    assert r.status_code == 405 and r.json()["type"] == "error"  # Anthropic's shape on its route


def test_unknown_model_names_add_no_label_and_metrics_take_a_key(one):
    _gw, sg, _e = one
    assert httpx.get(f"{sg.url}/metrics", timeout=30).status_code == 401
    series = lambda: {  # noqa: E731 (every series' name and labels, values left out)
        line.rpartition(" ")[0]
        for line in httpx.get(f"{sg.url}/metrics", headers=BEARER, timeout=30).text.splitlines()
        if not line.startswith("#")
    }
    with httpx.Client(base_url=sg.url, headers=BEARER, timeout=30) as c:
        assert c.post("/v1/chat/completions", json={"model": "the-first-unknown"}).status_code == 404
        before = series()
        for i in range(500):
            assert c.post("/v1/chat/completions", json={"model": f"made-up-{i:03d}"}).status_code == 404
    after = series()
    assert after == before and not [s for s in after if "made-up" in s or "the-first-unknown" in s]
    assert (
        f'sparkcluster_gateway_requests_total{{code="404",endpoint="/v1/chat/completions",model="{OTHER_MODEL}"}}'
        in after
    )


class Breaking:
    """An engine that sends two events of a stream, then breaks off (its connection closes mid-body)."""

    def __init__(self):
        self.sent = 0

    def app(self) -> Starlette:
        async def chat(request: Request):
            doc = await request.json()

            async def events():
                for n in range(2):
                    chunk = {
                        "id": "c",
                        "object": "chat.completion.chunk",
                        "created": 0,
                        "model": doc["model"],
                        "choices": [{"index": 0, "delta": {"content": f"part {n}"}, "finish_reason": None}],
                    }
                    self.sent += 1
                    yield f"data: {json.dumps(chunk)}\n\n".encode()
                    await asyncio.sleep(0)
                raise ConnectionResetError("the engine died mid-stream")

            return StreamingResponse(events(), media_type="text/event-stream")

        async def report(request: Request):
            import time

            from gateway_fakes import contract

            sup = {
                "state": contract.SERVING,
                "updated": time.time(),
                "causes": [],
                "policy": {"interval_s": 2.0},
                "memory_unknown": {},
            }
            return starlette_json({"node": "n", "ts": time.time(), "supervisor": sup})

        return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]), Route("/report", report)])


def starlette_json(doc):
    from starlette.responses import JSONResponse

    return JSONResponse(doc)


def test_a_stream_the_engine_breaks_raises_in_the_openai_client_counted_and_journalled(capsys):
    b = Breaking()
    s = Served(b.app())
    cfg = config({})
    cfg["deployments"] = [
        {
            "key": "vision@spark-b",
            "names": ["vision"],
            "upstream": s.url,
            "supervisor": f"{s.url}/report",
            "api_key": "k",
        }
    ]
    gw, sg = start_gateway(cfg)
    try:
        until(lambda: in_rotation(gw, "vision@spark-b"), what="in rotation")
        client = openai.OpenAI(base_url=f"{sg.url}/v1", api_key=KEY, max_retries=0, timeout=30)
        got = []
        with pytest.raises((openai.APIError, httpx.HTTPError)):
            for chunk in client.chat.completions.create(
                model="vision", messages=[{"role": "user", "content": "hi"}], stream=True
            ):
                got.append(chunk.choices[0].delta.content)
        assert got == ["part 0", "part 1"]
        metrics = httpx.get(f"{sg.url}/metrics", headers=BEARER, timeout=30).text
        assert 'sparkcluster_gateway_upstream_errors_total{kind="read",model="vision"} 1.0' in metrics
        until(lambda: '"event": "stream broken"' in capsys.readouterr().out, what="the journal's line")
    finally:
        sg.stop()
        s.stop()


def test_the_limits_follow_the_file_limit_and_only_the_knobs_the_uvicorn_found_takes():
    lim = exposure.Limits.from_config({}, nofile=1024)
    assert (
        lim.max_connections == (1024 - exposure.RESERVED_FDS) // 2
        and lim.unkeyed_connections == lim.max_connections // 2
    )
    assert exposure.Limits.from_config({"unkeyed_connections": 7}, nofile=1024).unkeyed_connections == 7

    class OldConfig:  # a uvicorn before 0.18: no h11_max_incomplete_event_size, no server_header
        def __init__(
            self,
            app,
            host="127.0.0.1",
            port=8000,
            limit_concurrency=None,
            timeout_keep_alive=5,
            proxy_headers=True,
            http="auto",
        ):
            pass

    got = exposure.server_options(exposure.Guard(lim), OldConfig)
    assert set(got) == {"http", "timeout_keep_alive", "limit_concurrency", "proxy_headers"}
    assert got["proxy_headers"] is False and got["limit_concurrency"] > lim.max_connections


def test_the_agents_report_server_bounds_and_times_out_its_connections():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    base = threading.active_count()
    httpd = memreport.serve_reports("127.0.0.1", port, lambda: {"mem_available": 5})
    try:
        idle = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(400)]
        # the oldest are closed as newer come: the server's threads stay near its cap
        until(lambda: len(httpd.open) <= memreport.CONNECTIONS, timeout=30, what="the cap")
        until(lambda: threading.active_count() <= base + memreport.CONNECTIONS + 3, timeout=30, what="threads")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as r:
            assert json.loads(r.read())["mem_available"] == 5
        for c in idle:  # every idle connection is closed by the server, within its bound
            assert c.recv(1) == b""
            c.close()
    finally:
        httpd.shutdown()
        httpd.server_close()
