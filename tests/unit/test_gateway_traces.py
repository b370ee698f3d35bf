"""Request traces through the gateway (gateway/tracing): the gateway on loopback in front of the stub
engine, its spans caught by the OpenTelemetry SDK's in-memory exporter; the W3C traceparent the engine
receives (W3C Trace Context, "traceparent Header": version-trace_id-parent_id-flags, lower-case hex);
no body text in any attribute; and the gateway without the SDK (its import blocked), traces off."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest
from conftest import inventory_dict, make_inventory
from gateway_fakes import KEY, Served, config, in_rotation, until
from test_gateway_keys import PROMPT, WORDS, Counting, key_file, named

from sparkcluster.gateway import deploy, rollout, tracing
from sparkcluster.gateway.app import Gateway

otel = pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

SECRET_PROMPT = "the owner's private prompt 5d1f"
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"  # W3C Trace Context's own example ids
CLIENT_SPAN = "00f067aa0ba902b7"
NAMED = "team-key-0123456789abcdef"


@pytest.fixture
def traced(tmp_path):
    """The Counting engine serving `chat`, the gateway over it with traces into memory; a named key
    with limits beside the controller's."""
    exported = InMemorySpanExporter()
    provider = otel.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    e = Counting(["chat"])
    s = Served(e.app())
    key_file(tmp_path, named("alice", NAMED, requests_per_minute=1000, tokens_per_day=10**9))
    gw = Gateway(config({"chat@spark-a": (e, s)}, data=str(tmp_path)))
    gw.traces, gw.traces_said = tracing.Traces(provider), "on: in memory"
    sg = Served(gw.app())
    until(lambda: in_rotation(gw, "chat@spark-a"), what="in rotation")
    yield e, sg, exported
    sg.stop()
    s.stop()


def spans_of(exported, n: int) -> dict:
    got = until(lambda: exported.get_finished_spans() if len(exported.get_finished_spans()) >= n else None)
    return {sp.name: sp for sp in got}


def test_a_streamed_request_is_one_trace_joined_to_the_clients_with_the_engines_traceparent(traced):
    e, sg, exported = traced
    r = httpx.post(
        f"{sg.url}/v1/chat/completions",
        json={"model": "chat", "stream": True, "messages": [{"role": "user", "content": SECRET_PROMPT}]},
        headers={"Authorization": f"Bearer {NAMED}", "traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"},
        timeout=30,
    )
    assert r.status_code == 200 and "w0" in r.text
    spans = spans_of(exported, 5)
    root = spans["POST /v1/chat/completions"]
    assert set(spans) == {
        "POST /v1/chat/completions",
        "gateway.receive",
        "gateway.admission",
        "gateway.upstream",
        "gateway.stream",
    }
    # one trace, the client's: the root is its span's child, the phases the root's
    assert {format(sp.context.trace_id, "032x") for sp in spans.values()} == {CLIENT_TRACE}
    assert format(root.parent.span_id, "016x") == CLIENT_SPAN
    assert all(sp.parent.span_id == root.context.span_id for n, sp in spans.items() if n != root.name)
    # the phases in order, each within the root
    order = [spans[n] for n in ("gateway.receive", "gateway.admission", "gateway.upstream", "gateway.stream")]
    assert all(a.end_time <= b.start_time for a, b in zip(order, order[1:]))
    assert root.start_time <= order[0].start_time and order[-1].end_time <= root.end_time
    attrs = dict(root.attributes)
    assert attrs["sparkcluster.key"] == "alice"
    assert attrs["gen_ai.request.model"] == "chat"
    assert attrs["sparkcluster.deployment"] == "chat@spark-a"
    assert attrs["http.response.status_code"] == 200 and attrs["sparkcluster.outcome"] == "200"
    assert (attrs["gen_ai.usage.input_tokens"], attrs["gen_ai.usage.output_tokens"]) == (PROMPT, WORDS)
    assert spans["gateway.upstream"].attributes["http.response.status_code"] == 200
    # the engine got the gateway's upstream span as its parent, in the client's trace (not the client's own span)
    version, trace_id, parent, flags = e.seen[-1]["headers"]["traceparent"].split("-")
    assert (version, trace_id, flags) == ("00", CLIENT_TRACE, "01")
    assert parent == format(spans["gateway.upstream"].context.span_id, "016x")
    # no body text anywhere: not the prompt, not a word of the answer
    values = [str(v) for sp in spans.values() for v in dict(sp.attributes).values()]
    assert not [v for v in values if SECRET_PROMPT in v or "w0" in v or "messages" in v]
    assert not any(sp.events for sp in spans.values())


