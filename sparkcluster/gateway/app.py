"""The gateway as an ASGI app: the OpenAI and Anthropic routes passed through by `model`, the
merged `/v1/models`, the gateway's `/metrics`, its liveness (`/health`) and what it routes
(`/gateway/status`). The supervisor's verdicts are read every `poll_s`, and the config file is
read again when it changes, so `gateway up` with new routes replaces them without dropping a stream.

What answers what, before any upstream is asked: no key or a wrong one, 401; a body naming no model,
400; a model no deployment serves, 404 naming those that exist; every deployment serving it out of
rotation, 503 with Retry-After and the supervisor's reason. A deployment on demand and on standby is
woken by that request (its head agent's `POST /wake` with the deployment's wake token): 503 with
Retry-After until its supervisor says serving. A service's routes (issue 60: `/v1/audio/speech`,
`/v1/audio/transcriptions`, ...) go to the service answering them (routes.pick_path), whatever the
body's format (an upload is multipart). A deployment an upgrade holds (the config's
`held_until`, gateway/hold) takes no new request: one for it waits until the hold is released or its
deadline passes.

Who sent a request is its key's name (gateway/keys: `env:N` for GATEWAY_API_KEYS, the key file's
names for the others, read again when the file changes). A named key may be held to some models
(another is 404 in OpenAI's `model_not_found` shape, naming none of those served), to requests per
minute, in flight and tokens per day (gateway/quota: 429 in the client's shape with Retry-After);
what each request cost (the engine's own token counts, gateway/metering) goes into the usage ledger
in the gateway's folder (programs/gateway_usage) and into the metrics by key name. `/metrics` and
`/gateway/status` answer the controller's keys and admin keys only (403 to the others). `/console`
is the web console (gateway/console): its own session cookie, CSRF tokens and admin-only actions.

Where the config names an OTLP endpoint and the image has the OpenTelemetry SDK, each forwarded
request is a trace (gateway/tracing: its phases, never its body), its traceparent sent upstream.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time

import httpx
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route as Path

from ..programs.gateway_usage import FILENAME, USAGE_DIR, Ledger
from . import auth, exposure, health, metering, proxy, tracing
from .console import Console
from .figures import Metrics
from .health import REFUSED_REASON
from .keys import KEYS_FILE, Identity, Keyring
from .quota import Quota, Refusal
from .routes import Route, Table, Unavailable

# vLLM 0.32 serves every one of these itself, Anthropic's two included: nothing is translated
FORWARDED = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/embeddings",
    "/v1/messages",
    "/v1/messages/count_tokens",
)


HELD_LOOK_S = 0.25  # a held request looks for its deployment this often
OTHER_MODEL = "(other)"  # the metrics' label for every model name no deployment serves
WHO = "sparkcluster.key"  # the scope's entry for the request's key's owner (keys.Identity), once known
TRACE = "sparkcluster.trace"  # the scope's entry for the request's trace (gateway/tracing), where traces are on


def doc_of(body: bytes):
    """The body as JSON (None where it is not JSON), Unreadable where it is nested too deeply."""
    try:
        return json.loads(body)
    except RecursionError:
        raise Unreadable("the request body is nested too deeply") from None
    except ValueError:
        return None


class Unreadable(ValueError):
    """A JSON body nested deeper than the parser's recursion allows."""


def model_of(body: bytes) -> str | None:
    """The body's `model`, None where it names none or is no JSON; Unreadable where it is JSON
    nested too deeply to parse (Python's parser recurses per level)."""
    doc = doc_of(body)
    name = doc.get("model") if isinstance(doc, dict) else None
    return name if isinstance(name, str) and name else None


