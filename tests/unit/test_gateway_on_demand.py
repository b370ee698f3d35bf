"""On demand through the gateway (issue 36 item 4) against stand-in engines and head agents on
127.0.0.1 (gateway_fakes.Engine answers `POST /wake` as the supervisor does): a request for a model
on standby wakes its head agent with the deployment's wake token and is held until the supervisor
says serving (models taking turns on one Spark: answered on its first try), or answered 503 with
Retry-After once the profile's start bound has passed; concurrent first requests start it once; a
wrong token starts nothing; a refused start is told with its reason and what else is in rotation on
those nodes. The plan and config carry the token only inside the 0600 config."""

from __future__ import annotations

import concurrent.futures
import json

import httpx
import pytest
from conftest import make_inventory
from gateway_fakes import KEY, Engine, Served, config, in_rotation, start_gateway, until

from sparkcluster.config import profile as profiles
from sparkcluster.deployment.deployments import Deployment
from sparkcluster.gateway import health, rollout
from sparkcluster.node import contract

BEARER = {"Authorization": f"Bearer {KEY}"}
TOKEN = "wake-token-of-vision-5c1e"


def _ask(url: str, model: str, timeout: float = 10) -> httpx.Response:
    body = {"model": model, "max_tokens": 1}
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=BEARER, timeout=timeout)


@pytest.fixture
def standby():
    """A deployment serving 'reasoner' on spark-a and one on demand ('vision', on standby) on spark-a
    too, behind one gateway."""
    a, b = Engine(["reasoner"]), Engine(["vision"], state=contract.STANDBY, wake_token=TOKEN)
    sa, sb = Served(a.app()), Served(b.app())
    cfg = config({"reasoner@spark-a": (a, sa), "vision@spark-a": (b, sb)})
    cfg["deployments"][0]["nodes"] = ["spark-a"]
    cfg["deployments"][1].update(nodes=["spark-a"], wake_token=TOKEN)
    gw, sg = start_gateway(cfg)
    until(lambda: in_rotation(gw, "reasoner@spark-a"), what="the serving deployment in rotation")
    until(lambda: gw.table.routes[1].wakeable, what="the standby deployment judged")
    yield gw, sg, a, b
    for s in (sg, sa, sb):
        s.stop()


def test_a_request_on_standby_wakes_it_and_is_held_until_it_serves(standby):
    gw, sg, a, b = standby
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        asked = pool.submit(lambda: _ask(sg.url, "vision", timeout=60))
        until(lambda: b.starts == 1, what="the wake")
        assert b.wakes[0] == TOKEN  # the deployment's token, and nothing of the client's key
        until(lambda: "starting" in gw.table.routes[1].reason, what="the supervisor's next state")
        assert not asked.done() and b.seen == []  # held: nothing reached the engine before it served
        b.state = contract.SERVING  # the engine answers: the supervisor says serving
        r = asked.result()
    assert r.status_code == 200 and r.json()["served_by"] == "vision"
    assert b.starts == 1 and len(b.seen) == 1
    metrics = httpx.get(f"{sg.url}/metrics", headers=BEARER).text
    assert 'sparkcluster_gateway_wakes_total{deployment="vision@spark-a",outcome="202"}' in metrics
    assert 'sparkcluster_gateway_held_for_start_total{outcome="served"} 1.0' in metrics


def test_past_the_profiles_start_bound_the_held_request_gets_503_with_retry_after(standby):
    gw, sg, _a, b = standby
    b.ready_timeout_s = 1.0  # the profile's ready_timeout_s, as its supervisor's policy carries it
    until(lambda: gw.table.routes[1].start_s == 1.0, what="the bound judged")
    r = _ask(sg.url, "vision")
    assert r.status_code == 503 and int(r.headers["retry-after"]) > 0
    said = r.json()["error"]["message"]
    assert "starting on demand (vision@spark-a)" in said or "starting" in said, said
    assert b.starts == 1 and b.seen == []
    metrics = httpx.get(f"{sg.url}/metrics", headers=BEARER).text
    assert 'sparkcluster_gateway_held_for_start_total{outcome="timed out"} 1.0' in metrics


def test_concurrent_first_requests_start_it_once(standby):
    _gw, sg, _a, b = standby
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        asked = [pool.submit(lambda: _ask(sg.url, "vision", timeout=60)) for _ in range(32)]
        until(lambda: b.starts == 1, what="the wake")
        b.state = contract.SERVING
        codes = [f.result().status_code for f in asked]
    assert codes == [200] * 32
    assert b.starts == 1