def test_a_request_with_no_trace_of_its_own_starts_one_and_a_refusal_has_no_upstream_span(traced):
    e, sg, exported = traced
    r = httpx.post(
        f"{sg.url}/v1/chat/completions",
        json={"model": "elsewhere", "messages": [{"role": "user", "content": SECRET_PROMPT}]},
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=30,
    )
    assert r.status_code == 404
    spans = spans_of(exported, 3)
    assert set(spans) == {"POST /v1/chat/completions", "gateway.receive", "gateway.admission"}
    root = spans["POST /v1/chat/completions"]
    assert root.parent is None
    assert dict(root.attributes)["http.response.status_code"] == 404
    assert dict(root.attributes)["sparkcluster.key"] == "env:1"
    r = httpx.post(f"{sg.url}/v1/chat/completions", json={"model": "chat"}, timeout=30)  # no key
    assert r.status_code == 401
    assert not e.seen


def test_a_client_that_leaves_mid_stream_ends_its_trace_as_a_disconnect(traced):
    e, sg, exported = traced
    body = {"model": "chat", "stream": True, "hold": True, "messages": [{"role": "user", "content": SECRET_PROMPT}]}
    with httpx.stream(
        "POST", f"{sg.url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {NAMED}"}, timeout=30
    ) as r:
        assert r.status_code == 200
        next(r.iter_bytes())  # the first event is in: the client leaves
    spans = spans_of(exported, 5)
    e.release.set()
    root = dict(spans["POST /v1/chat/completions"].attributes)
    assert root["sparkcluster.outcome"] == "disconnect" and root["sparkcluster.key"] == "alice"
    assert spans["gateway.stream"].end_time <= spans["POST /v1/chat/completions"].end_time


def test_a_plain_request_passes_the_clients_traceparent_untouched_when_traces_are_off(tmp_path):
    e = Counting(["chat"])
    s = Served(e.app())
    gw = Gateway(config({"chat@spark-a": (e, s)}))
    assert gw.traces is None and gw.traces_said.startswith("off")
    sg = Served(gw.app())
    try:
        until(lambda: in_rotation(gw, "chat@spark-a"), what="in rotation")
        sent = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
        r = httpx.post(
            f"{sg.url}/v1/chat/completions",
            json={"model": "chat"},
            headers={"Authorization": f"Bearer {KEY}", "traceparent": sent},
            timeout=30,
        )
        assert r.status_code == 200 and e.seen[-1]["headers"]["traceparent"] == sent
        status = httpx.get(f"{sg.url}/gateway/status", headers={"Authorization": f"Bearer {KEY}"}).json()
        assert status["traces"] == "off: no OTLP endpoint configured"
    finally:
        sg.stop()
        s.stop()


