"""The web console at `/console`, served by the gateway's own app (same port, same TLS; no daemon
of its own): the cluster at a glance, a model's live figures and log, the journal, the key's usage,
and the owner's actions, each through a head agent's token endpoint as a wake is.

Who: a gateway key (gateway/keys) is entered once, on the sign-in form; the console answers with a
session cookie (random, 256 bits; HttpOnly, SameSite=Strict, Secure where the gateway serves TLS,
Path=/console) and keeps the key itself nowhere (only its SHA-256). A session lives SESSION_S, and
ends at once when its key no longer opens the gateway (revoked, rotated, expired); its rights are
read from the key file as they are at each request. Every form that changes
something (an action, signing out) carries the session's CSRF token, compared in constant time;
a request whose Origin is another site's is refused too. Only admin keys act and read the journal
and the engines' logs; the controller's keys (`GATEWAY_API_KEYS`) and the other named keys see the
cluster, the models and their own usage (the controller's keys, which read `/metrics`, every key's).

What the console makes the cluster do: each page's live part (Server-Sent Events) is built from what
the gateway already reads every poll (the head agents' reports); a model's page reads that model's
engines' `/metrics` at most once every FIGURES_S, whoever watches, and its log at most once every
LOG_S. The actions: a restart (`POST /restart` on the deployment's head agent), a return to standby
(`POST /standby`) and a wake (`POST /wake`), with the deployment's token from the gateway's config
and the key's name in `X-Sparkcluster-By`: the head's agent journals it, and so does the gateway.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import os
import secrets
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route as Path_

from ..node.journal import read_json
from . import console_view
from .health import event
from .keys import Identity, digest

COOKIE = "sparkcluster_console"
SESSION_S = 12 * 3600
MAX_SESSIONS = 256  # past this, the oldest session ends (a browser signs in again)
FIGURES_S = 2.0  # an engine's /metrics read at most this often for the console
LOG_S = 2.0
ALERTS_S = 10.0  # Prometheus' alerts read at most this often
JOURNAL_S = 3.0  # a live events page reads the heads' journals at most this often
NODE_S = 5.0  # a head agent's own /metrics (GPU power, the fabric test) read at most this often
LIVE_S = 1.0
STREAM_S = 15.0  # one live stream's life, well inside the gateway's drain (drain_s, 30 s by default)
RETRY_MS = 1000  # the live stream's look at the gateway's snapshot (it is re-read every poll)
ASSETS = Path(__file__).parent / "console_assets"
RECORDS = "records"  # in the gateway's folder: the controller's copies (deployment/head_records.RECORDS)
SPEED_RUNS = 10  # bench runs the speed page shows, newest first
ASSET_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8", ".txt": "text/plain"}
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


@dataclass
class Session:
    who: Identity  # as of the last request (read again from the keyring at each)
    key_sha256: str  # the key's hash: the key itself is kept nowhere
    csrf: str
    expires: float
    notice: str = ""  # what the last action's answer was, shown once on the next cluster page


# what each action does, in the words a dry run would print (the confirm page shows them)
def words(action: str, key: str, nodes: tuple[str, ...]) -> list[str]:
    head = nodes[0] if nodes else "its head"
    if action == "restart":
        return [
            f"ask the supervisor on {head} (its agent's POST /restart) to restart vllm serve of {key}",
            "the supervisor stops the engine (SIGTERM, then SIGKILL after its stop grace); requests in flight fail",
            "the gateway takes it out of rotation until the supervisor says serving again",
            "the supervisor waits until the engine's memory is back on every node, then starts it",
            "the restart is journalled with your key's name; it does not count against the restart limit",
        ]
    if action == "standby":
        return [
            f"ask the supervisor on {head} (its agent's POST /standby) to stop vllm serve of {key}",
            "the engine stops (requests in flight fail); its container stays, and it is back on standby",
            "the next request for its models (or a wake here) starts it again",
        ]
    if action == "wake":
        return [
            f"ask the supervisor on {head} (its agent's POST /wake) to start vllm serve of {key} on standby",
            "the start is admitted only if every node has the profile's memory headroom",
            "the gateway puts it in rotation once the supervisor says serving",
        ]
    return []


ACTIONS = ("restart", "standby", "wake")


class Console:
    def __init__(self, gateway):
        self.gw = gateway
        self.sessions: dict[str, Session] = {}
        self.figures: dict[str, tuple[float, dict, console_view.Figures]] = {}  # key -> (read at, samples, figures)
        self.logs: dict[str, tuple[float, list[str]]] = {}
        self.nodes: dict[str, tuple[float, dict]] = {}
        self.alerts: tuple[float, list[dict] | None] = (
            float("-inf"),
            None,
        )  # head agent's URL -> (read at, node_figures)
        self._reading: dict[str, asyncio.Lock] = {}

    # -- sessions
    def session(self, request: Request) -> tuple[str, Session] | None:
        sid = request.cookies.get(COOKIE)
        if not sid:
            return None
        s = self.sessions.get(sid)
        now = time.time()
        who = self.gw.keyring.holder(s.key_sha256, now) if s is not None and s.expires >= now else None
        if who is None:
            self.sessions.pop(sid, None)
            return None
        s.who = who
        self.gw.guard.keyed(request.scope.get("client"))
        return sid, s

    def open(self, who: Identity, key: str) -> tuple[str, Session]:
        now = time.time()
        for sid in [k for k, s in self.sessions.items() if s.expires < now]:
            del self.sessions[sid]
        while len(self.sessions) >= MAX_SESSIONS:
            del self.sessions[min(self.sessions, key=lambda k: self.sessions[k].expires)]
        sid = secrets.token_urlsafe(32)
        self.sessions[sid] = Session(who, digest(key), secrets.token_urlsafe(32), now + SESSION_S)
        return sid, self.sessions[sid]

    @staticmethod
    def admin(s: Session) -> bool:
        return s.who.admin

    @staticmethod
    def same_site(request: Request) -> bool:
        """A form's Origin (where the browser sends one) is this gateway's own."""
        origin = request.headers.get("origin")
        if not origin or origin == "null":
            return origin is None
        return urllib.parse.urlsplit(origin).netloc == request.headers.get("host", "")

    @staticmethod
    def csrf_ok(s: Session, given: str | None) -> bool:
        return bool(given) and hmac.compare_digest(given.encode(), s.csrf.encode())

    def html(self, text: str, status: int = 200, **kw) -> HTMLResponse:
        return HTMLResponse(text, status_code=status, headers=HEADERS, **kw)

    def to_login(self) -> Response:
        return RedirectResponse("/console/login", status_code=303, headers=HEADERS)

    def refuse(self, status: int, said: str, s: Session | None = None) -> HTMLResponse:
        body = f"<p class='error' role='alert'>{console_view.esc(said)}</p>"
        body += "<p><a href='/console'>Back to the console</a></p>"
        who = s.who.name if s else None
        return self.html(console_view.page("Refused", body, who, s.csrf if s else "", bool(s and s.who.admin)), status)

    # -- the routes
    def routes(self) -> list:
        return [
            Path_("/console", self.cluster, methods=["GET"]),
            Path_("/console/login", self.login_form, methods=["GET"]),
            Path_("/console/login", self.login, methods=["POST"]),
            Path_("/console/logout", self.logout, methods=["POST"]),
            Path_("/console/live", self.live_cluster, methods=["GET"]),
            Path_("/console/model/{name}", self.model, methods=["GET"]),
            Path_("/console/live/model/{name}", self.live_model, methods=["GET"]),
            Path_("/console/events", self.events, methods=["GET"]),
            Path_("/console/live/events", self.live_events, methods=["GET"]),
            Path_("/console/usage", self.usage, methods=["GET"]),
            Path_("/console/print", self.printable, methods=["GET"]),
            Path_("/console/speed", self.speed, methods=["GET"]),
            Path_("/console/upgrades", self.upgrades, methods=["GET"]),
            Path_("/console/confirm", self.confirm, methods=["GET"]),
            Path_("/console/action", self.action, methods=["POST"]),
            Path_("/console/static/{name}", self.asset, methods=["GET"]),
        ]

    async def asset(self, request: Request) -> Response:
        name = request.path_params["name"]
        path = ASSETS / name
        if "/" in name or name.startswith(".") or path.suffix not in ASSET_TYPES or not path.is_file():
            return Response("not found", status_code=404, media_type="text/plain")
        headers = {"X-Content-Type-Options": "nosniff", "Cache-Control": "max-age=300"}
        return Response(path.read_bytes(), media_type=ASSET_TYPES[path.suffix], headers=headers)

    async def login_form(self, request: Request) -> Response:
        if self.session(request) is not None:
            return RedirectResponse("/console", status_code=303, headers=HEADERS)
        return self.html(console_view.login())

    async def form(self, request: Request) -> dict:
        """The form's fields (a small urlencoded body), the connection told it is in."""
        body = await request.body()
        self.gw.guard.received(request.scope.get("client"))
        if len(body) > 16 * 1024:
            return {}
        return {k: v[-1] for k, v in urllib.parse.parse_qs(body.decode(errors="replace")).items()}

    async def login(self, request: Request) -> Response:
        fields = await self.form(request)
        if not self.same_site(request):
            return self.html(console_view.login("this form was sent from another site"), 403)
        key = (fields.get("key") or "").strip()
        who = self.gw.keyring.identify(key or None)
        if who is None:
            event("console sign-in refused", client=(request.scope.get("client") or ("?",))[0])
            return self.html(console_view.login("that key is not one of this gateway's"), 401)
        self.gw.guard.keyed(request.scope.get("client"))
        sid, _ = self.open(who, key)
        event("console sign-in", key=who.name)
        out = RedirectResponse("/console", status_code=303, headers=HEADERS)
        out.set_cookie(
            COOKIE,
            sid,
            max_age=SESSION_S,
            path="/console",
            httponly=True,
            secure=request.url.scheme == "https",
            samesite="strict",
        )
        return out

    async def logout(self, request: Request) -> Response:
        fields = await self.form(request)
        got = self.session(request)
        if got is None:
            return self.to_login()
        sid, s = got
        if not self.same_site(request) or not self.csrf_ok(s, fields.get("csrf")):
            return self.refuse(403, "the form's CSRF token is missing or wrong", s)
        self.sessions.pop(sid, None)
        out = RedirectResponse("/console/login", status_code=303, headers=HEADERS)
        out.delete_cookie(COOKIE, path="/console")
        return out

    async def cluster(self, request: Request) -> Response:
        got = self.session(request)
        if got is None:
            return self.to_login()
        _, s = got
        said, s.notice = s.notice, ""  # the session's, never the URL's: no link can put words on the page
        parts = await self.live_parts(s.who.admin)
        return self.html(console_view.cluster(parts, s.who.name, s.csrf, s.who.admin, said, self.gw.table.routes))

    async def printable(self, request: Request) -> Response:
        got = self.session(request)
        if got is None:
            return self.to_login()
        _, s = got
        parts = await self.live_parts(False)
        return self.html(console_view.printable(parts, s.who.name, s.csrf, s.who.admin))

    def stream(self, request: Request, parts) -> Response:
        """Server-Sent Events: `parts()` (element id -> HTML) every LIVE_S, sent only when changed. A
        stream ends after STREAM_S and the browser opens the next after RETRY_MS (EventSource's own
        reconnection), so that no open console holds the gateway's drain on stop for long."""

        async def events():
            last, ends = None, time.monotonic() + STREAM_S
            yield f"retry: {RETRY_MS}\n\n".encode()
            while time.monotonic() < ends:
                if await request.is_disconnected():
                    return
                got = await parts()
                text = json.dumps(got, sort_keys=True)
                if text != last:
                    last = text
                    yield f"data: {text}\n\n".encode()
                else:
                    yield b": still here\n\n"
                await asyncio.sleep(LIVE_S)

        headers = {**HEADERS, "X-Accel-Buffering": "no"}
        return StreamingResponse(events(), media_type="text/event-stream", headers=headers)

    async def live_cluster(self, request: Request) -> Response:
        got = self.session(request)
        if got is None:
            return Response(status_code=401)
        _, s = got

        async def parts():
            if self.session(request) is None:
                return {}
            return await self.live_parts(s.who.admin)

        return self.stream(request, parts)

    async def node_figures(self) -> dict[str, dict]:
        """Each deployment's head node's GPU power and last fabric test, from its agent's `/metrics`
        (what Prometheus scrapes there), read at most once every NODE_S whoever watches."""
        out: dict[str, dict] = {}
        for r in self.gw.table.routes:
            node = (r.report or {}).get("node")
            base = r.supervisor.rstrip("/")
            if not node or node in out:
                continue
            at, figs = self.nodes.get(base, (0.0, {}))
            if time.monotonic() - at >= NODE_S:
                try:
                    got = await self.gw.client.get(f"{base}/metrics", timeout=2.0)
                    got.raise_for_status()
                    figs = console_view.node_figures(got.text)
                except Exception:  # noqa: BLE001 (an agent that does not answer shows as no figures)
                    figs = {}
                self.nodes[base] = (time.monotonic(), figs)
            out[node] = figs
        return out

    async def firing(self) -> list[dict] | None:
        """The alerts firing in Prometheus (its `/api/v1/alerts`), at most once every ALERTS_S; None
        where no Prometheus answers (monitoring not up)."""
        url = self.gw.alerts_url
        at, found = self.alerts
        if not url or time.monotonic() - at < ALERTS_S:
            return found
        try:
            got = await self.gw.client.get(url, timeout=2.0)
            got.raise_for_status()
            found = [a for a in got.json()["data"]["alerts"] if isinstance(a, dict) and a.get("state") == "firing"]
        except Exception:  # noqa: BLE001 (no monitoring, or it does not answer: said on the page)
            found = None
        self.alerts = (time.monotonic(), found)
        return found

    async def live_parts(self, admin: bool) -> dict[str, str]:
        figs, alerts = await self.node_figures(), await self.firing()
        return console_view.cluster_live(self.gw.table.routes, time.time(), admin, figs, alerts)

    # -- a model
    def serving(self, name: str) -> list:
        return [r for r in self.gw.table.routes if name in r.names]

    async def read_figures(self, routes) -> dict[str, console_view.Figures]:
        out = {}
        for r in routes:
            lock = self._reading.setdefault(r.key, asyncio.Lock())
            async with lock:  # one read per FIGURES_S however many pages watch
                at, before, figs = self.figures.get(r.key, (0.0, None, console_view.Figures()))
                now = time.monotonic()
                if now - at >= FIGURES_S:
                    try:
                        got = await self.gw.client.get(
                            f"{r.upstream}/metrics",
                            headers={"authorization": f"Bearer {r.api_key}"} if r.api_key else {},
                            timeout=2.0,
                        )
                        got.raise_for_status()
                        seen = console_view.samples(got.text)
                        figs = console_view.figures(seen, before, now - at if before is not None else 0)
                        figs.read_at = time.time()
                    except Exception as e:  # noqa: BLE001 (an engine down is shown, never a 500)
                        seen, figs = None, console_view.Figures(error=f"{type(e).__name__}")
                    self.figures[r.key] = (now, seen, figs)
                out[r.key] = self.figures[r.key][2]
        return out

    async def agent_get(self, r, path: str, query: dict) -> dict | None:
        if not r.agent_token:
            return None
        base = r.supervisor.rstrip("/")
        try:
            got = await self.gw.client.get(
                f"{base}{path}", params=query, headers={"authorization": f"Bearer {r.agent_token}"}, timeout=3.0
            )
            got.raise_for_status()
            doc = got.json()
            return doc if isinstance(doc, dict) else None
        except Exception:  # noqa: BLE001 (an agent that does not answer shows as nothing read)
            return None

    async def read_logs(self, routes) -> dict[str, list[str]]:
        out = {}
        for r in routes:
            at, lines = self.logs.get(r.key, (0.0, []))
            if time.monotonic() - at >= LOG_S:
                doc = await self.agent_get(r, "/log", {"lines": "120"})
                lines = [str(x) for x in (doc or {}).get("lines", [])] if doc else ["(the head's agent did not answer)"]
                self.logs[r.key] = (time.monotonic(), lines)
            out[r.key] = lines
        return out

    async def journal(self, routes, since: float, limit: int = 300) -> list[dict]:
        got = await asyncio.gather(
            *(self.agent_get(r, "/journal", {"since": str(since), "limit": str(limit)}) for r in routes)
        )
        out = []
        for r, doc in zip(routes, got):
            for e in (doc or {}).get("entries", []):
                if isinstance(e, dict):
                    out.append({**e, "deployment": r.key})
        return sorted(out, key=lambda e: float(e.get("ts") or 0), reverse=True)[:limit]

    async def model(self, request: Request) -> Response:
        got = self.session(request)
        if got is None:
            return self.to_login()
        _, s = got
        name = request.path_params["name"]
        routes = self.serving(name)
        if not routes or not s.who.may_use(name):
            return self.refuse(404, f"no deployment serves {name}", s)
        figs = await self.read_figures(routes)
        log = await self.read_logs(routes) if s.who.admin else None
        events = await self.journal(routes, time.time() - 3600, 30) if s.who.admin else None
        return self.html(
            console_view.model(name, routes, figs, log, events, time.time(), s.who.name, s.csrf, s.who.admin)
        )

    async def live_model(self, request: Request) -> Response:
        got = self.session(request)
        if got is None:
            return Response(status_code=401)
        _, s = got
        name = request.path_params["name"]
        if not self.serving(name) or not s.who.may_use(name):
            return Response(status_code=404)

        async def parts():
            if self.session(request) is None:
                return {}
            routes = self.serving(name)
            figs = await self.read_figures(routes)
            log = await self.read_logs(routes) if s.who.admin else None
            return console_view.model_live(name, routes, figs, log, time.time())

        return self.stream(request, parts)

    # -- events, usage
    async def events(self, request: Request) -> Response:
        got = self.session(request)
        if got is None:
            return self.to_login()
        _, s = got
        if not s.who.admin:
            return self.refuse(403, "only an admin key reads the journal", s)
        chosen = chosen_filter(request.query_params)
        entries = await self.filtered(chosen)
        keys = [r.key for r in self.gw.table.routes]
        return self.html(console_view.events(entries, keys, chosen, s.who.name, s.csrf))

    async def filtered(self, chosen: dict) -> list[dict]:
        """The journal entries the filter chose, newest first, from each deployment's head."""
        routes = [r for r in self.gw.table.routes if not chosen["deployment"] or r.key == chosen["deployment"]]
        entries = await self.journal(routes, time.time() - float(chosen["minutes"]) * 60, 1000)
        if chosen["kind"]:
            entries = [e for e in entries if chosen["kind"].lower() in str(e.get("event", "")).lower()]
        return entries

    async def live_events(self, request: Request) -> Response:
        got = self.session(request)
        if got is None or not got[1].who.admin:
            return Response(status_code=401 if got is None else 403)
        chosen = chosen_filter(request.query_params)
        read = {"at": float("-inf"), "parts": {}}

        async def parts():
            if self.session(request) is None:
                return {}
            if time.monotonic() - read["at"] >= JOURNAL_S:  # the heads' journals, at most every JOURNAL_S
                read["at"] = time.monotonic()
                read["parts"] = {"journal": console_view.events_table(await self.filtered(chosen))}
            return read["parts"]

        return self.stream(request, parts)

    async def usage(self, request: Request) -> Response:
        got = self.session(request)
        if got is None:
            return self.to_login()
        _, s = got
        everyone = s.who.operator
        path = self.gw.usage_path
        found = []
        if path and os.path.exists(path):
            from ..programs.gateway_usage import rows

            found = await asyncio.to_thread(rows, path, int(time.time()) - 24 * 3600, None if everyone else s.who.name)
        return self.html(console_view.usage(found, everyone, s.who.name, s.csrf, s.who.admin))

    # -- speed and upgrades: the controller's records, copied into the gateway's folder (deployment/head_records)
    def records(self, *parts: str) -> str | None:
        return os.path.join(self.gw.data, RECORDS, *parts) if self.gw.data else None

    async def speed(self, request: Request) -> Response:
        got = self.session(request)
        if got is None:
            return self.to_login()
        _, s = got
        runs = await asyncio.to_thread(_read_runs, self.records("bench"), SPEED_RUNS)
        return self.html(console_view.speed(runs, s.who.name, s.csrf, s.who.admin))

    async def upgrades(self, request: Request) -> Response:
        got = self.session(request)
        if got is None:
            return self.to_login()
        _, s = got
        path = self.records("upgrades.json")
        history = await asyncio.to_thread(read_json, path) if path else None
        return self.html(console_view.upgrades(history or {}, s.who.name, s.csrf, s.who.admin))

    # -- actions
    def route(self, key: str):
        return next((r for r in self.gw.table.routes if r.key == key), None)

    async def confirm(self, request: Request) -> Response:
        got = self.session(request)
        if got is None:
            return self.to_login()
        _, s = got
        if not s.who.admin:
            return self.refuse(403, "only an admin key acts from the console", s)
        action, key = request.query_params.get("action", ""), request.query_params.get("deployment", "")
        r = self.route(key)
        if action not in ACTIONS or r is None:
            return self.refuse(404, "no such action or deployment", s)
        return self.html(console_view.confirm(action, key, words(action, key, tuple(r.nodes)), s.who.name, s.csrf))

    async def action(self, request: Request) -> Response:
        fields = await self.form(request)
        got = self.session(request)
        if got is None:
            return self.refuse(401, "sign in first: no session")
        _, s = got
        if not self.same_site(request) or not self.csrf_ok(s, fields.get("csrf")):
            event("console action refused", key=s.who.name, why="csrf")
            return self.refuse(403, "the form's CSRF token is missing or wrong", s)
        if not s.who.admin:
            event("console action refused", key=s.who.name, why="not an admin key")
            return self.refuse(403, "only an admin key acts from the console", s)
        action, key = fields.get("action", ""), fields.get("deployment", "")
        r = self.route(key)
        if action not in ACTIONS or r is None:
            return self.refuse(404, "no such action or deployment", s)
        token = (r.wake_token if action == "wake" else r.agent_token) or r.agent_token
        if not token:
            return self.refuse(409, f"the gateway holds no token for {key}: sparkcluster gateway up hands it over", s)
        try:
            answer = await self.gw.client.post(
                r.supervisor.rstrip("/") + f"/{action}",
                headers={"authorization": f"Bearer {token}", "x-sparkcluster-by": s.who.name},
                timeout=5.0,
            )
            outcome, said = str(answer.status_code), _said(answer)
        except Exception as e:  # noqa: BLE001 (an agent that does not answer is said, not a 500)
            outcome, said = "error", type(e).__name__
        event("console action", key=s.who.name, action=action, deployment=key, outcome=outcome)
        done = outcome == "202"
        text = f"{action} of {key}: " + (
            "asked; the supervisor acts on it now" if done else f"refused ({outcome}: {said})"
        )
        s.notice = text
        return RedirectResponse("/console", status_code=303, headers=HEADERS)


def chosen_filter(q) -> dict:
    """The events page's filter from its query: a deployment, words in the event, the last minutes."""
    chosen = {k: str(q.get(k, ""))[:200] for k in ("deployment", "kind", "minutes")}
    try:
        minutes = max(1.0, min(float(chosen["minutes"] or 60), 7 * 24 * 60))
    except ValueError:
        minutes = 60.0
    chosen["minutes"] = f"{minutes:g}"
    return chosen


def _read_runs(folder: str | None, most: int) -> list[dict]:
    """The newest `most` bench summaries in `folder` (by name: each is its run's UTC time)."""
    if not folder or not os.path.isdir(folder):
        return []
    names = sorted((n for n in os.listdir(folder) if n.endswith(".json")), reverse=True)[:most]
    return [d for d in (read_json(os.path.join(folder, n)) for n in names) if d is not None]


def _said(answer) -> str:
    try:
        doc = answer.json()
        return str(doc.get("error") or doc.get("state") or "")
    except Exception:  # noqa: BLE001
        return ""
