"""Passing one request through to a deployment and its answer back, bytes untouched.

The body goes upstream as the client sent it; the answer's bytes come back as they arrive (no
buffering, so each SSE event reaches the client when the engine writes it; `auto_decompress` off,
so not even a content encoding is undone). Only the key changes: the client's is checked here and
never sent on; the deployment's own `VLLM_API_KEY` goes upstream instead. A client that goes away
(the connection closes) cancels the upstream request at once, whether the answer was streaming or
not yet started, so an engine never keeps generating for nobody: vLLM aborts a request whose
connection closes.

The relay is aiohttp's client, not httpx (which the gateway's low-rate questions use): a streamed
answer is one small write per token, and on loopback with uvloop one relayed SSE event cost the
gateway 236 us of CPU through httpx (pure-Python h11 and anyio per chunk) against 84 us through
aiohttp (its C parser) and 48 us for a bare byte relay (perf/gateway.md). On the testbed the gateway
shares two cores with the engine it fronts, so that CPU is the engine's throughput. vLLM's image has
aiohttp (vLLM requires it).

An answer the deployment breaks off mid-body never looks finished: a streamed one gets an error event
in its API's shape (which OpenAI's and Anthropic's clients raise on), then the body is aborted
(`Broken`: the connection closes without the chunked body's last chunk), counted as an upstream
"read" error and journalled.
"""

from __future__ import annotations

import json
import time

import aiohttp
import anyio

from . import health
from .figures import Metrics
from .routes import Route

# never forwarded either way (RFC 9110 7.6.1 hop-by-hop, the length httpx recomputes, the keys)
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
}
CLIENT_KEYS = {"authorization", "x-api-key"}
# ASGI servers give header names in lower case (ASGI spec, HTTP connection scope)
_NOT_UPSTREAM = frozenset(k.encode() for k in HOP_BY_HOP | CLIENT_KEYS | {"content-length"})
_NOT_DOWNSTREAM = frozenset(k.encode() for k in HOP_BY_HOP)


def upstream_headers(raw: list[tuple[bytes, bytes]], api_key: str | None) -> list[tuple[bytes, bytes]]:
    out = [(k, v) for k, v in raw if k.lower() not in _NOT_UPSTREAM]
    if api_key:
        out.append((b"authorization", f"Bearer {api_key}".encode()))
    return out


def downstream_headers(raw: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in raw if k.lower() not in _NOT_DOWNSTREAM]


def error_body(status: int, message: str, kind: str, anthropic: bool, code: str | None = None) -> bytes:
    """An error in the shape the client's API uses: Anthropic's for /v1/messages, OpenAI's otherwise
    (`code`: OpenAI's error code where it has one, `model_not_found`, `rate_limit_exceeded`: its
    API reference's error object and its guide "Error codes"; else the status)."""
    if anthropic:
        return json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()
    return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code or status}}).encode()