class Gateway:
    def __init__(self, cfg: dict, config_path: str | None = None):
        self.keys: list[str] = list(cfg.get("keys") or [])
        # the gateway's folder on its node (bound into its container): the key file and the usage ledger
        data = cfg.get("data") or None
        self.data = data  # the console reads the controller's records there (gateway/console)
        self.keyring = Keyring(self.keys, os.path.join(data, KEYS_FILE) if data else None)
        if data:
            os.makedirs(os.path.join(data, USAGE_DIR), mode=0o700, exist_ok=True)
        self.ledger = Ledger(
            os.path.join(data, USAGE_DIR) if data else None, int(cfg.get("usage_retention_days") or 400)
        )
        self.usage_path = os.path.join(data, USAGE_DIR, FILENAME) if data else None  # the console's usage page
        self.quota = Quota(self.ledger)
        self._pruned = time.monotonic()
        self.table = Table.from_config(cfg)
        self.poll_s = float(cfg.get("poll_s", 1.0))
        self.metrics = Metrics()
        # what a peer may hold (gateway/exposure): the config's `limits`, else the defaults and the file limit
        self.guard = exposure.Guard(exposure.Limits.from_config(cfg.get("limits") or {}))
        self.config_path = config_path
        self._config_mtime = self._mtime()
        # request traces (gateway/tracing): None where the config names no OTLP endpoint or the image lacks the SDK
        self.traces, self.traces_said = tracing.load(cfg)
        self.client: httpx.AsyncClient | None = None  # the supervisor's looks, /v1/models, wakes
        self.relay = None  # the requests passed through (proxy.relay_session)
        self._wakes: set[asyncio.Task] = set()  # on demand: wakes in flight (kept, or the loop drops them)
        self.yielding: dict[str, str] = {}  # woken deployment -> the rule's choice of who yields to it, in words
        self.alerts_url = cfg.get("alerts") or None  # Prometheus' alerts API, which the console shows
        self.console = Console(self)  # /console (gateway/console)

    # -- the supervisor's verdicts, and the config when it changes
    def _mtime(self) -> int | None:
        try:
            return os.stat(self.config_path).st_mtime_ns if self.config_path else None
        except OSError:
            return None

    def reload_if_changed(self) -> None:
        seen = self._mtime()
        if seen is None or seen == self._config_mtime:
            return
        try:
            with open(self.config_path) as f:
                cfg = json.load(f)
        except (OSError, ValueError):  # caught mid-write (it is renamed into place): the next look has it
            return
        self._config_mtime = seen
        self.keys = list(cfg.get("keys") or [])
        self.keyring.set_env(self.keys)
        self.table.adopt(Table.from_config(cfg))
        self.poll_s = float(cfg.get("poll_s", self.poll_s))
        self.alerts_url = cfg.get("alerts") or None
        health.event("config reloaded", routes=[r.key for r in self.table.routes])

    async def refresh(self) -> None:
        """One look at every deployment's supervisor; a change of rotation is journalled."""
        routes = list(self.table.routes)
        seen = [{} for _ in routes]
        verdicts = await asyncio.gather(*(health.look(self.client, r.supervisor, seen=s) for r, s in zip(routes, seen)))
        for r, v, s in zip(routes, verdicts, seen):
            r.report = s.get("report")
            if (r.up, r.reason) != (v.up, v.reason) and (r.up != v.up or not v.up):
                health.event(
                    "in rotation" if v.up else "out of rotation",
                    deployment=r.key,
                    models=list(r.names),
                    reason=v.reason,
                )
            r.up, r.reason, r.retry_after, r.wakeable = v.up, v.reason, v.retry_after, v.wake
            r.why, r.start_s = v.why, v.start_s
            if v.up:
                self.yielding.pop(r.key, None)  # it serves: what yielded to it is history
            for n in r.names:
                self.metrics.route_up.labels(n, r.key).set(1 if v.up else 0)

    async def _watch(self) -> None:
        while True:
            self.reload_if_changed()
            if self.keyring.reload_if_changed():
                health.event("keys reloaded", keys=self.keyring.names())
            try:  # the usage and the buckets since the last look, written off the event loop
                await asyncio.to_thread(self.ledger.write, self.ledger.take())
                if time.monotonic() - self._pruned > 3600:
                    self._pruned = time.monotonic()
                    await asyncio.to_thread(self.ledger.prune)
            except Exception as e:  # noqa: BLE001 (a full disk must not stop the routing)
                health.event("usage not written", error=f"{type(e).__name__}: {e}")
            try:
                await self.refresh()
            except Exception as e:  # noqa: BLE001 (a bug here must not stop the routing)
                health.event("health look failed", error=f"{type(e).__name__}: {e}")
            await asyncio.sleep(self.poll_s)

    @contextlib.asynccontextmanager
    async def lifespan(self, app):
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(10.0, connect=5.0))
        self.relay = proxy.relay_session()
        watcher = asyncio.create_task(self._watch())
        health.event("gateway started", routes=[r.key for r in self.table.routes], models=self.table.names())
        health.event("traces", state=self.traces_said)
        try:
            yield
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            await self.client.aclose()
            await self.relay.close()
            self.ledger.close()
            if self.traces is not None:  # the spans still queued go out (the exporter's own bound)
                await asyncio.to_thread(self.traces.shutdown)
            health.event("gateway stopped")

    # -- on demand
    def wake(self, model: str) -> list:
        """Wake the deployments on standby that serve `model` (one wake per route per look; the
        supervisor starts an engine once however many reach it). Returns those woken."""
        now = time.monotonic()
        picked = self.table.to_wake(model, now, self.poll_s)
        for r in picked:
            r.waking, r.woken_at = True, now
            self._task(self._wake(r))
            # its last start was refused for memory: an idle deployment on its nodes yields, by the
            # owner's rule (the inventory's [on_demand]), so that the next wake fits (issue 60)
            if r.reason.startswith(REFUSED_REASON) and (y := self.table.yielder(r, now, self.poll_s)) is not None:
                y.route.yield_asked = now
                self.yielding[r.key] = y.why
                self._task(self._yield(y, r))
        return picked

    def _task(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._wakes.add(task)
        task.add_done_callback(self._wakes.discard)

    async def _yield(self, y, woken) -> None:
        """Ask the chosen deployment's head agent to stop its engine and go back on standby."""
        v = y.route
        try:
            got = await self.client.post(
                v.supervisor.rstrip("/") + "/yield", headers={"authorization": f"Bearer {v.wake_token}"}, timeout=3.0
            )
            outcome = str(got.status_code)
        except httpx.HTTPError as e:
            outcome = f"error: {type(e).__name__}"
        health.event("asked to yield", deployment=v.key, to=woken.key, why=y.why, outcome=outcome)

    async def _wake(self, r) -> None:
        try:
            got = await self.client.post(
                r.supervisor.rstrip("/") + "/wake", headers={"authorization": f"Bearer {r.wake_token}"}, timeout=3.0
            )
            outcome = str(got.status_code)
        except httpx.HTTPError as e:
            outcome = f"error: {type(e).__name__}"
        finally:
            r.waking = False
        r.wake_denied = outcome in ("401", "403")  # holding a request for it would be in vain
        self.metrics.wakes.labels(r.key, "error" if outcome.startswith("error") else outcome).inc()
        health.event("woken on demand" if outcome == "202" else "wake refused", deployment=r.key, outcome=outcome)

    async def hold_for_start(self, model: str, picked: Unavailable):
        """Models taking turns on one node: a request for a deployment that starts on demand (on
        standby, refused while an idle one yields to it by the owner's rule, or starting) is held
        while it starts, rather than answered 503: the wake is repeated at every look, the yield
        asked as `wake` asks it, and the request goes on once the supervisor says serving. Bounded
        by the start the profile allows (its ready_timeout_s); then, or at once for a deployment not
        on demand, the Unavailable it was. Returns what the request goes to."""
        bound = self.table.starting_on_demand(model)
        if not bound:
            return picked
        t0 = time.monotonic()
        while isinstance(picked, Unavailable) and time.monotonic() - t0 < bound:
            await asyncio.sleep(HELD_LOOK_S)
            self.wake(model)
            picked = self.table.pick(model, time.time())
            if isinstance(picked, Unavailable) and not self.table.starting_on_demand(model):
                break  # gone final, or out of the gateway's config
        waited = round(time.monotonic() - t0, 1)
        served = not isinstance(picked, Unavailable) and picked is not None
        self.metrics.held_for_start.labels("served" if served else "timed out").inc()
        health.event("held for a start on demand", model=model, waited_s=waited, served=served)
        return picked

    def unavailable(self, model: str, picked: Unavailable, woken: list) -> str:
        """The 503's message: why each deployment serving `model` is out, that a start on demand was
        asked for, and what else is in rotation on the nodes of one on standby (what may hold the
        memory a refused start needed)."""
        said = f"model '{model}' is unavailable: " + "; ".join(picked.reasons)
        if woken:
            said += f"; starting on demand ({', '.join(r.key for r in woken)}): retry after {picked.retry_after}s"
        for r in self.table.serving(model):
            if r.key in self.yielding:
                said += f"; to make room, an idle deployment yields ({self.yielding[r.key]})"
            near = self.table.neighbours(r) if r.wakeable else []
            if near:
                said += f"; in rotation on {', '.join(r.nodes)}: " + ", ".join(
                    f"{n.key} ({', '.join(n.names)})" for n in near
                )
        return said

    # -- the routes
    def authorized(self, scope, headers) -> Identity | None:
        """Whose key the request shows (None: no valid one); its connection is then no longer capped
        as a keyless one (gateway/exposure), and the scope carries who it is (WHO)."""
        who = self.keyring.identify(auth.presented(headers))
        if who is None:
            return None
        self.guard.keyed(scope.get("client"))
        scope[WHO] = who
        return who

    def operator(self, request: Request) -> Response | None:
        """None where the request's key may read the gateway's own pages; else the refusal."""
        who = self.authorized(request.scope, request.headers)
        if who is None:
            return _refusal(401, "missing or wrong API key", "authentication_error", False)
        if not who.operator:
            return _refusal(403, "this key may not read the gateway's own pages", "permission_error", False)
        return None

    def label(self, model: str) -> str:
        """The metrics' label for a model name a client chose: itself where a deployment serves it
        (or none was given), else one label for all the others, so that no client grows the series."""
        return model if not model or model in self.table.names() else OTHER_MODEL

    async def models(self, request: Request) -> Response:
        who = self.authorized(request.scope, request.headers)
        if who is None:
            return _refusal(401, "missing or wrong API key", "authentication_error", False)
        up = [r for r in self.table.routes if r.up and not r.paths]  # a service lists no models of its own

        async def listed(r) -> list[dict]:
            try:
                got = await self.client.get(
                    f"{r.upstream}/v1/models",
                    headers={"authorization": f"Bearer {r.api_key}"} if r.api_key else {},
                    timeout=3.0,
                )
                got.raise_for_status()
                return [m for m in got.json().get("data", []) if isinstance(m, dict) and "id" in m]
            except (httpx.HTTPError, ValueError, AttributeError):
                return []

        seen: dict[str, dict] = {}
        for entries in await asyncio.gather(*(listed(r) for r in up)):
            for m in entries:
                seen.setdefault(m["id"], m)
        data = [
            seen.pop(n, {"id": n, "object": "model", "created": 0, "owned_by": "sparkcluster"})
            for n in self.table.names()
        ]
        listed = [m for m in data + list(seen.values()) if who.may_use(m["id"])]  # a key held to some: those
        return JSONResponse({"object": "list", "data": listed})

    async def status(self, request: Request) -> Response:
        if (refused := self.operator(request)) is not None:
            return refused
        return JSONResponse(
            {
                "models": self.table.names(),
                "routes": [
                    {
                        "deployment": r.key,
                        "models": list(r.names),
                        "upstream": r.upstream,
                        "in_rotation": r.up,
                        "reason": r.reason,
                        "in_flight": r.in_flight,
                        "on_demand": r.wake_token is not None,
                        **({"paths": list(r.paths)} if r.paths else {}),
                        "held_s": max(0.0, round(r.held_until - time.time(), 1)),
                    }
                    for r in self.table.routes
                ],
                "traces": self.traces_said,
            }
        )

    async def metrics_page(self, request: Request) -> Response:
        """The gateway's figures, to a key (the monitoring stack's scrape carries one: monitor/scrape)."""
        if (refused := self.operator(request)) is not None:
            return refused
        return Response(self.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def alive(self, request: Request) -> Response:
        """Liveness, and each model name with whether a deployment serving it is in rotation: no
        key, no reason (those are `/gateway/status`'s), as much as `/metrics` shows already."""
        up = {n: any(r.up for r in self.table.serving(n)) for n in self.table.names()}
        return JSONResponse({"status": "ok", "models": up})

    # -- what both forwarders do: refuse, read the body, pass the request on
    async def refuse(
        self,
        send,
        endpoint: str,
        model: str,
        status: int,
        message: str,
        kind: str,
        anthropic: bool,
        extra=None,
        who: Identity | None = None,
        code: str | None = None,
    ) -> None:
        """Answers `status` with `message` in the client's error shape (proxy.send_error, its
        headers `extra`), counted in the gateway's requests under `model` and `endpoint`, and as an
        error of the key's (`who`) where it showed one."""
        await proxy.send_error(send, status, message, kind, anthropic, extra, code)
        self.metrics.requests.labels(self.label(model), endpoint, str(status)).inc()
        if who is not None:
            self.account(who, model, str(status), None)

    def account(self, who: Identity, model: str, outcome: str, meter) -> None:
        """One request of `who`'s into the ledger and the metrics: its tokens (the meter's, as the
        engine reported them), whether it failed, its time to the first byte where it streamed."""
        prompt, completion = meter.tokens() if meter is not None else (0, 0)
        # a client that left is no error of the gateway's or the engine's (its tokens are unknown: 0)
        error = outcome != "disconnect" and not (outcome.isdigit() and int(outcome) < 400)
        ttft = meter.ttft_s if meter is not None and meter.streamed else None
        self.ledger.record(who.name, self.label(model), time.time(), prompt, completion, error, ttft)
        self.metrics.key_requests.labels(who.name, outcome).inc()
        if prompt:
            self.metrics.key_tokens.labels(who.name, "prompt").inc(prompt)
        if completion:
            self.metrics.key_tokens.labels(who.name, "completion").inc(completion)

    async def not_served(self, send, endpoint: str, model: str, who: Identity, anthropic: bool) -> None:
        """404 for a model a key held to some may not use, or no deployment serves: OpenAI's
        `model_not_found` ("The model ... does not exist or you do not have access to it", its
        guide "Error codes") or Anthropic's `not_found_error`; neither names the models there are."""
        if anthropic:
            said = f"model: {model}"
        else:
            said = f"The model `{model}` does not exist or you do not have access to it."
        kind = "not_found_error" if anthropic else "invalid_request_error"
        await self.refuse(send, endpoint, model, 404, said, kind, anthropic, who=who, code="model_not_found")

    async def over_limit(self, send, endpoint: str, model: str, who: Identity, refused, anthropic: bool) -> None:
        """429 with Retry-After, in OpenAI's shape (code `rate_limit_exceeded`, type `requests` or
        `tokens`, as its guide "Error codes" and its rate-limit errors show) or Anthropic's
        (`rate_limit_error`, its API docs' "Errors" and "Rate limits")."""
        kind = "rate_limit_error" if anthropic else ("tokens" if refused.limit == "tokens_per_day" else "requests")
        extra = {"Retry-After": refused.retry_after}
        await self.refuse(
            send, endpoint, model, 429, refused.message, kind, anthropic, extra, who=who, code="rate_limit_exceeded"
        )

    def metered(self, who: Identity, model: str, body: bytes, doc, endpoint: str):
        """The request admitted within its key's limits: the body to send (usage asked for on a stream)
        and its meter, which settles the request (its key's count in flight, the ledger, the metrics)
        when proxy.forward ends, however it ends; else the quota's Refusal. Settled there, not in a
        coroutine around the relay's: that would be one more frame on every resume of a stream."""
        refused = self.quota.admit(who, time.time())
        if refused is not None:
            return refused
        body, asked = metering.prepare(body, doc, endpoint)

        def settle(outcome: str) -> None:
            self.quota.done(who)
            self.account(who, model, outcome, meter)

        meter = metering.Meter(asked, settle=settle)
        return body, meter

    async def request_body(
        self, scope, receive, send, endpoint: str, anthropic: bool, upload: bool = False
    ) -> bytes | None:
        """The request's body once its API key is right and it is within the route's limit (a
        service's route, where uploads go, has its own); None when it was refused (401, 413) or its
        client left before the body was in. Nothing is sent upstream before this returns a body."""
        request = Request(scope, receive)
        if not self.authorized(scope, request.headers):
            said, headers = "missing or wrong API key", {"WWW-Authenticate": "Bearer"}
            await self.refuse(send, endpoint, "", 401, said, "authentication_error", anthropic, headers)
            return None
        limit = self.guard.limits.upload_bytes if upload else self.guard.limits.body_bytes
        try:
            declared = int(request.headers.get("content-length") or 0)
        except ValueError:
            declared = 0
        if declared > limit:
            return await self.too_large(send, endpoint, limit, anthropic)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return await self.too_large(send, endpoint, limit, anthropic)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        self.guard.received(scope.get("client"))
        return b"".join(chunks)

    async def too_large(self, send, endpoint: str, limit: int, anthropic: bool) -> None:
        """413, before the rest of the body is read; the connection closes after it (what is left
        of the body is never read)."""
        said = f"the request body is larger than this route's limit of {limit} bytes"
        kind = "request_too_large" if anthropic else "invalid_request_error"
        await self.refuse(send, endpoint, "", 413, said, kind, anthropic, {"Connection": "close"})

    async def unreadable(self, send, endpoint: str, e: Unreadable, anthropic: bool) -> None:
        await self.refuse(send, endpoint, "", 400, f"{e}: it is not read", "invalid_request_error", anthropic)

    def forward(
        self,
        picked: Route,
        scope,
        receive,
        send,
        body: bytes,
        model: str,
        endpoint: str,
        anthropic: bool,
        meter=None,
        trace=None,
    ):
        """proxy.forward to `picked`, counted under `model` and `endpoint`, `picked` marked used now (on
        demand's "lru" rule, issue 60). It returns proxy.forward's coroutine for the forwarder to
        await: a coroutine of its own would be one more frame on every resume of a streamed relay
        (app: what frames cost the relay)."""
        picked.last_used = time.monotonic()
        return proxy.forward(
            self.relay,
            picked,
            scope,
            receive,
            send,
            body,
            metrics=self.metrics,
            model=model,
            endpoint=endpoint,
            anthropic=anthropic,
            meter=meter,
            trace=trace,
        )

    def forwarder(self, endpoint: str):
        anthropic = endpoint.startswith("/v1/messages")

        async def app(scope, receive, send) -> None:
            body = await self.request_body(scope, receive, send, endpoint, anthropic)
            if body is None:
                return
            if (trace := scope.get(TRACE)) is not None:
                trace.received(scope.get(WHO))
            try:
                doc = doc_of(body)
            except Unreadable as e:
                await self.unreadable(send, endpoint, e, anthropic)
                return
            model = doc.get("model") if isinstance(doc, dict) else None
            if not isinstance(model, str) or not model:
                await proxy.send_error(send, 400, "the request body names no model", "invalid_request_error", anthropic)
                return
            if trace is not None:
                trace.model(model)
            who: Identity = scope[WHO]
            if not who.may_use(model):
                await self.not_served(send, endpoint, model, who, anthropic)
                return
            picked = self.table.pick(model, time.time())
            while isinstance(picked, Unavailable) and picked.held_until > time.time():
                # held by an upgrade: wait for the release (or the hold's end), then go on as usual
                await asyncio.sleep(HELD_LOOK_S)
                picked = self.table.pick(model, time.time())
            if picked is None and who.models:  # a key held to some models learns of no other
                await self.not_served(send, endpoint, model, who, anthropic)
                return
            if picked is None:
                names = ", ".join(self.table.names()) or "none"
                said = f"model '{model}' is not served here; models: {names}"
                await self.refuse(send, endpoint, model, 404, said, "not_found_error", anthropic, who=who)
                return
            # the key's limits before any wake: a request its key may not make starts no model
            got = self.metered(who, model, body, doc, endpoint)
            if isinstance(got, Refusal):
                await self.over_limit(send, endpoint, model, who, got, anthropic)
                return
            if isinstance(picked, Unavailable):
                woken = self.wake(model)
                picked = await self.hold_for_start(model, picked)
                if picked is None:  # the config changed while it was held: no deployment serves it now
                    self.quota.done(who)  # out of flight; `refuse` puts it in the ledger as the 404 it is
                    said = f"model '{model}' is no longer served here"
                    await self.refuse(send, endpoint, model, 404, said, "not_found_error", anthropic, who=who)
                    return
            if isinstance(picked, Unavailable):
                self.quota.done(who)
                said = self.unavailable(model, picked, woken)
                kind = "overloaded_error" if anthropic else "service_unavailable"
                extra = {"Retry-After": picked.retry_after}
                await self.refuse(send, endpoint, model, 503, said, kind, anthropic, extra, who=who)
                return
            if trace is not None:
                trace.admitted(picked, got[1])
            await self.forward(picked, scope, receive, send, got[0], model, endpoint, anthropic, got[1], trace)

        return app

    def service_forwarder(self, endpoint: str):
        """A service's route (issue 60): by path, then by the model a JSON body names, if any."""

        async def app(scope, receive, send) -> None:
            body = await self.request_body(scope, receive, send, endpoint, False, upload=True)
            if body is None:
                return
            if (trace := scope.get(TRACE)) is not None:
                trace.received(scope.get(WHO))
            try:
                model = model_of(body)
            except Unreadable as e:
                await self.unreadable(send, endpoint, e, False)
                return
            picked = self.table.pick_path(endpoint, model, time.time())
            if picked is None:  # the config changed under the request: no service answers it now
                said = f"no service answers {endpoint} here"
                await self.refuse(send, endpoint, model or "", 404, said, "not_found_error", False)
                return
            if isinstance(picked, Unavailable):
                said = f"{endpoint} is unavailable: " + "; ".join(picked.reasons)
                extra = {"Retry-After": picked.retry_after}
                await self.refuse(send, endpoint, model or "", 503, said, "service_unavailable", False, extra)
                return
            label = self.label(model or "") or (picked.names[0] if picked.names else picked.key)
            if trace is not None:
                trace.model(model or label)
            who: Identity = scope[WHO]
            if not who.may_use(model or label):
                await self.not_served(send, endpoint, model or label, who, False)
                return
            got = self.metered(who, label, body, None, endpoint)
            if isinstance(got, Refusal):
                await self.over_limit(send, endpoint, label, who, got, False)
                return
            if trace is not None:
                trace.admitted(picked, got[1])
            await self.forward(picked, scope, receive, send, got[0], label, endpoint, False, got[1], trace)

        return app

    def app(self):
        """The ASGI app uvicorn serves. A POST to a forwarded path goes to its forwarder straight from
        the server; everything else (the gateway's own pages, another method or path, the lifespan)
        goes through Starlette, which answers them (404 and 405 in the client's error shape; no
        redirect for a trailing slash, which Starlette builds from the Host header). Every request
        tells the guard when the app has it and when it is answered (gateway/exposure). Starlette's
        routing and its two middlewares in front of the relay add nothing a forwarded request uses,
        yet each streamed event passed through their `send` wrappers and
        resumed the relay through their frames: without them the gateway spent 10-14 % less CPU per
        event and 12-21 % less per short request, measured beside the previous app in one run
        (perf/gateway.md, "What costs most in the relay path")."""
        paths = [
            Path("/health", self.alive, methods=["GET"]),
            Path("/metrics", self.metrics_page, methods=["GET"]),
            Path("/v1/models", self.models, methods=["GET"]),
            Path("/gateway/status", self.status, methods=["GET"]),
            *self.console.routes(),
            *(Path(p, _Asgi(self.forwarder(p)), methods=["POST"]) for p in FORWARDED),
        ]
        rest = Starlette(routes=paths, lifespan=self.lifespan, exception_handlers={HTTPException: _http_error})
        rest.router.redirect_slashes = False
        forwarded = {p: self.forwarder(p) for p in FORWARDED}
        services: dict[str, object] = {}  # a service's route's forwarder, made when first asked (routes reload)
        guard = self.guard
        traced = self.traced if self.traces is not None else None

        async def app(scope, receive, send) -> None:
            if scope["type"] != "http":  # the lifespan
                await rest(scope, receive, send)
                return
            client = scope.get("client")
            guard.begin(client)
            try:
                if scope["method"] == "POST" and not scope.get("root_path"):
                    path = scope["path"]
                    forward = forwarded.get(path)
                    if forward is None and path in self.table.paths():
                        forward = services.get(path) or services.setdefault(path, self.service_forwarder(path))
                    if forward is not None:
                        if traced is None:
                            await forward(scope, receive, send)
                        else:
                            await traced(forward, path, scope, receive, send)
                        return
                if scope["method"] != "POST":  # the gateway's own pages read no body
                    guard.received(client)
                await rest(scope, receive, send)
            except proxy.Broken:
                # the upstream broke off mid-answer: returning with the body unfinished makes uvicorn
                # close the connection without the chunked body's last chunk, so the client sees an
                # aborted answer, never a complete one (proxy.forward sent the error event first)
                return
            finally:
                guard.end(client)

        return app

    async def traced(self, forward, path: str, scope, receive, send) -> None:
        """`forward` with the request's trace (gateway/tracing) in its scope, the status it answered
        read on the way out. Traces on cost a frame and a call per event relayed; off, nothing."""
        trace = self.traces.begin(scope, path)
        scope[TRACE] = trace

        async def sending(message) -> None:
            trace.sent(message)
            await send(message)

        try:
            await forward(scope, receive, sending)
        except BaseException as e:
            trace.finish(e)
            raise
        trace.finish()


class _Asgi:
    """An ASGI callable Starlette mounts as it is (a plain function would be taken for a
    request -> response endpoint)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        await self.app(scope, receive, send)


async def _http_error(request: Request, exc: HTTPException) -> Response:
    """Starlette's 404 and 405 (a path or method the gateway has not) in the client's error shape."""
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    anthropic = request.url.path.startswith("/v1/messages")
    out = _refusal(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", kind, anthropic)
    out.headers.update(exc.headers or {})
    return out


def _refusal(status: int, message: str, kind: str, anthropic: bool) -> Response:
    return Response(
        proxy.error_body(status, message, kind, anthropic),
        status_code=status,
        media_type="application/json",
        headers={"WWW-Authenticate": "Bearer"} if status == 401 else None,
    )