def test_a_wrong_wake_token_starts_nothing(standby):
    gw, sg, _a, b = standby
    b.wake_token = "another-token"  # `up` made a new one since the gateway's config was written
    r = _ask(sg.url, "vision")
    assert r.status_code == 503
    until(lambda: b.wakes, what="the wake")
    until(lambda: not gw.table.routes[1].waking, what="the wake's answer")
    assert b.starts == 0 and b.state == contract.STANDBY
    metrics = httpx.get(f"{sg.url}/metrics", headers=BEARER).text
    assert 'sparkcluster_gateway_wakes_total{deployment="vision@spark-a",outcome="401"}' in metrics
    assert 'sparkcluster_gateway_held_for_start_total{outcome="timed out"} 1.0' in metrics  # not held in vain


def test_a_refused_start_is_told_with_what_holds_the_memory(standby):
    gw, sg, _a, b = standby
    b.state = contract.REFUSED
    b.refusal = "spark-a: MemAvailable 12.0 GiB, the engine needs 24.2 GiB: 18.2 GiB short; held by processes 80.0 GiB"
    b.ready_timeout_s = 1.0  # nothing yields here (no rule): held until the start bound, then told why
    b.admits = False  # every wake's admission refused again, as the supervisor's with the memory still held
    until(lambda: "refused" in gw.table.routes[1].reason and gw.table.routes[1].start_s == 1.0, what="judged")
    r = _ask(sg.url, "vision")
    assert r.status_code == 503
    said = r.json()["error"]["message"]
    assert "its last start was refused: spark-a: MemAvailable 12.0 GiB" in said and "held by processes" in said
    assert "in rotation on spark-a: reasoner@spark-a (reasoner)" in said
    assert len(b.wakes) >= 1 and b.starts == 0  # asked again at every wake, refused while the memory is held


def test_a_route_not_on_demand_is_never_woken():
    e = Engine(["m"], state=contract.IDLE)
    s = Served(e.app())
    gw, sg = start_gateway(config({"m@spark-a": (e, s)}))
    try:
        until(lambda: "not serving" in gw.table.routes[0].reason, what="judged")
        assert _ask(sg.url, "m").status_code == 503
        assert e.wakes == [] and gw.table.to_wake("m", 1e9, 0) == []
    finally:
        sg.stop()
        s.stop()


def _report(state: str, **sup) -> dict:
    return {"ts": 1000.0, "supervisor": {"state": state, "updated": 999.0, "policy": {"interval_s": 2}, **sup}}


def test_standby_and_refused_verdicts_are_out_of_rotation_but_wakeable():
    v = health.judge(_report(contract.STANDBY))
    assert not v.up and v.wake and "on standby" in v.reason
    v = health.judge(_report(contract.REFUSED, refusal="spark-b: 4.0 GiB short"))
    assert not v.up and v.wake and v.reason == "its last start was refused: spark-b: 4.0 GiB short"
    for s in (contract.STARTING, contract.SERVING, contract.FAILED, contract.LIMIT):
        assert not health.judge(_report(s)).wake


# ---- the plan: the token goes into the 0600 config only -----------------------------------------


def _plan(tokens: dict[str, str]):
    inv = make_inventory()
    prof = profiles.load_profile("testbed")
    od = prof.model_copy(
        update={"name": "testbed-od", "on_demand": prof.on_demand.model_copy(update={"enabled": True})}
    )
    found = [Deployment("testbed", ("spark-head",)), Deployment("testbed-od", ("spark-worker",))]
    secrets = {"VLLM_API_KEY": "upstream-secret-1234"}
    return rollout.make(
        inv,
        "spark-head",
        found,
        {"testbed": prof, "testbed-od": od},
        secrets,
        ["client-key-abcdef"],
        "img",
        None,
        wake_tokens=tokens,
    )


def test_the_config_carries_the_wake_token_of_on_demand_deployments_only():
    p = _plan({"testbed-od@spark-worker": TOKEN})
    deps = p.config()["deployments"]
    assert "wake_token" not in deps[0] and deps[1]["wake_token"] == TOKEN
    assert deps[0]["nodes"] == ["spark-head"] and deps[1]["nodes"] == ["spark-worker"]
    shown = p.render() + p.as_json() + repr(p)
    assert TOKEN not in shown and "on demand: a request wakes it" in shown


