"""The gateway's own figures, per model name, for Prometheus: requests (by endpoint and status),
latency to the first byte and to the last, requests in flight, upstream errors, and whether each
deployment is in rotation. One registry per app, so two gateways in one process (tests) do not
share counters."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# seconds: from a one-token answer on the testbed (tens of ms) to a long generation
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        p = "sparkcluster_gateway"
        r = self.registry
        self.requests = Counter(
            f"{p}_requests", "Requests, by model, endpoint and status", ["model", "endpoint", "code"], registry=r
        )
        self.first_byte = Histogram(
            f"{p}_first_byte_seconds", "Time to the upstream's first body byte", ["model"], buckets=BUCKETS, registry=r
        )
        self.latency = Histogram(
            f"{p}_request_seconds", "Time to the answer's last byte", ["model"], buckets=BUCKETS, registry=r
        )
        self.in_flight = Gauge(f"{p}_in_flight", "Requests in flight", ["model"], registry=r)
        self.upstream_errors = Counter(
            f"{p}_upstream_errors",
            "Upstream failures (connect, read, HTTP 5xx), by model",
            ["model", "kind"],
            registry=r,
        )
        self.route_up = Gauge(
            f"{p}_route_up",
            "1 while a deployment is in rotation (the supervisor says serving)",
            ["model", "deployment"],
            registry=r,
        )

        self.wakes = Counter(
            f"{p}_wakes",
            "On-demand wakes sent to a deployment's head agent, by outcome (the agent's HTTP status, or error)",
            ["deployment", "outcome"],
            registry=r,
        )
        self.held_for_start = Counter(
            f"{p}_held_for_start",
            "Requests held while a deployment started on demand, by how the hold ended (served, timed out)",
            ["outcome"],
            registry=r,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
