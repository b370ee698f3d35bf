"""What one look at the engine and the nodes saw, and the verdict over looks: the only place the
supervisor decides that an engine is dead, wedged, short of memory or never became ready."""

from __future__ import annotations

from dataclasses import dataclass, field

from .contract import FAILED, LIMIT, MEMORY, RESTARTING, Policy
from .memory_fit import headroom

GiB = 2**30


@dataclass
class Look:
    """One observation of the engine and the nodes; every field a plain fact."""

    now: float
    alive: bool  # the server's process still runs
    health: int | None = None
    running: float | None = None  # vllm:num_requests_running
    generated: float | None = None  # vllm:generation_tokens_total
    progress: dict[str, float] = field(default_factory=dict)  # every progress series (readings.PROGRESS)
    probe: str | None = None  # a probe's answer taken at this look (None: none); "" ok; else why it failed
    low_memory: dict[str, int] = field(default_factory=dict)  # node -> MemAvailable bytes, below the floor
    ranks_gone: str = ""  # executor "mp": why a worker's rank of this set is gone (node/ranks)
    # executor "ray": a Ray node the engine's ranks run on is DEAD or no longer live (node/raynodes.node_lost:
    # its "cause" and evidence), {} when none is or Ray's table was not read at this look
    ray_lost: dict = field(default_factory=dict)
    # the supervisor's own probe was in flight when /metrics was read: it may be the one request
    # running, or have moved the success counter just before the read (idle_for discounts it)
    probe_in_flight: int = 0


@dataclass
class Watch:
    """What the supervisor remembers about the engine it started (one per start)."""

    started: float
    ready: bool = False
    health_failures: int = 0
    last_progress: dict[str, float] = field(default_factory=dict)
    progressed_at: float = 0.0  # when a progress series last moved (or work last was absent)
    probe_failures: int = 0  # consecutive, each while nothing progressed
    low_memory_samples: int = 0
    activity: str = ""  # "prefilling: <evidence>" while work advances with no token generated yet
    # on demand: when a request other than the supervisor's own probes was last seen (idle_for)
    active_at: float = 0.0
    served: float | None = None  # vllm:request_success_total at the last reading
    own_probes: int = 0  # the supervisor's successful probes since that reading


def _work(look: Look) -> tuple[float, float]:
    return look.progress.get("vllm:num_requests_running", look.running or 0.0), look.progress.get(
        "vllm:num_requests_waiting", 0.0
    )


def _moved(before: dict[str, float], now: dict[str, float]) -> list[str]:
    return [k for k, v in now.items() if k in before and before[k] != v]


def progress(w: Watch, look: Look) -> bool:
    """Updates what `w` knows of the engine's progress from this look; True when a progress series
    moved since the last look. The movement is stamped at the look that sees it, up to one interval
    after it happened: with looks every interval_s (2 s; the probe never holds one back) a stall
    verdict comes within stall_s plus one interval of the last movement, close enough that finer
    timing (from the series' own timestamps) is not worth having."""
    running, waiting = _work(look)
    moved = _moved(w.last_progress, look.progress)
    if not (running or waiting) or moved or not w.last_progress:
        w.progressed_at = look.now
    gen = "vllm:generation_tokens_total"
    if running and moved and gen not in moved:
        kv = look.progress.get("vllm:kv_cache_usage_perc")
        evidence = ", ".join(m.removeprefix("vllm:") for m in moved)
        w.activity = f"prefilling: {running:g} request(s) running, no token generated yet, {evidence} moving" + (
            f" (KV cache {kv * 100:.1f}%)" if kv is not None else ""
        )
    elif gen in moved or not running:
        w.activity = ""
    if look.progress:
        w.last_progress = dict(look.progress)
    return bool(moved)