def test_an_on_demand_route_without_its_token_is_said_in_the_plan():
    p = _plan({})
    assert "wake_token" not in json.dumps(p.config())
    assert "its wake token could not be read" in p.render()


def test_on_demand_needs_the_supervisor():
    from sparkcluster.errors import InputError

    text = (
        'model = "org/m"\n[image]\nbase = "vllm/vllm-openai"\ntag = "v0.32.0"\n'
        "[supervisor]\nenabled = false\n[on_demand]\nenabled = true\n"
    )
    with pytest.raises(InputError) as e:
        profiles.parse(text, "x")
    assert any("[on_demand] enabled needs the supervisor" in d for d in e.value.details)
    on = profiles.parse(
        text.replace("[supervisor]\nenabled = false\n", "").replace("true", "true\nidle_ttl_s = 30"), "x"
    )
    assert on.on_demand.enabled and on.on_demand.idle_ttl_s == 30


# ---- the two halves together: the gateway, a real agent endpoint and a real supervisor ---------


def test_the_gateway_wakes_a_real_supervisor_once_through_the_agents_endpoint(tmp_path, monkeypatch):
    """The agent's report server (node/memreport) with the real Supervisor's wake behind it, ticked
    as the agent's loop does; the engine a stand-in on its port, the server's process a sleep."""
    import socket
    import sys
    import threading
    import time

    from sparkcluster.node import memreport, supervisor
    from sparkcluster.node.journal import Journal, read_json

    engine = Engine(["vision"])
    served = Served(engine.app())
    for name in ("SERVE_LOG", "RECORD_PATH", "STATE_PATH", "SECRETS_PATH", "DESIRED_PATH", "WAKE_PATH"):
        monkeypatch.setattr(supervisor, name, str(tmp_path / name.lower()))
    (tmp_path / "wake_path").write_text(TOKEN)
    desired = {
        "generation": "g1",
        "argv": [sys.executable, "-c", "import time; time.sleep(120)"],
        "model": "vision",
        "port": served.port,
        "policy": {"on_demand": True, "idle_ttl_s": 600.0, "interval_s": 0.05},
    }
    (tmp_path / "desired_path").write_text(json.dumps(desired))
    journal = tmp_path / "journal"
    sup = supervisor.Supervisor({"node": "spark-a", "nodes": [], "peers": []}, Journal(str(journal)))
    GiB = 2**30
    monkeypatch.setattr(sup, "node_memory", lambda: {"spark-a": (121 * GiB, 100 * GiB)})
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    memreport.serve_reports(
        "127.0.0.1",
        port,
        lambda: {"node": "spark-a", "ts": time.time(), "supervisor": read_json(supervisor.STATE_PATH)},
        wake=sup.wake,
    )
    stopping = threading.Event()

    def loop():  # the agent's: tick, then wait for the interval or a wake
        from sparkcluster.node.agent import wait_or_wake

        while not stopping.is_set():
            sup.tick()
            wait_or_wake(stopping, 0.05, sup.woken)

    ticking = threading.Thread(target=loop, daemon=True)
    ticking.start()
    cfg = config({})
    cfg["deployments"] = [
        {
            "key": "vision@spark-a",
            "names": ["vision"],
            "upstream": served.url,
            "supervisor": f"http://127.0.0.1:{port}/",
            "nodes": ["spark-a"],
            "wake_token": TOKEN,
        }
    ]
    gw, sg = start_gateway(cfg)
    try:
        until(lambda: gw.table.routes[0].wakeable, what="on standby")
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            codes = list(pool.map(lambda _: _ask(sg.url, "vision").status_code, range(32)))
        assert codes == [200] * 32  # each held while the real supervisor started it, answered on its first try
        until(lambda: in_rotation(gw, "vision@spark-a"), timeout=30, what="the woken server in rotation")
        assert _ask(sg.url, "vision").status_code == 200
        events = [json.loads(x)["event"] for x in journal.read_text().splitlines()]
        assert events.count("woken on demand") == 1 and events.count("vllm serve started") == 1, events
    finally:
        stopping.set()
        ticking.join(10)
        sup.stop("test")
        sg.stop()
        served.stop()
