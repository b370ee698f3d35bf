"""Passing one request through to a deployment and its answer back, bytes untouched.

The body goes upstream as the client sent it; the answer's bytes come back as they arrive (no
buffering, so each SSE event reaches the client when the engine writes it; `aiter_raw`, so not even
a content encoding is undone). Only the key changes: the client's is checked here and never sent
on; the deployment's own `VLLM_API_KEY` goes upstream instead. A client that goes away (the
connection closes) cancels the upstream request at once, whether the answer was streaming or not
yet started, so an engine never keeps generating for nobody: vLLM aborts a request whose
connection closes.
"""

from __future__ import annotations

import json
import time

import anyio
import httpx

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


def error_body(status: int, message: str, kind: str, anthropic: bool) -> bytes:
    """An error in the shape the client's API uses: Anthropic's for /v1/messages, OpenAI's otherwise."""
    if anthropic:
        return json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()
    return json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()


async def send_error(send, status: int, message: str, kind: str, anthropic: bool, extra: dict | None = None) -> None:
    body = error_body(status, message, kind, anthropic)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), str(v).encode()) for k, v in (extra or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def forward(
    client: httpx.AsyncClient,
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
) -> str:
    """Send `body` to `route` and relay the answer; returns how it ended (the status code, or
    "disconnect" when the client went away first, or "upstream" when the deployment failed)."""
    qs = scope.get("query_string") or b""
    url = route.upstream + scope["path"] + (f"?{qs.decode('latin-1')}" if qs else "")
    req = client.build_request(
        scope["method"], url, content=body, headers=upstream_headers(scope["headers"], route.api_key)
    )
    started = time.monotonic()
    route.in_flight += 1
    metrics.in_flight.labels(model).inc()
    outcome, resp = "disconnect", None
    try:
        async with anyio.create_task_group() as tg:

            async def watch() -> None:  # the client leaving cancels everything below, upstream included
                while True:
                    if (await receive())["type"] == "http.disconnect":
                        tg.cancel_scope.cancel()
                        return

            tg.start_soon(watch)
            try:
                resp = await client.send(req, stream=True)
            except httpx.HTTPError as e:
                kind = "timeout" if isinstance(e, httpx.TimeoutException) else "connect"
                metrics.upstream_errors.labels(model, kind).inc()
                outcome = "502"
                await send_error(
                    send, 502, f"{route.key} did not answer: {type(e).__name__}", "upstream_error", anthropic
                )
                tg.cancel_scope.cancel()
                return outcome
            if resp.status_code >= 500:
                metrics.upstream_errors.labels(model, "http_5xx").inc()
            await send(
                {
                    "type": "http.response.start",
                    "status": resp.status_code,
                    "headers": downstream_headers(resp.headers.raw),
                }
            )
            first = True
            try:
                async for chunk in resp.aiter_raw():
                    if first:
                        metrics.first_byte.labels(model).observe(time.monotonic() - started)
                        first = False
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                outcome = str(resp.status_code)
            except httpx.HTTPError:  # the deployment broke off mid-answer: end what was sent
                metrics.upstream_errors.labels(model, "read").inc()
                outcome = "upstream"
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):  # closing is what tells the engine to abort
            if resp is not None:
                await resp.aclose()
        route.in_flight -= 1
        metrics.in_flight.labels(model).dec()
        metrics.requests.labels(model, endpoint, outcome).inc()
        metrics.latency.labels(model).observe(time.monotonic() - started)
    return outcome
