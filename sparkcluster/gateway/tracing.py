"""Request traces, optional: where the config names an OTLP endpoint (the inventory's `[gateway]
otlp_endpoint`) and the gateway's image has the OpenTelemetry SDK and its OTLP exporter, every
request the gateway forwards is a trace of spans, exported in batches off the event loop.

The spans:
- `POST /v1/...` (a server span, the request's whole path through the gateway, the child of the
  client's own `traceparent` where it sent one), and under it
- `gateway.receive`: the key checked and the body read;
- `gateway.admission`: the model, the key's models and limits (gateway/quota), the route picked;
- `gateway.upstream`: the request to the engine until its answer's headers (a client span; its W3C
  `traceparent` goes upstream in place of the client's, so vLLM started with
  `--otlp-traces-endpoint` makes its own spans children of it, in the same trace: vLLM's
  docs, "Setup OpenTelemetry POC", send requests with a trace context the same way);
- `gateway.stream`: the answer relayed, from its headers to its end.

Attributes: the endpoint, the model asked for, the deployment, the key's name, the status (or how it
ended), the engine's token counts (gateway/metering). Never a body: no prompt, no answer, no error
message. Without an endpoint nothing of OpenTelemetry is imported; without the SDK in the image the
gateway runs as before and says traces are off (its journal, `/gateway/status`). Standard library
only at import (shipped into the gateway's container); OpenTelemetry by name, when asked for.
"""

from __future__ import annotations

import importlib
import time

SDK = "opentelemetry.sdk.trace"
# the OTLP exporter of each protocol (the opentelemetry-exporter-otlp-proto-grpc and -http packages);
# gRPC is vLLM's default for its own --otlp-traces-endpoint
EXPORTERS = {
    "grpc": "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
    "http/protobuf": "opentelemetry.exporter.otlp.proto.http.trace_exporter",
}
SERVICE = "sparkcluster-gateway"
HTTP_PATH = "/v1/traces"  # OTLP/HTTP's path for traces (the OTLP specification, "OTLP/HTTP Request")
TRACE_HEADERS = frozenset({b"traceparent", b"tracestate"})  # W3C Trace Context's two headers


def probe_source(protocol: str = "grpc") -> str:
    """What `python3 -c` runs in an image to tell whether it has what traces need."""
    return f"import {SDK}, {EXPORTERS[protocol]}"


def load(cfg: dict) -> tuple[Traces | None, str]:
    """The gateway's traces from its config, and what to say of them: None (off) without an
    endpoint, or where the image lacks the SDK or the exporter."""
    endpoint = cfg.get("otlp_endpoint") or ""
    if not endpoint:
        return None, "off: no OTLP endpoint configured"
    protocol = cfg.get("otlp_protocol") or "grpc"
    if protocol not in EXPORTERS:
        return None, f"off: unknown OTLP protocol {protocol!r}"
    try:
        sdk = importlib.import_module(SDK)
        export = importlib.import_module("opentelemetry.sdk.trace.export")
        resources = importlib.import_module("opentelemetry.sdk.resources")
        exporter = importlib.import_module(EXPORTERS[protocol])
    except ImportError as e:
        return None, f"off: this image lacks the OpenTelemetry SDK or its OTLP exporter ({e.name or e})"
    if protocol == "http/protobuf" and endpoint.rstrip("/").count("/") <= 2:  # scheme://host:port only
        endpoint = endpoint.rstrip("/") + HTTP_PATH
    provider = sdk.TracerProvider(resource=resources.Resource.create({"service.name": SERVICE}))
    provider.add_span_processor(export.BatchSpanProcessor(exporter.OTLPSpanExporter(endpoint=endpoint)))
    return Traces(provider), f"on: OTLP over {protocol} to {endpoint}"


