"""The web console's fixture (sparkcluster/gateway/console), on loopback with no testbed: two stand-in
deployments whose head agents answer the console's token calls as node/console_calls and node/supervisor
`ask` do (journal, log, restart, standby, wake), whose engines answer vLLM's `/metrics` with the series
the console reads, and the gateway itself with a key file holding an admin key and a user's key.
The unit tests (test_gateway_console) and the browser test (test_console_browser) share it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from gateway_fakes import KEY, Engine, Served, config, in_rotation, start_gateway, until
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from sparkcluster.gateway import keys
from sparkcluster.node import contract

ADMIN_KEY = "sk-spark-admin-key-0123456789abcdef"
USER_KEY = "sk-spark-user-key-0123456789abcdefg"
TOKEN_A, TOKEN_B = "agent-token-of-a-0123456789", "agent-token-of-b-0123456789"
SECRET = "hf_secret_value_in_a_log_line"  # what a log line carries, masked by the agent before it is served

# vLLM's /metrics in its text format (the series the console reads, named as vLLM's "Production Metrics"
# page lists them: https://docs.vllm.ai/en/v0.32.0/usage/metrics/); values made up, advanced at each read
METRICS = """# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{{engine="0",model_name="{model}"}} {generated}
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="{model}"}} 3.0
vllm:num_requests_waiting{{engine="0",model_name="{model}"}} 1.0
vllm:kv_cache_usage_perc{{engine="0",model_name="{model}"}} 0.25
vllm:time_to_first_token_seconds_sum{{engine="0",model_name="{model}"}} {ttft_sum}
vllm:time_to_first_token_seconds_count{{engine="0",model_name="{model}"}} {count}
vllm:inter_token_latency_seconds_sum{{engine="0",model_name="{model}"}} {itl_sum}
vllm:inter_token_latency_seconds_count{{engine="0",model_name="{model}"}} {itl_count}
"""


# the head agent's own /metrics in node/metrics' series and format; the values are made up for the page
NODE_METRICS = """# TYPE sparkcluster_gpu_power_watts gauge
sparkcluster_gpu_power_watts{gpu="0"} 61.5
sparkcluster_fabric_busbw_gbps 22.4
sparkcluster_fabric_floor_gbps 18.0
sparkcluster_fabric_transport_info{transport="IB"} 1
"""


@dataclass
class Agent(Engine):
    """An engine and its head agent, with the console's calls."""

    token: str = ""
    journal: list[dict] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    asked: list[tuple[str, str, str]] = field(default_factory=list)  # (action, token, by)
    generated: float = 1000.0
    reads: int = 0  # /metrics reads
    nodes: tuple[str, ...] = ("spark-a",)
    since: float = 0.0  # when it entered its state (0: half a minute ago, at every read)
    alerts: list[dict] = field(default_factory=list)  # what the stand-in Prometheus lists (on `a`)

    def app(self) -> Starlette:
        base = super().app()

        def token_of(request: Request) -> str:
            scheme, _, token = request.headers.get("authorization", "").partition(" ")
            return token if scheme.lower() == "bearer" else ""

        async def journal(request: Request):
            if token_of(request) != self.token:
                return JSONResponse({"error": "missing or wrong token"}, status_code=401)
            since = float(request.query_params.get("since", 0))
            return JSONResponse({"entries": [e for e in self.journal if e["ts"] > since]})

        async def log(request: Request):
            if token_of(request) != self.token:
                return JSONResponse({"error": "missing or wrong token"}, status_code=401)
            return JSONResponse({"lines": [x.replace(SECRET, "******") for x in self.log]})

        async def ask(request: Request):
            what = request.url.path.rsplit("/", 1)[1]
            by = request.headers.get("x-sparkcluster-by", "")
            self.asked.append((what, token_of(request), by))
            if token_of(request) != self.token:
                return JSONResponse({"error": "missing or wrong token"}, status_code=401)
            self.journal.append({"ts": time.time(), "event": f"console: {what}", "by": by})
            self.state = contract.STANDBY if what == "standby" else contract.RESTARTING
            return JSONResponse({"state": self.state}, status_code=202)

        async def metrics(request: Request):
            self.reads += 1
            self.generated += 500
            n = self.reads
            text = METRICS.format(
                model=self.names[0],
                generated=self.generated,
                ttft_sum=0.2 * n,
                count=n,
                itl_sum=0.02 * n * 10,
                itl_count=n * 10,
            )
            return PlainTextResponse(text)

        async def report(request: Request):  # the head agent's report: its node's figures, its peers', the state
            sup = {
                "state": self.state,
                "since": self.since or time.time() - 30,
                "updated": time.time(),
                "causes": self.causes,
                "policy": {"interval_s": 2.0, "ready_timeout_s": self.ready_timeout_s},
                "memory_unknown": {},
                "tokens_per_s": 41.5 if self.state == contract.SERVING else None,
            }
            mem = {"mem_available": 90 * 1024**3, "mem_total": 119 * 1024**3, "ray_alive": True, "ts": time.time()}
            peers = {n: dict(mem, mem_available=80 * 1024**3) for n in self.nodes[1:]}
            return JSONResponse({"node": self.nodes[0], **mem, "supervisor": sup, "peers": peers})

        async def node_metrics(request: Request):  # the agent's own /metrics (node/metrics' series)
            return PlainTextResponse(NODE_METRICS)

        # Prometheus' /api/v1/alerts, as its HTTP API documents it (prometheus.io, "HTTP API", Alerts)
        async def alerts(request: Request):
            return JSONResponse({"status": "success", "data": {"alerts": self.alerts}})

        routes = [
            Route("/api/v1/alerts", alerts),
            Route("/report", report),
            Route("/report/metrics", node_metrics),
            Route("/report/journal", journal),
            Route("/report/log", log),
            Route("/report/restart", ask, methods=["POST"]),
            Route("/report/standby", ask, methods=["POST"]),
            Route("/metrics", metrics),
        ]
        return Starlette(routes=routes + list(base.routes))