def verdict(w: Watch, look: Look, policy: Policy) -> tuple[str, str] | None:
    """None while the engine is fine (or still starting within its bound), else (kind, cause):
    kind is "memory" (stop, never restart), "dead", "wedged" or "not-ready" (restart within bounds).
    Updates `w` with what this look adds."""
    if look.low_memory:
        w.low_memory_samples += 1
        if w.low_memory_samples >= policy.memory_samples:
            nodes = ", ".join(f"{n} {v / 2**30:.1f} GiB" for n, v in sorted(look.low_memory.items()))
            return "memory", (
                f"MemAvailable below the floor of {policy.memory_floor_gib:g} GiB for "
                f"{w.low_memory_samples} samples ({nodes})"
            )
    else:
        w.low_memory_samples = 0
    if not look.alive:
        return "dead", "the vllm serve process exited"
    if look.ranks_gone:
        return "dead", look.ranks_gone
    if look.ray_lost:
        return "dead", look.ray_lost["cause"]
    if not w.ready:
        if look.health == 200 and look.probe == "":
            w.ready, w.progressed_at = True, look.now
            w.last_progress = dict(look.progress)
        elif look.now - w.started > policy.ready_timeout_s:
            return "not-ready", f"not serving {policy.ready_timeout_s:g}s after its start"
        return None
    if look.health != 200:
        w.health_failures += 1
        if w.health_failures >= policy.health_failures:
            return "dead", f"/health failed {w.health_failures} times in a row ({look.health or 'no answer'})"
        return None
    w.health_failures = 0
    moved = progress(w, look)
    still = look.now - w.progressed_at  # seconds without progress of any kind while work is there
    if look.probe == "":
        w.probe_failures = 0
    elif look.probe:
        # a probe waits behind a long prefill in the scheduler: while the engine progresses, its
        # timeout says nothing; only consecutive failures, each with no progress, count
        if moved:
            w.probe_failures = 0
        else:
            w.probe_failures += 1
            if w.probe_failures >= policy.probe_failures:
                return "wedged", (
                    f"/health is 200 but {look.probe}, {w.probe_failures} times in a row, "
                    f"with no progress for {still:.0f}s"
                )
    if look.progress and still >= policy.stall_s:
        running, waiting = _work(look)
        return "wedged", (
            f"{running:g} request(s) running and {waiting:g} waiting with no progress of any kind "
            f"(tokens, KV cache, queue) for {still:.0f}s"
        )
    return None


def restarts_left(restarts: list[float], now: float, policy: Policy) -> int:
    recent = [t for t in restarts if now - t < policy.restart_window_s]
    return policy.max_restarts - len(recent)


def backoff(restarts: list[float], now: float, policy: Policy, served: bool) -> float:
    """The wait before the restart `restarts` ends with (counted from its verdict). An engine that
    served before its verdict waits backoff_s: a wedge or a lost node after hours of serving is not
    a crash loop. One that never served doubles it per restart in the window, at most 60 s."""
    if served:
        return policy.backoff_s
    recent = [t for t in restarts if now - t < policy.restart_window_s]
    return min(60.0, policy.backoff_s * 2 ** max(0, len(recent) - 1))


@dataclass(frozen=True)
class Decision:
    """What the supervisor does once a verdict is in: `watch` (supervision is off: journalled and
    left alone), `stop` for good (`state` says why: nothing starts again until `up`), or `restart`
    after `wait_s` from the verdict."""

    action: str  # "watch", "stop" or "restart"
    state: str = ""
    wait_s: float = 0.0


def decide(kind: str, policy: Policy, first_start: bool, restarts: list[float], now: float, served: bool) -> Decision:
    """Pure: the verdict `kind` (verdict's), judged at `now`, on an engine that was its container's
    first start or not, after the restarts made at `restarts`, that `served` before the verdict or
    not. Out of memory stops for good (a restart would take the host down again); so does an engine
    that never started here, and one whose restarts in the window are spent; anything else restarts
    after the backoff."""
    if not policy.act:
        return Decision("watch")
    if kind == "memory":
        return Decision("stop", MEMORY)
    if first_start:
        return Decision("stop", FAILED)
    if restarts_left(restarts, now, policy) <= 0:
        return Decision("stop", LIMIT)
    return Decision("restart", RESTARTING, backoff([*restarts, now], now, policy, served))


