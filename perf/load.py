"""Requests against the serving endpoint, for the figures that need the engine busy: a wedge under
load (perf/recovery.py: the stall clock counts only while work is there) and serving throughput
with monitoring on against off (perf/monitoring.py).

`Load` keeps `concurrency` chat completions in flight until stopped, each asking for a fixed number
of tokens with `ignore_eos` (so every request generates the same work). `throughput` reads the
engine's own generated-tokens counter at both ends of a window.
"""

from __future__ import annotations

import threading
import time

import httpx

from perf import testbed

MAX_TOKENS = 64


class Load:
    def __init__(self, base: str, model: str, concurrency: int = 4, api_key: str = testbed.API_KEY):
        self.base, self.model, self.concurrency, self.api_key = base, model, concurrency, api_key
        self.tokens, self.requests, self.failures = 0, 0, 0
        self.first_done = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def _one(self, c: httpx.Client) -> None:
        while not self._stop.is_set():
            try:
                r = c.post(
                    f"{self.base}/v1/chat/completions",
                    headers={"Authorization": f"Bearer {self.api_key}"},
                    json={
                        "model": self.model,
                        "max_tokens": MAX_TOKENS,
                        "ignore_eos": True,
                        "messages": [{"role": "user", "content": "Count from one to one hundred."}],
                    },
                )
                n = r.json()["usage"]["completion_tokens"] if r.status_code == 200 else None
            except (httpx.HTTPError, ValueError, KeyError):
                n = None
            with self._lock:
                if n is None:
                    self.failures += 1
                elif not self._stop.is_set():
                    self.tokens += n
                    self.requests += 1
                    self.first_done.set()
            if n is None:
                self._stop.wait(0.2)

    def __enter__(self) -> Load:
        def run():
            with httpx.Client(timeout=60) as c:
                self._one(c)

        self._threads = [threading.Thread(target=run, daemon=True) for _ in range(self.concurrency)]
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def __exit__(self, *exc) -> None:
        self.stop()
        for t in self._threads:
            t.join(timeout=70)


def generated_tokens(base: str) -> float:
    """The engine's own count of generated tokens (vLLM's /metrics, summed over its labels)."""
    from sparkcluster.node.readings import engine_figures

    r = httpx.get(f"{base}/metrics", timeout=10)
    r.raise_for_status()
    _, generated = engine_figures(r.text)
    if generated is None:
        raise SystemExit(f"bench: no generated-tokens counter at {base}/metrics")
    return generated


def throughput(base: str, model: str, seconds: float, concurrency: int = 4, warmup: float = 3.0) -> float:
    """Generated tokens a second over `seconds`, read from the engine's own counter at both ends,
    `concurrency` requests in flight all along (the first `warmup` seconds not counted): the
    engine's rate, without the quantisation of counting whole requests."""
    with Load(base, model, concurrency) as load:
        if not load.first_done.wait(warmup + 120):
            raise SystemExit(f"bench: no completion from {base} within {warmup + 120:.0f}s")
        time.sleep(warmup)
        g0, t0 = generated_tokens(base), time.monotonic()
        time.sleep(seconds)
        g1, t1 = generated_tokens(base), time.monotonic()
    return (g1 - g0) / (t1 - t0)