def test_without_the_sdk_the_gateway_runs_and_says_traces_are_off(monkeypatch, capsys):
    """The image lacks OpenTelemetry: its import blocked (None in sys.modules makes `import` raise)."""
    for name in [m for m in sys.modules if m == "opentelemetry" or m.startswith("opentelemetry.")] + ["opentelemetry"]:
        monkeypatch.setitem(sys.modules, name, None)
    e = Counting(["chat"])
    s = Served(e.app())
    gw = Gateway(config({"chat@spark-a": (e, s)}, otlp_endpoint="http://127.0.0.1:4317"))
    assert gw.traces is None
    assert gw.traces_said.startswith("off: this image lacks the OpenTelemetry SDK or its OTLP exporter")
    sg = Served(gw.app())
    try:
        until(lambda: in_rotation(gw, "chat@spark-a"), what="in rotation")
        r = httpx.post(
            f"{sg.url}/v1/chat/completions", json={"model": "chat"}, headers={"Authorization": f"Bearer {KEY}"}
        )
        assert r.status_code == 200
        status = httpx.get(f"{sg.url}/gateway/status", headers={"Authorization": f"Bearer {KEY}"}).json()
        assert status["traces"] == gw.traces_said
    finally:
        sg.stop()
        s.stop()
    journal = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert any(j["event"] == "traces" and j["state"] == gw.traces_said for j in journal if "event" in j)


def test_nothing_of_opentelemetry_is_imported_when_traces_are_off():
    """Off (no endpoint): the gateway's modules, its app made and served's worth of set-up, import none of it."""
    code = (
        "import sys\n"
        "from sparkcluster.gateway.app import Gateway\n"
        "gw = Gateway({'port': 0, 'keys': ['k'], 'deployments': []})\n"
        "gw.app()\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')), gw.traces)\n"
    )
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert got.stdout.strip() == "[] None"


def test_an_unknown_protocol_or_no_endpoint_is_off_and_the_http_endpoint_gets_its_path():
    assert tracing.load({}) == (None, "off: no OTLP endpoint configured")
    assert tracing.load({"otlp_endpoint": "http://c:4317", "otlp_protocol": "thrift"})[0] is None
    assert tracing.probe_source("grpc") == (
        "import opentelemetry.sdk.trace, opentelemetry.exporter.otlp.proto.grpc.trace_exporter"
    )


def test_the_inventory_setting_reaches_the_config_and_the_plan_probes_the_image(make_plan):
    plan = make_plan(otlp_endpoint="http://collector:4317")
    assert plan.config()["otlp_endpoint"] == "http://collector:4317" and plan.config()["otlp_protocol"] == "grpc"
    step = next(s for s in plan.steps() if s.action == "traces")
    assert "python3" in step.detail and tracing.probe_source("grpc") in step.detail
    assert "otlp_endpoint" not in make_plan().config()
    assert not [s for s in make_plan().steps() if s.action == "traces"]
    # a change of endpoint is a new container (the gateway reads it once, at its start)
    assert plan.config_hash() != make_plan().config_hash()


class _Ran:
    def __init__(self, code: int, err: str = ""):
        self.exit_code, self.stderr, self.stdout = code, err, ""
        self.ok = code == 0
        self.commands: list[str] = []

    def run(self, cmd, timeout=30.0, warn=False):
        self.commands.append(cmd)
        return self


def test_gateway_up_says_when_the_image_lacks_the_sdk(make_plan):
    plan = make_plan(otlp_endpoint="http://collector:4317")
    # what python3 prints when a module is missing (CPython's ModuleNotFoundError message)
    host = _Ran(1, "ModuleNotFoundError: No module named 'opentelemetry'")
    said = deploy.traces_in_image(host, plan)
    assert said.startswith("traces OFF:") and "No module named 'opentelemetry'" in said
    assert host.commands[0].startswith("docker run --rm --network none --entrypoint python3 ")
    assert deploy.traces_in_image(_Ran(0), plan).startswith("the image has the OpenTelemetry SDK")


@pytest.fixture
def make_plan():
    def make(**gateway) -> rollout.GatewayPlan:
        inv = make_inventory({**inventory_dict(), "gateway": gateway})
        return rollout.make(inv, inv.head.name, [], {}, {}, ["k"], "vllm-image:1", None)

    return make


def test_the_tracing_module_is_shipped_and_opentelemetry_is_not():
    files = rollout.code_files()
    assert any(p.endswith("/sparkcluster/gateway/tracing.py") for p in files)
    assert not any("opentelemetry" in p for p in files)