def memory_for_restart(nodes: dict[str, tuple[int | None, int | None]], policy: Policy) -> tuple[bool, dict[str, str]]:
    """Before a restart: does every node's MemAvailable cover the engine again? `nodes`: node ->
    (MemTotal, MemAvailable) in bytes, None where unknown (unknown is never "enough"). The need is
    doctor's `mem.headroom` arithmetic (memory_fit.headroom: gpu_memory_utilization of MemTotal) and
    the bar the floor the supervisor stops the engine at while serving, so a restart never starts
    into a node it would stop at once. Returns (every node covered, what each node showed)."""
    frac = policy.memory_need_fraction
    floor = policy.memory_floor_gib * GiB
    ok, seen = True, {}
    for node, (total, available) in nodes.items():
        if total is None or available is None:
            ok = False
            seen[node] = "memory unknown (no report)"
            continue
        need, left = headroom(total, available, frac)
        covered = left >= floor
        ok = ok and covered
        seen[node] = (
            f"MemAvailable {available / GiB:.1f} GiB, the engine needs {need / GiB:.1f} GiB and "
            f"{floor / GiB:g} GiB must stay free: {'covered' if covered else f'{(floor - left) / GiB:.1f} GiB short'}"
        )
    return ok, seen


def memory_wait(waiting_since: float | None, now: float, covered: bool, policy: Policy) -> str:
    """ "go" (start now), "wait" (within the bound), or "give-up" (the bound is spent)."""
    if covered:
        return "go"
    if waiting_since is not None and now - waiting_since > policy.memory_wait_s:
        return "give-up"
    return "wait"


SUCCESS = "vllm:request_success_total"


def idle_for(w: Watch, look: Look) -> float:
    """Seconds since the engine last had a request of anyone but the supervisor (on demand's idle
    TTL). A request is seen as work running or waiting at a look, or as the success counter moving
    by more than the supervisor's own probes since the last look (a short request between two
    looks). A probe's answer taken at a look returned before that look read /metrics, so it is in
    this reading already. Until the engine is ready it counts as busy. Updates `w`."""
    served = look.progress.get(SUCCESS)
    running, waiting = _work(look)
    running = max(0.0, running - look.probe_in_flight)
    busy = not w.ready or bool(running or waiting) or not w.active_at
    if look.probe == "":
        w.own_probes += 1
    if served is not None:
        if w.served is not None and served - w.served > w.own_probes + look.probe_in_flight:
            busy = True
        w.served, w.own_probes = served, 0
    if busy:
        w.active_at = look.now
    return look.now - w.active_at


def admission(
    nodes: dict[str, tuple[int | None, int | None]], held: dict[str, dict], policy: Policy
) -> tuple[bool, str]:
    """Before an on-demand start: every node must have the headroom the profile's memory arithmetic
    asks for (memory_for_restart: gpu_memory_utilization of MemTotal, and the floor left free), so a
    deployment shares memory with nothing. Returns (admitted, the refusal: each short node, what it
    showed and what holds its memory, `held` being node -> {holder: bytes})."""
    ok, seen = memory_for_restart(nodes, policy)
    if ok:
        return True, ""
    short = []
    for node, said in sorted(seen.items()):
        if said.endswith("covered"):
            continue
        holders = sorted(
            ((v, k) for k, v in (held.get(node) or {}).items() if isinstance(v, int) and v > 0), reverse=True
        )
        holds = ", ".join(f"{k} {v / GiB:.1f} GiB" for v, k in holders)
        short.append(f"{node}: {said}" + (f"; held by {holds}" if holds else ""))
    return False, "; ".join(short)
