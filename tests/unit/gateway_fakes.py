"""Stand-ins for the gateway's tests: engines and supervisor reports as small Starlette apps, each
served by a real uvicorn on 127.0.0.1 in a thread, and the gateway itself served the same way."""

from __future__ import annotations

import asyncio
import gzip
import json
import threading
import time
from dataclasses import dataclass, field

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from sparkcluster.gateway.app import FORWARDED, Gateway
from sparkcluster.node import contract

KEY = "client-key-0123456789"
OTHER_KEY = "second-client-key-987"
GZIPPED = gzip.compress(b'{"served_by": "an encoded answer"}', mtime=0)


def until(check, timeout: float = 10.0, what: str = "a condition"):
    """Wait for `check()` to be truthy (a condition, never a fixed sleep); its value."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


class Served:
    """An ASGI app served by uvicorn on 127.0.0.1 (a free port) in a thread."""

    def __init__(self, app, graceful_s: int | None = None):
        self.server = uvicorn.Server(
            uvicorn.Config(
                app, host="127.0.0.1", port=0, log_level="warning", timeout_graceful_shutdown=graceful_s, lifespan="on"
            )
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        until(lambda: self.server.started, what="uvicorn to start")
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


@dataclass
class Engine:
    """A stand-in for one deployment's vLLM (the routes the gateway forwards, and /v1/models) and
    for its head agent's report (GET /report), whose supervisor state the test sets."""

    names: list[str]
    seen: list[dict] = field(default_factory=list)  # every request: path, body bytes, headers
    state: str = contract.SERVING
    causes: list[dict] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)  # lets a held stream finish
    cancelled: threading.Event = field(default_factory=threading.Event)  # a stream was cut off
    finished: threading.Event = field(default_factory=threading.Event)  # a stream ran to its end
    # on demand: the head agent's POST /wake as the supervisor answers it (the token it wants, every
    # wake it got, the starts it made: one per wake that found it on standby)
    wake_token: str | None = None
    refusal: str = ""
    wakes: list[str] = field(default_factory=list)
    yields: list[str] = field(default_factory=list)  # every POST /yield's token (issue 60)
    starts: int = 0
    # the profile's start bound as its supervisor's policy carries it (node/contract.Policy's default):
    # how long the gateway holds a request that woke it
    ready_timeout_s: float = 1800.0
    admits: bool = True  # False: a wake on REFUSED is refused again (the memory still held), as the supervisor's

    def app(self) -> Starlette:
        async def forwarded(request: Request):
            body = await request.body()
            self.seen.append({"path": request.url.path, "body": body, "headers": dict(request.headers)})
            doc = json.loads(body)
            if doc.get("gzip"):  # an answer in a content encoding: the gateway passes its bytes as they are
                return Response(GZIPPED, headers={"content-type": "application/json", "content-encoding": "gzip"})
            if doc.get("stream"):
                return StreamingResponse(self.stream(doc), media_type="text/event-stream")
            return JSONResponse({"path": request.url.path, "model": doc["model"], "served_by": self.names[0]})

        async def models(request: Request):
            return JSONResponse(
                {"object": "list", "data": [{"id": n, "object": "model", "max_model_len": 1024} for n in self.names]}
            )

        async def report(request: Request):
            sup = {
                "state": self.state,
                "updated": time.time(),
                "causes": self.causes,
                "policy": {"interval_s": 2.0, "ready_timeout_s": self.ready_timeout_s},
                "memory_unknown": {},
                **({"refusal": self.refusal} if self.refusal else {}),
            }
            return JSONResponse({"node": "n", "ts": time.time(), "supervisor": sup})

        async def wake(request: Request):
            scheme, _, token = request.headers.get("authorization", "").partition(" ")
            self.wakes.append(token)
            if self.wake_token is None or scheme.lower() != "bearer" or token != self.wake_token:
                return JSONResponse({"error": "missing or wrong wake token"}, status_code=401)
            if self.state in contract.WAKEABLE:  # the supervisor's rule: a wake on standby starts it
                if not self.admits:
                    self.state = contract.REFUSED
                    return JSONResponse({"state": self.state}, status_code=202)
                self.state, self.starts = contract.STARTING, self.starts + 1
            return JSONResponse({"state": self.state}, status_code=202)

        async def yield_(request: Request):  # the supervisor's rule: an idle engine on demand goes to standby
            scheme, _, token = request.headers.get("authorization", "").partition(" ")
            self.yields.append(token)
            if self.wake_token is None or scheme.lower() != "bearer" or token != self.wake_token:
                return JSONResponse({"error": "missing or wrong wake token"}, status_code=401)
            if self.state == contract.SERVING:
                self.state = contract.STANDBY
            return JSONResponse({"state": self.state}, status_code=202)

        routes = [Route(p, forwarded, methods=["POST"]) for p in FORWARDED]

        async def alive(request: Request):  # vLLM's /health, which the real supervisor reads
            return JSONResponse({})

        routes += [Route("/v1/models", models), Route("/report", report), Route("/report/wake", wake, methods=["POST"])]
        routes += [Route("/report/yield", yield_, methods=["POST"])]
        routes += [Route("/health", alive)]
        return Starlette(routes=routes)

    async def stream(self, doc: dict):
        try:
            yield f"data: {json.dumps({'model': doc['model'], 'n': 1})}\n\n".encode()
            while not self.release.is_set():  # held until the test has seen the first event
                await asyncio.sleep(0.01)
            yield b'data: {"n": 2}\n\n'
            yield b"data: [DONE]\n\n"
            self.finished.set()
        except BaseException:
            self.cancelled.set()
            raise


def config(engines: dict[str, tuple[Engine, Served]], **extra) -> dict:
    return {
        "host": "127.0.0.1",
        "port": 0,
        "keys": [KEY, OTHER_KEY],
        "poll_s": 0.05,
        "drain_s": 5,
        "deployments": [
            {
                "key": key,
                "names": e.names,
                "upstream": s.url,
                "supervisor": f"{s.url}/report",
                "api_key": f"upstream-key-of-{key}",
            }
            for key, (e, s) in engines.items()
        ],
        **extra,
    }


def start_gateway(cfg: dict, config_path: str | None = None, graceful_s: int | None = None) -> tuple[Gateway, Served]:
    gw = Gateway(cfg, config_path)
    return gw, Served(gw.app(), graceful_s=graceful_s)


def in_rotation(gw: Gateway, key: str, up: bool = True) -> bool:
    return any(r.key == key and r.up is up for r in gw.table.routes)