async def send_error(
    send, status: int, message: str, kind: str, anthropic: bool, extra: dict | None = None, code: str | None = None
) -> None:
    body = error_body(status, message, kind, anthropic, code)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), str(v).encode()) for k, v in (extra or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class Broken(Exception):
    """The deployment broke off an answer already under way: the app leaves the body unfinished."""


def stream_error(message: str, anthropic: bool) -> bytes:
    """An SSE error event as the client's API sends one mid-stream."""
    if anthropic:
        return b"event: error\ndata: " + error_body(500, message, "api_error", True) + b"\n\n"
    return b"data: " + error_body(500, message, "upstream_error", False) + b"\n\n"


def relay_session() -> aiohttp.ClientSession:
    """The gateway's one session for relaying: no read timeout (a long generation may be silent for
    minutes in a prefill; a wedge is the supervisor's to find, and a client leaving cancels its
    request), 5 s to connect, no cap on connections, bytes left encoded, and no header of its own
    added beyond Host and the body's length (the client's go upstream as they came)."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=30),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=5.0),
        auto_decompress=False,
        skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
    )


async def forward(
    session: aiohttp.ClientSession,
    route: Route,
    scope,
    receive,
    send,
    body: bytes,
    *,
    metrics: Metrics,
    model: str,
    endpoint: str,
    anthropic: bool,
    meter=None,
    trace=None,
) -> str:
    """Send `body` to `route` and relay the answer; returns how it ended (the status code, or
    "disconnect" when the client went away first). Raises Broken when the deployment broke off
    mid-answer (counted as "upstream"), once the client has been told in the stream. A `meter`
    (gateway/metering) reads the answer's tokens as it passes and says what of it goes on; a
    `trace` (gateway/tracing) times the upstream call and puts its traceparent in the headers."""
    qs = scope.get("query_string") or b""
    url = route.upstream + scope["path"] + (f"?{qs.decode('latin-1')}" if qs else "")
    headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in upstream_headers(scope["headers"], route.api_key)]
    if trace is not None:
        headers = trace.upstream_headers(headers, url)
    started = time.monotonic()
    route.in_flight += 1
    metrics.in_flight.labels(model).inc()
    outcome, resp, whole, broken = "disconnect", None, False, ""
    try:
        async with anyio.create_task_group() as tg:

            async def watch() -> None:  # the client leaving cancels everything below, upstream included
                while True:
                    if (await receive())["type"] == "http.disconnect":
                        tg.cancel_scope.cancel()
                        return

            tg.start_soon(watch)
            try:
                resp = await session.request(scope["method"], url, data=body, headers=headers)
            except (aiohttp.ClientError, TimeoutError) as e:
                timed_out = isinstance(e, (TimeoutError, aiohttp.ServerTimeoutError))
                metrics.upstream_errors.labels(model, "timeout" if timed_out else "connect").inc()
                outcome = "502"
                if trace is not None:
                    trace.answered(502, relayed=False)
                await send_error(
                    send, 502, f"{route.key} did not answer: {type(e).__name__}", "upstream_error", anthropic
                )
                tg.cancel_scope.cancel()
                return outcome
            if resp.status >= 500:
                metrics.upstream_errors.labels(model, "http_5xx").inc()
            if trace is not None:
                trace.answered(resp.status)
            await send(
                {
                    "type": "http.response.start",
                    "status": resp.status,
                    "headers": downstream_headers(list(resp.raw_headers)),
                }
            )
            first, chunk = True, b""
            if meter is not None:
                meter.begin(resp.headers.get("content-type", ""), resp.headers.get("content-length"))
            try:
                async for chunk in resp.content.iter_any():
                    if first:
                        metrics.first_byte.labels(model).observe(time.monotonic() - started)
                        first = False
                    if meter is not None and not (chunk := meter.feed(chunk)):
                        continue
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                if meter is not None and (rest := meter.end()):
                    await send({"type": "http.response.body", "body": rest, "more_body": True})
                outcome, whole = str(resp.status), True
            except (aiohttp.ClientError, TimeoutError) as e:  # the deployment broke off mid-answer
                metrics.upstream_errors.labels(model, "read").inc()
                outcome, broken = "upstream", f"{type(e).__name__}"
                if "text/event-stream" in resp.headers.get("content-type", ""):
                    said = f"{route.key} broke off its answer ({broken})"
                    event = stream_error(said, anthropic)
                    if chunk and not chunk.endswith(b"\n\n"):  # an event cut short ends first, unparseable
                        event = b"\n\n" + event
                    await send({"type": "http.response.body", "body": event, "more_body": True})
            else:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            tg.cancel_scope.cancel()
    finally:
        if resp is not None:
            # an answer read to its end goes back to the pool; any other closes its connection, which
            # is what tells the engine to abort
            if whole:
                resp.release()
            else:
                resp.close()
        route.in_flight -= 1
        metrics.in_flight.labels(model).dec()
        metrics.requests.labels(model, endpoint, outcome).inc()
        metrics.latency.labels(model).observe(time.monotonic() - started)
        if meter is not None:
            meter.done(outcome)
        if trace is not None:
            trace.outcome = outcome
    if broken:
        health.event("stream broken", deployment=route.key, model=model, endpoint=endpoint, error=broken)
        raise Broken(route.key)
    return outcome
