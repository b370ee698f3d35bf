"""The gateway (issue 36) against stand-in engines and supervisor reports on 127.0.0.1: routing by
model and alias, keys, bodies and SSE streams passed through untouched and unbuffered, a client
leaving cancels its upstream request, the supervisor's verdict takes a deployment out of rotation
(503 with Retry-After and why), 404 naming what exists, /metrics, draining on stop."""

from __future__ import annotations

import json
import os
import threading

import httpx
import pytest
from gateway_fakes import GZIPPED, KEY, OTHER_KEY, Engine, Served, config, in_rotation, start_gateway, until

from sparkcluster.gateway import auth, health, proxy
from sparkcluster.gateway.app import FORWARDED
from sparkcluster.gateway.routes import Route, Table, Unavailable
from sparkcluster.node import contract

BEARER = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture
def two():
    """Two deployments (one model each, the first with an alias) behind one gateway."""
    a, b = Engine(["reasoner", "think"]), Engine(["vision"])
    sa, sb = Served(a.app()), Served(b.app())
    gw, sg = start_gateway(config({"reasoner@spark-a": (a, sa), "vision@spark-b": (b, sb)}))
    until(lambda: in_rotation(gw, "reasoner@spark-a") and in_rotation(gw, "vision@spark-b"), what="both in rotation")
    yield gw, sg, a, b
    a.release.set()
    b.release.set()
    for s in (sg, sa, sb):
        s.stop()


def test_routes_by_model_and_alias_with_bodies_untouched_and_the_deployments_key(two):
    _gw, sg, _a, b = two
    # an odd but valid body: key order, spacing and a unicode escape must reach the engine as sent
    raw = b'{ "messages": [{"role":"user","content":"caf\\u00e9"}],\n "model" : "vision", "max_tokens": 3 }'
    r = httpx.post(f"{sg.url}/v1/chat/completions", content=raw, headers={**BEARER, "content-type": "application/json"})
    assert r.status_code == 200 and r.json()["served_by"] == "vision"
    assert b.seen[-1]["body"] == raw
    assert b.seen[-1]["headers"]["authorization"] == "Bearer upstream-key-of-vision@spark-b"
    assert KEY not in json.dumps(b.seen[-1]["headers"])  # the client's key is never sent on
    r = httpx.post(f"{sg.url}/v1/completions", json={"model": "think", "prompt": "x"}, headers=BEARER)
    assert r.json() == {"path": "/v1/completions", "model": "think", "served_by": "reasoner"}
    assert not [s for s in b.seen if s["path"] == "/v1/completions"]


def test_an_encoded_answer_and_the_clients_headers_pass_untouched(two):
    _gw, sg, a, _b = two
    headers = {**BEARER, "user-agent": "owner-client/1.0", "x-trace": "abc"}
    with httpx.stream(
        "POST", f"{sg.url}/v1/chat/completions", json={"model": "reasoner", "gzip": True}, headers=headers
    ) as r:
        got = b"".join(r.iter_raw())  # the bytes as they came, not decoded
    assert r.headers["content-encoding"] == "gzip" and got == GZIPPED
    sent = a.seen[-1]["headers"]
    assert sent["user-agent"] == "owner-client/1.0" and sent["x-trace"] == "abc"
    # the gateway adds none of its own: what the client sent but the hop-by-hop ones, the key replaced
    mine = {"host", "content-length", "authorization", *proxy.HOP_BY_HOP}
    client_sent = {k.lower(): v for k, v in r.request.headers.items()}
    assert {k: v for k, v in sent.items() if k not in mine} == {k: v for k, v in client_sent.items() if k not in mine}


@pytest.mark.parametrize("path", FORWARDED)
def test_every_api_route_passes_through(two, path):
    _gw, sg, a, _b = two
    r = httpx.post(f"{sg.url}{path}", json={"model": "reasoner", "input": "x"}, headers=BEARER)
    assert r.status_code == 200 and r.json()["path"] == path
    assert a.seen[-1]["path"] == path


