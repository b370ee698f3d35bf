"""What one look at the engine and the nodes saw, and the verdict over looks: the only place the
supervisor decides that an engine is dead, wedged, short of memory or never became ready."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Look:
    """One observation of the engine and the nodes; every field a plain fact."""

    now: float
    alive: bool  # the server's process still runs
    health: int | None = None
    running: float | None = None  # vllm:num_requests_running
    generated: float | None = None  # vllm:generation_tokens_total
    probe: str | None = None  # None: not probed this time; "" ok; else why it failed
    low_memory: dict[str, int] = field(default_factory=dict)  # node -> MemAvailable bytes, below the floor


@dataclass
class Watch:
    """What the supervisor remembers about the engine it started (one per start)."""

    started: float
    ready: bool = False
    health_failures: int = 0
    last_generated: float | None = None
    generated_moved_at: float = 0.0
    low_memory_samples: int = 0


def verdict(w: Watch, look: Look, policy: dict) -> tuple[str, str] | None:
    """None while the engine is fine (or still starting within its bound), else (kind, cause):
    kind is "memory" (stop, never restart), "dead", "wedged" or "not-ready" (restart within bounds).
    Updates `w` with what this look adds."""
    if look.low_memory:
        w.low_memory_samples += 1
        if w.low_memory_samples >= int(policy["memory_samples"]):
            nodes = ", ".join(f"{n} {v / 2**30:.1f} GiB" for n, v in sorted(look.low_memory.items()))
            return "memory", (f"MemAvailable below the floor of {policy['memory_floor_gib']:g} GiB for "
                              f"{w.low_memory_samples} samples ({nodes})")
    else:
        w.low_memory_samples = 0
    if not look.alive:
        return "dead", "the vllm serve process exited"
    if not w.ready:
        if look.health == 200 and look.probe == "":
            w.ready, w.generated_moved_at = True, look.now
        elif look.now - w.started > float(policy["ready_timeout_s"]):
            return "not-ready", f"not serving {policy['ready_timeout_s']:g}s after its start"
        return None
    if look.health != 200:
        w.health_failures += 1
        if w.health_failures >= int(policy["health_failures"]):
            return "dead", f"/health failed {w.health_failures} times in a row ({look.health or 'no answer'})"
        return None
    w.health_failures = 0
    if look.probe:
        return "wedged", f"/health is 200 but {look.probe}"
    if look.generated is not None:
        if look.generated != w.last_generated or not look.running:
            w.last_generated, w.generated_moved_at = look.generated, look.now
        elif look.now - w.generated_moved_at >= float(policy["stall_s"]):
            return "wedged", (f"{look.running:g} request(s) running and no token generated for "
                              f"{look.now - w.generated_moved_at:.0f}s")
    return None


def restarts_left(restarts: list[float], now: float, policy: dict) -> int:
    recent = [t for t in restarts if now - t < float(policy["restart_window_s"])]
    return int(policy["max_restarts"]) - len(recent)


def backoff(restarts: list[float], now: float, policy: dict) -> float:
    recent = [t for t in restarts if now - t < float(policy["restart_window_s"])]
    return min(60.0, float(policy["backoff_s"]) * 2 ** max(0, len(recent) - 1))