class Traces:
    """The tracer of one gateway process (`provider`: an SDK TracerProvider)."""

    def __init__(self, provider):
        self.provider = provider
        self.api = importlib.import_module("opentelemetry.trace")
        w3c = importlib.import_module("opentelemetry.trace.propagation.tracecontext")
        self.w3c = w3c.TraceContextTextMapPropagator()
        self.tracer = provider.get_tracer("sparkcluster.gateway")

    def begin(self, scope, endpoint: str) -> RequestTrace:
        """A request's trace, its root span and its `gateway.receive` started now."""
        carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"] if k in TRACE_HEADERS}
        parent = self.w3c.extract(carrier) if carrier else None
        root = self.tracer.start_span(
            f"{scope['method']} {endpoint}",
            context=parent,
            kind=self.api.SpanKind.SERVER,
            attributes={"http.request.method": scope["method"], "url.path": endpoint},
        )
        return RequestTrace(self, root)

    def shutdown(self) -> None:
        """The spans still queued sent (bounded by the exporter's own timeout)."""
        self.provider.shutdown()


class RequestTrace:
    """One request's spans, each phase ended when the next begins."""

    def __init__(self, traces: Traces, root):
        self.traces, self.root = traces, root
        self.ctx = traces.api.set_span_in_context(root)
        self.phase = self.child("gateway.receive")
        self.upstream = None
        self.status = 0  # the answer's status as the gateway sent it (0: none sent)
        self.meter = None  # the request's meter once admitted (its token counts)
        self.outcome = ""  # how the relay ended (proxy.forward's: the status, "disconnect", "upstream")

    def child(self, name: str, **kw):
        return self.traces.tracer.start_span(name, context=self.ctx, **kw)

    def _next(self, name: str | None):
        if self.phase is not None:
            self.phase.end()
        self.phase = self.child(name) if name else None

    def received(self, who) -> None:
        """The key is known and the body read: admission begins."""
        if who is not None:
            self.root.set_attribute("sparkcluster.key", who.name)
        self._next("gateway.admission")

    def admitted(self, route, meter) -> None:
        """Within the key's limits, to `route`: the upstream call begins (`upstream_headers`)."""
        self.root.set_attribute("sparkcluster.deployment", route.key)
        self.meter = meter
        self._next(None)

    def model(self, model: str) -> None:
        """The model the request asks for (its name only), known once the body is read."""
        self.root.set_attribute("gen_ai.request.model", model)

    def upstream_headers(self, headers: list[tuple[str, str]], url: str) -> list[tuple[str, str]]:
        """The upstream call's span started; `headers` with its traceparent in place of the client's."""
        self.upstream = self.child(
            "gateway.upstream", kind=self.traces.api.SpanKind.CLIENT, attributes={"url.full": url.partition("?")[0]}
        )
        carrier: dict[str, str] = {}
        self.traces.w3c.inject(carrier, context=self.traces.api.set_span_in_context(self.upstream))
        return [(k, v) for k, v in headers if k.lower() not in ("traceparent", "tracestate")] + list(carrier.items())

    def answered(self, status: int, relayed: bool = True) -> None:
        """The engine's answer's headers are in: its relay begins; or the call failed (`relayed`
        False: no answer, `status` the gateway's own)."""
        if self.upstream is not None:
            self.upstream.set_attribute("http.response.status_code", status)
            if not relayed:
                self.upstream.set_status(self.traces.api.Status(self.traces.api.StatusCode.ERROR))
            self.upstream.end()
            self.upstream = None
        if relayed:
            self._next("gateway.stream")

    def sent(self, message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]

    def finish(self, error: BaseException | None = None) -> None:
        """The request answered (or broken off): every span still open ended, the root's figures set."""
        now = time.time_ns()
        if self.upstream is not None:  # the client left before the engine answered
            self.upstream.end(now)
        if self.phase is not None:
            self.phase.end(now)
        attrs: dict = {"http.response.status_code": self.status} if self.status else {}
        if self.outcome:
            attrs["sparkcluster.outcome"] = self.outcome
        if self.meter is not None:
            prompt, completion = self.meter.tokens()
            attrs["gen_ai.usage.input_tokens"] = prompt
            attrs["gen_ai.usage.output_tokens"] = completion
            if self.meter.ttft_s is not None:
                attrs["sparkcluster.first_byte_s"] = round(self.meter.ttft_s, 6)
        if error is not None:
            attrs["error.type"] = type(error).__name__
            self.root.set_status(self.traces.api.Status(self.traces.api.StatusCode.ERROR))
        elif self.status >= 500:
            self.root.set_status(self.traces.api.Status(self.traces.api.StatusCode.ERROR))
        self.root.set_attributes(attrs)
        self.root.end(now)