def test_keys_bearer_or_x_api_key_else_401(two):
    _gw, sg, _a, b = two
    body = {"model": "vision", "messages": []}
    assert httpx.post(f"{sg.url}/v1/chat/completions", json=body).status_code == 401
    wrong = httpx.post(f"{sg.url}/v1/chat/completions", json=body, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "authentication_error"
    assert httpx.post(f"{sg.url}/v1/chat/completions", json=body, headers={"x-api-key": OTHER_KEY}).status_code == 200
    anth = httpx.post(f"{sg.url}/v1/messages", json=body, headers={"x-api-key": "nope"})
    assert anth.status_code == 401 and anth.json()["type"] == "error"  # Anthropic's error shape
    assert httpx.get(f"{sg.url}/v1/models").status_code == 401
    assert httpx.get(f"{sg.url}/gateway/status").status_code == 401
    assert len(b.seen) == 1  # nothing unauthorized reached an engine


def test_auth_compares_every_key():
    assert auth.presented({"authorization": "Bearer k1"}) == "k1"
    assert auth.presented({"x-api-key": "k2"}) == "k2"
    assert auth.presented({"authorization": "Basic abc"}) is None
    assert auth.allowed("k2", ["k1", "k2"]) and not auth.allowed("k3", ["k1", "k2"]) and not auth.allowed(None, ["k1"])
    assert not auth.allowed("k1", [])


def test_unknown_model_is_404_naming_the_models(two):
    _gw, sg, _a, _b = two
    r = httpx.post(f"{sg.url}/v1/chat/completions", json={"model": "gpt-9"}, headers=BEARER)
    assert r.status_code == 404
    assert "gpt-9" in r.json()["error"]["message"] and "reasoner, think, vision" in r.json()["error"]["message"]
    assert httpx.post(f"{sg.url}/v1/chat/completions", content=b"not json", headers=BEARER).status_code == 400


def test_models_merged(two):
    _gw, sg, _a, _b = two
    data = httpx.get(f"{sg.url}/v1/models", headers=BEARER).json()["data"]
    assert [m["id"] for m in data] == ["reasoner", "think", "vision"]
    assert all(m.get("max_model_len") == 1024 for m in data)  # the engines' own entries


def test_a_restarting_deployment_gets_503_with_retry_after_and_the_other_keeps_answering(two):
    gw, sg, a, _b = two
    a.state = contract.RESTARTING
    a.causes = [{"kind": "wedged", "cause": "/health is 200 but a 1-token completion did not return"}]
    until(lambda: in_rotation(gw, "reasoner@spark-a", up=False), what="the wedged deployment out of rotation")
    r = httpx.post(f"{sg.url}/v1/chat/completions", json={"model": "reasoner"}, headers=BEARER)
    assert r.status_code == 503 and int(r.headers["retry-after"]) > 0
    assert "restarting" in r.json()["error"]["message"] and "did not return" in r.json()["error"]["message"]
    seen = len(a.seen)
    assert httpx.post(f"{sg.url}/v1/chat/completions", json={"model": "vision"}, headers=BEARER).status_code == 200
    assert len(a.seen) == seen
    status = httpx.get(f"{sg.url}/gateway/status", headers=BEARER).json()
    assert [x["in_rotation"] for x in status["routes"]] == [False, True]
    # what `sparkcluster status` reads without a key: names and rotation, no reason
    alive = httpx.get(f"{sg.url}/health").json()
    assert alive == {"status": "ok", "models": {"reasoner": False, "think": False, "vision": True}}
    a.state, a.causes = contract.SERVING, []
    until(lambda: in_rotation(gw, "reasoner@spark-a"), what="back in rotation")
    assert httpx.post(f"{sg.url}/v1/chat/completions", json={"model": "reasoner"}, headers=BEARER).status_code == 200


def test_sse_is_streamed_unbuffered(two):
    _gw, sg, _a, b = two
    with httpx.stream(
        "POST", f"{sg.url}/v1/chat/completions", json={"model": "vision", "stream": True}, headers=BEARER
    ) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        chunks = r.iter_raw()
        first = next(chunks)
        # the engine has not finished (it holds the rest until released): the first event came alone
        assert b'"n": 1' in first and not b.finished.is_set()
        b.release.set()
        rest = b"".join(chunks)
    assert rest.endswith(b"data: [DONE]\n\n") and b.finished.is_set()


def test_a_client_that_goes_away_cancels_its_upstream_request(two):
    gw, sg, a, _b = two
    with httpx.stream(
        "POST", f"{sg.url}/v1/messages", json={"model": "reasoner", "stream": True}, headers={"x-api-key": KEY}
    ) as r:
        next(r.iter_raw())
    # the client closed its connection mid-stream: the engine's stream is cut, never finished
    until(a.cancelled.is_set, what="the upstream stream to be cancelled")
    assert not a.finished.is_set()
    until(lambda: all(x.in_flight == 0 for x in gw.table.routes), what="nothing in flight")


def test_metrics_per_model(two):
    _gw, sg, a, _b = two
    httpx.post(f"{sg.url}/v1/chat/completions", json={"model": "vision"}, headers=BEARER)
    httpx.post(f"{sg.url}/v1/chat/completions", json={"model": "vision"}, headers={"x-api-key": "wrong"})
    text = httpx.get(f"{sg.url}/metrics", headers=BEARER).text
    assert 'sparkcluster_gateway_requests_total{code="200",endpoint="/v1/chat/completions",model="vision"} 1.0' in text
    assert 'sparkcluster_gateway_request_seconds_count{model="vision"} 1.0' in text
    assert 'sparkcluster_gateway_in_flight{model="vision"} 0.0' in text
    assert 'sparkcluster_gateway_route_up{deployment="reasoner@spark-a",model="think"} 1.0' in text
    assert 'code="401"' in text


def test_upstream_that_does_not_answer_is_502_and_counted():
    gone = Engine(["ghost"])
    s = Served(gone.app())
    gw, sg = start_gateway(config({"ghost@x": (gone, s)}))
    until(lambda: in_rotation(gw, "ghost@x"), what="in rotation")
    gw.table.routes[0].upstream = "http://127.0.0.1:9"  # discard: nothing listens
    try:
        r = httpx.post(f"{sg.url}/v1/chat/completions", json={"model": "ghost"}, headers=BEARER)
        assert r.status_code == 502 and "ghost@x" in r.json()["error"]["message"]
        assert (
            'sparkcluster_gateway_upstream_errors_total{kind="connect",model="ghost"} 1.0'
            in httpx.get(f"{sg.url}/metrics", headers=BEARER).text
        )
    finally:
        sg.stop()
        s.stop()


def test_two_deployments_serving_one_name_are_replicas():
    a, b = Engine(["same"]), Engine(["same"])
    sa, sb = Served(a.app()), Served(b.app())
    gw, sg = start_gateway(config({"same@spark-a": (a, sa), "same@spark-b": (b, sb)}))
    try:
        until(lambda: in_rotation(gw, "same@spark-a") and in_rotation(gw, "same@spark-b"), what="both in rotation")
        for _ in range(4):
            assert httpx.post(f"{sg.url}/v1/completions", json={"model": "same"}, headers=BEARER).status_code == 200
        assert len(a.seen) == 2 and len(b.seen) == 2  # in turn while neither is busy
        a.state = contract.LIMIT
        until(lambda: in_rotation(gw, "same@spark-a", up=False), what="a out")
        for _ in range(3):
            assert httpx.post(f"{sg.url}/v1/completions", json={"model": "same"}, headers=BEARER).status_code == 200
        assert len(a.seen) == 2 and len(b.seen) == 5
        assert len(httpx.get(f"{sg.url}/v1/models", headers=BEARER).json()["data"]) == 1
    finally:
        for s in (sg, sa, sb):
            s.stop()


def test_stopping_drains_the_streams_in_flight():
    e = Engine(["m"])
    s = Served(e.app())
    gw, sg = start_gateway(config({"m@x": (e, s)}), graceful_s=10)
    until(lambda: in_rotation(gw, "m@x"), what="in rotation")
    got: list[bytes] = []
    try:
        with httpx.stream(
            "POST", f"{sg.url}/v1/chat/completions", json={"model": "m", "stream": True}, headers=BEARER
        ) as r:
            chunks = r.iter_raw()
            got.append(next(chunks))
            stopper = threading.Thread(target=sg.stop)
            stopper.start()  # SIGTERM's path: no new connection, the stream in flight goes on
            until(lambda: sg.server.should_exit, what="the gateway to be stopping")
            e.release.set()
            got.extend(chunks)
        stopper.join(30)
        assert b"".join(got).endswith(b"data: [DONE]\n\n") and not stopper.is_alive()
    finally:
        e.release.set()
        s.stop()


def test_a_changed_config_is_read_again_keeping_the_verdicts(tmp_path):
    a, b = Engine(["one"]), Engine(["two"])
    sa, sb = Served(a.app()), Served(b.app())
    path = tmp_path / "gateway.json"
    path.write_text(json.dumps(config({"one@a": (a, sa)})))
    gw, sg = start_gateway(json.loads(path.read_text()), str(path))
    try:
        until(lambda: in_rotation(gw, "one@a"), what="one in rotation")
        path.write_text(json.dumps(config({"one@a": (a, sa), "two@b": (b, sb)})))
        os.utime(path, ns=(1, 1))  # a changed mtime, whatever the file system's resolution
        until(lambda: in_rotation(gw, "two@b"), what="the new route")
        assert httpx.post(f"{sg.url}/v1/completions", json={"model": "two"}, headers=BEARER).status_code == 200
    finally:
        for s in (sg, sa, sb):
            s.stop()


# ---- the supervisor's verdict, pure


def _report(state, age=0.0, **sup):
    return {"ts": 1000.0, "supervisor": {"state": state, "updated": 1000.0 - age, "policy": {"interval_s": 2}, **sup}}


def test_verdicts():
    assert health.judge(_report(contract.SERVING)).up
    assert not health.judge(None, "refused").up and "refused" in health.judge(None, "refused").reason
    assert not health.judge({"ts": 1.0}).up  # no server asked for
    stale = health.judge(_report(contract.SERVING, age=60))
    assert not stale.up and "stale" in stale.reason
    # the one-token probe runs beside the looks, so a probe into a stopped rank leaves the state
    # fresh (a look blocked on it once left it 17 s old and bounced the deployment out and in): a
    # state older than three looks and the reads' own bounds is stale, whatever probe_timeout_s says
    assert health.judge(_report(contract.SERVING, age=14)).up
    assert not health.judge(_report(contract.SERVING, age=25, policy={"interval_s": 2, "probe_timeout_s": 20})).up
    limit = health.judge(_report(contract.LIMIT, causes=[{"cause": "wedged twice"}]))
    assert not limit.up and "wedged twice" in limit.reason and limit.retry_after == 60
    unknown = health.judge(_report(contract.SERVING, memory_unknown={"spark-b": "no answer"}))
    assert not unknown.up and "spark-b" in unknown.reason
    for s in (
        contract.STARTING,
        contract.WAITING,
        contract.RESTARTING,
        contract.MEMORY,
        contract.FAILED,
        contract.IDLE,
    ):
        assert not health.judge(_report(s)).up


def test_pick_prefers_the_replica_with_fewer_in_flight():
    r1 = Route("a", ("m",), "http://a", "http://a/r", up=True, in_flight=3)
    r2 = Route("b", ("m",), "http://b", "http://b/r", up=True, in_flight=1)
    t = Table([r1, r2])
    assert t.pick("m") is r2 and t.pick("x") is None
    r1.up = r2.up = False
    r1.reason, r2.reason, r1.retry_after, r2.retry_after = "restarting", "starting", 10, 5
    out = t.pick("m")
    assert isinstance(out, Unavailable) and out.retry_after == 5 and out.reasons == ["a: restarting", "b: starting"]


def test_a_verdict_newer_than_serving_takes_it_out_while_the_supervisor_stops_the_engine():
    """The supervisor publishes its verdict before it stops the engine (which may take its stop
    grace, the state still "serving"): a cause newer than the serving state is out of rotation."""
    fresh = _report(contract.SERVING, since=900.0, causes=[{"ts": 950.0, "kind": "wedged", "cause": "no progress"}])
    v = health.judge(fresh)
    assert not v.up and v.reason.startswith("wedged: no progress")
    older = _report(contract.SERVING, since=960.0, causes=[{"ts": 950.0, "kind": "wedged", "cause": "no progress"}])
    assert health.judge(older).up  # a cause from before it served again
    off = _report(contract.SERVING, since=900.0, causes=[{"ts": 950.0, "kind": "wedged", "cause": "x"}])
    off["supervisor"]["policy"]["act"] = False
    assert health.judge(off).up  # supervision off in the profile: journalled, nothing is done


WEDGE = [{"ts": 950.0, "kind": "wedged", "cause": "no progress"}]


@pytest.mark.parametrize(
    "state, age, sup",
    [
        (contract.SERVING, 1.0, {"since": 900.0}),
        (contract.SERVING, 1.0, {"since": 900.0, "causes": WEDGE}),  # the verdict published, the stop under way
        (contract.SERVING, 1.0, {"since": 960.0, "causes": WEDGE}),  # a cause from before it served again
        (contract.SERVING, 60.0, {"since": 900.0}),  # stale
        (contract.SERVING, 1.0, {"since": 900.0, "memory_unknown": {"spark-worker": "no answer"}}),
        # the fabric holds it out, its engine left running (issue 75): out of rotation, a problem in status
        (contract.SERVING, 1.0, {"since": 900.0, "fabric_hold": {"since": 950.0, "why": "w: port 1 is 1: DOWN"}}),
        (contract.RESTARTING, 1.0, {"since": 955.0, "causes": WEDGE}),
        *((s, 1.0, {"since": 955.0, "causes": WEDGE}) for s in contract.FINAL),
    ],
)
def test_the_gateway_and_status_agree_on_a_verdict_at_the_same_instant(state, age, sup):
    """One judgement (contract.availability) for the gateway's rotation and `status`: at the instant
    the gateway takes a deployment out for its supervisor's sake, `status` names a supervisor problem
    and no longer shows it serving; while the gateway routes to it, `status` has nothing to say."""
    from sparkcluster.status import status

    report = _report(state, age=age, **sup)
    view = {**report["supervisor"], "age_s": age}  # what status reads: the same file, aged by the head's clock
    routed = health.judge(report)
    said = status.supervisor_problem(view)
    assert routed == contract.availability(contract.Supervised.of(view), age)
    assert (said is None) == routed.up
    if routed.up:
        assert status.supervisor_shown(view) == "serving"
    if routed.why == "stopping":  # the state file still says serving: neither of them does
        assert said == f"supervisor: {routed.reason}" and routed.reason.startswith("wedged: no progress")
        assert status.supervisor_shown(view) == "stopping after a verdict (was serving)"
    assert routed.final == (state in contract.FINAL)
    if routed.why == contract.FABRIC_HOLD:
        assert routed.retry_after == 30 and said == f"supervisor: {routed.reason}" and "port 1 is 1: DOWN" in said
        assert status.supervisor_shown(view) == "held: fabric unhealthy (engine serving)"


def test_the_state_file_is_read_through_its_record():
    """contract.Supervised: the fields every supervisor writes, typed; the rest kept as written; a
    stop in progress is one whatever its shape; a file of another kind or none is no record."""
    doc = {
        "state": "serving",
        "since": 960.0,  # served again after the verdict
        "updated": 1000.0,
        "generation": "g1",
        "pid": 7,
        "restarts": [950.0],
        "causes": [{"ts": 950.0, "kind": "dead", "cause": "exited"}, "not a cause"],
        "policy": {"interval_s": 2},
        "tokens_per_s": 12.5,
        "activity": "",
        "executor": "mp",
    }
    rec = contract.Supervised.of(doc)
    assert rec.kind is contract.State.SERVING and rec.generation == "g1" and rec.restarts == (950.0,)
    assert rec.causes == ({"ts": 950.0, "kind": "dead", "cause": "exited"},) and rec.last_cause == "exited"
    assert rec.bounds.interval_s == 2 and rec.tokens_per_s == 12.5 and rec.rest == {"executor": "mp"}
    assert rec.age(1003.0) == 3.0 and rec.age(None) is None and not rec.stale(3.0) and rec.stale(60.0)
    assert not rec.is_stopping() and contract.Supervised.of({**doc, "stopping": {"grace_s": 5}}).is_stopping()
    assert contract.Supervised.of({**doc, "stopping": {}}).is_stopping() is False
    assert contract.Supervised.of({**doc, "state": "gone"}).kind is None
    assert contract.Supervised.of(None) is None and contract.Supervised.of([]) is None
    assert contract.availability(None) == contract.NOT_ASKED and not contract.NOT_ASKED.up


def test_a_forwarded_post_goes_to_its_forwarder_and_everything_else_through_starlette(two):
    """The app dispatches a POST to a forwarded path before Starlette (perf/gateway.md, "What costs
    most"); what Starlette answered before, it still answers."""
    _gw, sg, _a, b = two
    r = httpx.post(f"{sg.url}/v1/messages", json={"model": "vision"})  # no key: refused in Anthropic's shape
    assert r.status_code == 401 and r.json()["type"] == "error" and r.headers["www-authenticate"] == "Bearer"
    r = httpx.post(f"{sg.url}/v1/embeddings", json={"model": "vision", "input": "x"}, headers=BEARER)
    assert r.status_code == 200 and b.seen[-1]["path"] == "/v1/embeddings"
    assert httpx.get(f"{sg.url}/v1/chat/completions", headers=BEARER).status_code == 405
    assert httpx.post(f"{sg.url}/v1/unknown", json={"model": "vision"}, headers=BEARER).status_code == 404
    assert httpx.get(f"{sg.url}/health").json()["status"] == "ok"
