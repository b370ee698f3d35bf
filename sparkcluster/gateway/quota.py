"""A named key's limits, held at the gateway before anything reaches an engine: requests per
minute (a token bucket of that size, refilled at that rate, so a burst of the whole minute's
requests passes and then one each 60/N seconds), requests in flight at once, and tokens per UTC day
(the engine's own counts, from the usage ledger: checked when a request is admitted; one in flight
is never cut). Beyond a limit: how long until it would pass, for the 429's Retry-After.

The gateway serves every request on one event loop, so an admission (a look and a take) is never
interleaved with another: the limits hold under any concurrency. The buckets and the day's tokens
are the ledger's (programs/gateway_usage), written once a poll and when the gateway stops, so a
restart finds them as they were. Standard library only (shipped into the gateway's container).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..programs.gateway_usage import DAY
from .keys import Identity


@dataclass(frozen=True)
class Refusal:
    limit: str  # "requests_per_minute", "max_concurrent", "tokens_per_day"
    retry_after: int  # seconds
    message: str


class Quota:
    def __init__(self, ledger):
        self.ledger = ledger
        self.buckets: dict[str, tuple[float, float]] = dict(ledger.saved_buckets())  # key -> (tokens, at)
        self.in_flight: dict[str, int] = {}

    def admit(self, who: Identity, now: float) -> Refusal | None:
        """None: admitted (its bucket taken from, counted in flight until `done`); else why not."""
        if who.tokens_per_day:
            used = self.ledger.tokens_today(who.name, now)
            if used >= who.tokens_per_day:
                until = int(now // DAY * DAY + DAY - now) + 1
                return Refusal(
                    "tokens_per_day",
                    until,
                    f"key '{who.name}' has used its {who.tokens_per_day} tokens for today (UTC): "
                    f"{used} used; it resets at midnight UTC",
                )
        if who.max_concurrent and self.in_flight.get(who.name, 0) >= who.max_concurrent:
            return Refusal(
                "max_concurrent",
                1,
                f"key '{who.name}' has {who.max_concurrent} request(s) in flight, its limit: retry when one ends",
            )
        if who.requests_per_minute:
            rate = who.requests_per_minute / 60.0
            tokens, at = self.buckets.get(who.name, (float(who.requests_per_minute), now))
            tokens = min(float(who.requests_per_minute), tokens + max(0.0, now - at) * rate)
            if tokens < 1.0:
                self.buckets[who.name] = (tokens, now)
                return Refusal(
                    "requests_per_minute",
                    max(1, math.ceil((1.0 - tokens) / rate)),
                    f"key '{who.name}' is over its limit of {who.requests_per_minute} requests per minute",
                )
            self.buckets[who.name] = (tokens - 1.0, now)
            self.ledger.bucket(who.name, tokens - 1.0, now)
        self.in_flight[who.name] = self.in_flight.get(who.name, 0) + 1
        return None

    def done(self, who: Identity) -> None:
        n = self.in_flight.get(who.name, 0) - 1
        if n > 0:
            self.in_flight[who.name] = n
        else:
            self.in_flight.pop(who.name, None)