# a bench run's summary and the upgrade history in the shape deployment/head_records writes them; the
# figures are made up for the page (no measurement is claimed), the record's address a placeholder
BENCH = {
    "at": "2026-11-29T10:00:00+00:00",
    "deployment": "reasoner@spark-a+spark-b",
    "profile": "reasoner",
    "vllm_version": "0.32.0",
    "rows": [
        {"concurrency": 1, "output_tok_s": 38.2, "ttft_p50_ms": 61.0, "itl_p50_ms": 25.9, "errors": 0},
        {"concurrency": 8, "output_tok_s": 212.4, "ttft_p50_ms": 140.0, "itl_p50_ms": 36.1, "errors": 0},
    ],
    "against": {
        "kind": "published",
        "verdict": "short",
        "source": "https://example.org/published-record",
        "ratios": [
            {
                "conditions": "512/128 c8",
                "figure": "output_tok_s",
                "ours": 212.4,
                "theirs": 260.0,
                "ratio": 0.82,
                "short": True,
            }
        ],
        "causes": [
            {"area": "fabric", "node": "spark-b", "says": "NCCL chose Socket, not IB", "fix": "sparkcluster doctor"}
        ],
    },
}
UPGRADES = {
    "good": [
        {
            "at": "2026-11-28T09:00:00Z",
            "deployment": "reasoner@spark-a+spark-b",
            "image": "vllm:0.32.0",
            "vllm_version": "0.32.0",
            "model_revision": "abc123",
            "canary_tok_s": 38.0,
        }
    ],
    "outcomes": [
        {
            "at": "2026-11-29T08:00:00Z",
            "deployment": "reasoner@spark-a+spark-b",
            "image": "vllm:0.33.0",
            "outcome": "rolled back",
            "reason": "the canary's answers changed",
            "returned_to": "2026-11-28T09:00:00Z",
        }
    ],
}


def records(data) -> None:
    import json

    bench = data / "records" / "bench"
    bench.mkdir(parents=True)
    (bench / "20261129T100000Z.json").write_text(json.dumps(BENCH))
    (data / "records" / "upgrades.json").write_text(json.dumps(UPGRADES))


@dataclass
class Console:
    gw: object
    served: Served
    a: Agent
    b: Agent
    others: list = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.served.url

    def stop(self) -> None:
        for s in (self.served, *self.others):
            s.stop()


def start(tmp_path) -> Console:
    """Two deployments (reasoner on two nodes, serving, with a verdict behind it; vision on demand,
    on standby) behind a gateway whose key file names an admin key and a user's key."""
    now = time.time()
    a = Agent(["reasoner"], token=TOKEN_A, nodes=("spark-a", "spark-b"))
    a.causes = [{"ts": now - 600, "kind": "wedged", "cause": "no token generated for 120s with 2 requests running"}]
    a.journal = [
        {"ts": now - 600, "event": "verdict", "kind": "wedged", "cause": "no token generated for 120s"},
        {"ts": now - 590, "event": "state: serving"},
    ]
    a.log = ["INFO vllm serve started", f"INFO token {SECRET} in a line", "INFO Avg prompt throughput: 10 tokens/s"]
    b = Agent(["vision"], token=TOKEN_B, wake_token=TOKEN_B, state=contract.STANDBY, nodes=("spark-c",))
    b.journal = [{"ts": now - 60, "event": "state: standby"}]
    sa, sb = Served(a.app()), Served(b.app())
    data = tmp_path / "gateway"
    data.mkdir()
    entries = [
        keys.Entry("owner", keys.digest(ADMIN_KEY), admin=True),
        keys.Entry("alice", keys.digest(USER_KEY)),
    ]
    (data / keys.KEYS_FILE).write_text(keys.render(entries))
    records(data)
    cfg = config({"reasoner@spark-a+spark-b": (a, sa), "vision@spark-c": (b, sb)}, data=str(data))
    cfg["deployments"][0].update(nodes=["spark-a", "spark-b"], agent_token=TOKEN_A)
    cfg["alerts"] = f"{sa.url}/api/v1/alerts"
    a.alerts = [
        {
            "labels": {
                "alertname": "SparkRestartLoop",
                "deployment": "reasoner@spark-a+spark-b",
                "severity": "warning",
            },
            "annotations": {"summary": "pair: reasoner@spark-a+spark-b restarted 3 times in 10 minutes"},
            "state": "firing",
            "activeAt": "2026-11-29T10:00:00Z",
        },
        {"labels": {"alertname": "SparkMemoryHeadroomLow"}, "annotations": {}, "state": "pending"},
    ]
    cfg["deployments"][1].update(nodes=["spark-c"], agent_token=TOKEN_B, wake_token=TOKEN_B)
    gw, sg = start_gateway(cfg)
    until(lambda: in_rotation(gw, "reasoner@spark-a+spark-b"), what="reasoner in rotation")
    until(lambda: all(r.report for r in gw.table.routes), what="both reports read")
    return Console(gw, sg, a, b, [sa, sb])


__all__ = ["ADMIN_KEY", "KEY", "USER_KEY", "Agent", "Console", "start", "until"]
