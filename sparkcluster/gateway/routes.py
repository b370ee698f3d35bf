"""The routing table: which deployments serve which model name, and which of them takes a request.

A deployment answers to every name vLLM serves it under (`served_name` and the profile's aliases
are all `--served-model-name`s), so the request body reaches it untouched and vLLM accepts the name
it was asked for. Two deployments serving one name are replicas: a request goes to the one in
rotation with the fewest requests in flight (ties in turn), and while one is out of rotation the
other takes everything. A service (issue 60 item 2: a profile of kind "service") is routed by the route it answers
(`/v1/audio/transcriptions`, `/v1/audio/speech`), then by model name where the request names one
that one of the services on that route answers to (a multipart upload names none the gateway reads:
any service on the route takes it). Pure: no I/O.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field


@dataclass
class Route:
    """One deployment behind the gateway."""

    key: str  # PROFILE@NODE+NODE, as status names deployments
    names: tuple[str, ...]  # every model name it serves, the first being its served name
    upstream: str  # http://CONTROL_IP:PORT of its head
    supervisor: str  # its head agent's report, which carries the supervisor's state
    api_key: str | None = None  # the deployment's own VLLM_API_KEY, sent upstream
    in_flight: int = 0
    up: bool = False  # in rotation: the supervisor's last verdict says serving
    reason: str = "not looked at yet"  # why not, when not
    retry_after: int = 5
    nodes: tuple[str, ...] = ()  # where it runs
    wake_token: str | None = None  # on demand: what its head agent's POST /wake asks for
    wakeable: bool = False  # the last verdict: on standby (or a start refused), a request wakes it
    woken_at: float = 0.0  # when the gateway last sent it a wake (monotonic): one wake per look
    waking: bool = False  # a wake in flight
    held_until: float = 0.0  # an upgrade holds it (time.time()): new requests wait, none is sent to it
    last_used: float = 0.0  # when a request was last sent to it (monotonic): on demand's "lru" rule
    yield_asked: float = 0.0  # when the gateway last asked it to yield (monotonic): one ask per look
    paths: tuple[str, ...] = ()  # a service's routes (issue 60): it takes requests by path, not only by name
    why: str = ""  # the branch of its last verdict (contract.Availability.why): standby, starting, serving...
    start_s: float = 0.0  # how long its start on demand may take (its profile's ready_timeout_s)
    wake_denied: bool = False  # its head agent refused the wake token (a config older than its `up`)
    agent_token: str | None = None  # what its head agent's console calls ask for (gateway/console)
    report: dict | None = None  # its head agent's last report (the console's nodes and verdicts)

    @property
    def profile(self) -> str:
        return self.key.split("@", 1)[0]

    @classmethod
    def from_config(cls, d: dict) -> Route:
        return cls(
            key=d["key"],
            names=tuple(d["names"]),
            upstream=d["upstream"].rstrip("/"),
            supervisor=d["supervisor"],
            api_key=d.get("api_key") or None,
            nodes=tuple(d.get("nodes") or ()),
            wake_token=d.get("wake_token") or None,
            paths=tuple(d.get("paths") or ()),
            agent_token=d.get("agent_token") or d.get("wake_token") or None,
        )


@dataclass
class Unavailable:
    """Every deployment serving the name is out of rotation: why, and when to ask again."""

    reasons: list[str]
    retry_after: int
    held_until: float = 0.0  # the latest hold of a deployment serving the name: worth waiting for


@dataclass(frozen=True)
class Yielding:
    """An idle deployment the owner's rule (the inventory's `[on_demand]`) chose to stop, so that a
    woken one fits: which, and why, in words the refusal carries."""

    route: Route
    why: str


@dataclass
class Table:
    routes: list[Route] = field(default_factory=list)
    _turn: itertools.count = field(default_factory=itertools.count)
    rule: dict = field(default_factory=dict)  # the inventory's [on_demand]: rule, priority, pinned

    @classmethod
    def from_config(cls, cfg: dict) -> Table:
        """The config's deployments; `held_until` maps a deployment an upgrade holds to the hold's
        end (time.time() of the gateway's node, written by gateway/hold from that clock): the same
        deadline however often the config is read again, so a reload never restarts the bound."""
        routes = [Route.from_config(d) for d in cfg.get("deployments", [])]
        held = cfg.get("held_until") or {}
        for r in routes:
            until = held.get(r.key)
            if isinstance(until, (int, float)) and not isinstance(until, bool):
                r.held_until = float(until)
        return cls(routes, rule=dict(cfg.get("yield") or {}))

    def names(self) -> list[str]:
        """Every model name routed, in the order the deployments were given, each once."""
        return list(dict.fromkeys(n for r in self.routes for n in r.names))

    def serving(self, name: str) -> list[Route]:
        return [r for r in self.routes if name in r.names]

    def pick(self, name: str, now: float = 0.0) -> Route | Unavailable | None:
        """The deployment that takes a request for `name`; Unavailable when every one serving it is
        out of rotation or held (an upgrade: its requests in flight drain, new ones wait); None when
        none serves it (a 404)."""
        return self._choose(self.serving(name), now)

    def _choose(self, candidates: list[Route], now: float = 0.0) -> Route | Unavailable | None:
        if not candidates:
            return None
        up = [r for r in candidates if r.up and r.held_until <= now]
        if not up:
            return Unavailable(
                [f"{r.key}: {'held for an upgrade' if r.held_until > now else r.reason}" for r in candidates],
                min(r.retry_after for r in candidates),
                max(r.held_until for r in candidates),
            )
        least = min(r.in_flight for r in up)
        tied = [r for r in up if r.in_flight == least]
        return tied[next(self._turn) % len(tied)]

    def paths(self) -> set[str]:
        """Every route a service answers (issue 60)."""
        return {p for r in self.routes for p in r.paths}

    def pick_path(self, path: str, name: str | None, now: float = 0.0) -> Route | Unavailable | None:
        """The service that takes a request to `path`: among those answering the route, the ones
        answering to `name` when one does, else every one; in rotation as `pick` chooses."""
        on_path = [r for r in self.routes if path in r.paths]
        named = [r for r in on_path if name is not None and name in r.names]
        return self._choose(named or on_path, now)

    def starting_on_demand(self, name: str) -> float:
        """The longest start a request for `name` may wait for: among the deployments serving it that
        start on demand (a wake token) and are on standby, refused while another yields, or starting,
        the largest `start_s`; 0 when there is none (such a request is answered 503 at once)."""
        waits = [
            r.start_s
            for r in self.serving(name)
            if r.wake_token
            and not r.wake_denied
            and not r.up
            and r.why in ("standby", "refused", "starting", "restarting")
        ]
        return max(waits, default=0.0)

    def to_wake(self, name: str, now: float, every_s: float) -> list[Route]:
        """On demand: the deployments serving `name` that a request should wake now: on standby (or
        refused before), with a wake token, no wake in flight and none sent in the last `every_s`
        (the supervisor's answer shows at the next look; it starts an engine once however many
        wakes reach it)."""
        return [
            r
            for r in self.serving(name)
            if r.wakeable and r.wake_token and not r.waking and now - r.woken_at >= every_s
        ]

    def neighbours(self, route: Route) -> list[Route]:
        """The other deployments in rotation on any of `route`'s nodes: what holds memory there, as
        far as the gateway knows."""
        return [r for r in self.routes if r is not route and r.up and set(r.nodes) & set(route.nodes)]

    def yielder(self, woken: Route, now: float, every_s: float) -> Yielding | None:
        """Issue 60's on demand across deployments: the idle deployment that yields its memory to
        `woken`, a start refused for memory, by the owner's rule; None when the rule is "never" or
        none may. Only an on-demand deployment (it goes back to standby, its containers kept) in
        rotation on one of `woken`'s nodes, with no request in flight, not pinned, and not asked in
        the last `every_s`, ever yields."""
        rule = self.rule.get("rule", "never")
        if rule == "never":
            return None
        prio = self.rule.get("priority") or {}
        pinned = set(self.rule.get("pinned") or ())
        idle = [
            r
            for r in self.neighbours(woken)
            if r.wake_token and r.in_flight == 0 and r.profile not in pinned and now - r.yield_asked >= every_s
        ]
        if rule == "priority":
            mine = prio.get(woken.profile, 0)
            idle = [r for r in idle if prio.get(r.profile, 0) < mine]
            if not idle:
                return None
            r = min(idle, key=lambda r: (prio.get(r.profile, 0), r.last_used))
            return Yielding(r, f"rule priority: {r.key} has priority {prio.get(r.profile, 0)}, {woken.key} {mine}")
        if not idle:
            return None
        r = min(idle, key=lambda r: r.last_used)
        return Yielding(r, f"rule lru: {r.key} is the least recently used of the idle deployments there")

    def adopt(self, new: Table) -> None:
        """A new config's routes, keeping what is known of the deployments that stay (their verdict
        and requests in flight), so a reload neither drops a route in rotation nor loses a count."""
        old = {(r.key, r.upstream): r for r in self.routes}
        for r in new.routes:
            was = old.get((r.key, r.upstream))
            if was is not None:
                r.in_flight, r.up, r.reason, r.retry_after = was.in_flight, was.up, was.reason, was.retry_after
                r.wakeable, r.woken_at, r.waking = was.wakeable, was.woken_at, was.waking
                r.last_used, r.yield_asked = was.last_used, was.yield_asked
        self.routes, self.rule = new.routes, new.rule
