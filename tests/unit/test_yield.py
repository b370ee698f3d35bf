"""On demand across deployments (issue 60, item 4): a woken deployment whose start was refused for
memory gets room from an idle one on its nodes, chosen by the owner's rule (the inventory's
`[on_demand]`: "lru", "priority", `pinned`), and the 503 says which rule chose; the chosen one's head
agent stops its idle engine (`POST /yield`, its wake token) and goes back on standby."""

from __future__ import annotations

import json

import httpx
import pytest
from conftest import make_inventory, on_demand_supervisor
from gateway_fakes import KEY, Engine, Served, config, in_rotation, start_gateway, until
from pydantic import ValidationError

from sparkcluster.config import inventory as inventory_mod
from sparkcluster.gateway.health import REFUSED_REASON
from sparkcluster.gateway.routes import Route, Table
from sparkcluster.node import contract, memreport

TOKEN, OTHER = "wake-token-reasoner-71a2", "wake-token-vision-0c9d"


def _route(key, nodes=("spark-a",), up=True, token="t", in_flight=0, last_used=0.0):
    return Route(
        key,
        (key.split("@")[0],),
        "http://x",
        "http://x/report",
        nodes=nodes,
        up=up,
        wake_token=token,
        in_flight=in_flight,
        last_used=last_used,
    )


def test_the_rule_chooses_who_yields():
    woken = _route("vision@spark-a", up=False)
    old, recent = _route("old@spark-a", last_used=10.0), _route("recent@spark-a", last_used=50.0)
    busy = _route("busy@spark-a", in_flight=1)
    elsewhere = _route("far@spark-b", nodes=("spark-b",))
    always = _route("always@spark-a", token=None)  # not on demand: never stopped for another
    t = Table([woken, old, recent, busy, elsewhere, always], rule={"rule": "never"})
    assert t.yielder(woken, 100.0, 1.0) is None  # the default: nothing yields
    t.rule = {"rule": "lru"}
    y = t.yielder(woken, 100.0, 1.0)
    assert y.route is old and y.why.startswith("rule lru: old@spark-a is the least recently used")
    t.rule = {"rule": "lru", "pinned": ["old"]}
    assert t.yielder(woken, 100.0, 1.0).route is recent
    old.yield_asked = 99.5  # asked within the last look: not asked again
    t.rule = {"rule": "lru"}
    assert t.yielder(woken, 100.0, 1.0).route is recent
    t.rule = {"rule": "priority", "priority": {"vision": 5, "recent": 1, "old": 7}}
    y = t.yielder(woken, 200.0, 1.0)
    assert y.route is recent and y.why == "rule priority: recent@spark-a has priority 1, vision@spark-a 5"
    t.rule = {"rule": "priority", "priority": {"vision": 0}}  # nobody below the woken one
    assert t.yielder(woken, 200.0, 1.0) is None


def test_the_inventory_states_the_rule():
    data = __import__("conftest").inventory_dict()
    data["on_demand"] = {"rule": "lru", "pinned": ["qwen36-35b-nvfp4-mtp"]}
    inv = inventory_mod.Inventory.model_validate(data)
    assert inv.on_demand.rule == "lru" and inv.on_demand.pinned == ["qwen36-35b-nvfp4-mtp"]
    assert make_inventory().on_demand.rule == "never"
    data["on_demand"] = {"rule": "fifo"}
    with pytest.raises(ValidationError):
        inventory_mod.Inventory.model_validate(data)


def test_a_refused_wake_asks_the_idle_one_to_yield_and_says_which_rule_chose():
    a = Engine(["reasoner"], state=contract.SERVING, wake_token=TOKEN)
    b = Engine(["vision"], state=contract.REFUSED, wake_token=OTHER, refusal="spark-a: MemAvailable 9.0 GiB short")
    # refused again at every wake, and a start bound of 1 s: the held request ends as the 503 that says why
    b.admits, b.ready_timeout_s = False, 1.0
    sa, sb = Served(a.app()), Served(b.app())
    cfg = config({"reasoner@spark-a": (a, sa), "vision@spark-a": (b, sb)})
    cfg["deployments"][0].update(nodes=["spark-a"], wake_token=TOKEN)
    cfg["deployments"][1].update(nodes=["spark-a"], wake_token=OTHER)
    cfg["yield"] = {"rule": "lru", "priority": {}, "pinned": []}
    gw, sg = start_gateway(cfg)
    try:
        until(lambda: in_rotation(gw, "reasoner@spark-a"), what="the serving one in rotation")
        until(lambda: gw.table.routes[1].reason.startswith(REFUSED_REASON), what="the refused one judged")
        until(lambda: gw.table.routes[1].start_s == 1.0, what="its start bound judged")
        r = httpx.post(
            f"{sg.url}/v1/chat/completions",
            json={"model": "vision", "max_tokens": 1},
            headers={"Authorization": f"Bearer {KEY}"},
            timeout=10,
        )
        assert r.status_code == 503
        said = r.json()["error"]["message"]
        assert "an idle deployment yields (rule lru: reasoner@spark-a is the least recently used" in said, said
        until(lambda: a.yields == [TOKEN], what="the yield")
        assert a.state == contract.STANDBY and b.wakes and set(b.wakes) == {OTHER}
    finally:
        for s in (sg, sa, sb):
            s.stop()


def test_the_agents_yield_endpoint(tmp_path):
    import socket
    import urllib.request

    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    seen = []
    memreport.serve_reports(
        "127.0.0.1",
        port,
        lambda: {},
        wake=lambda t: (202, {}),
        yield_=lambda t: seen.append(t) or (202, {"state": "serving"}),
    )
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/yield", data=b"", method="POST", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    with urllib.request.urlopen(req, timeout=5) as r:
        assert r.status == 202 and json.loads(r.read()) == {"state": "serving"}
    assert seen == [TOKEN]


POLICY = {"on_demand": True, "idle_ttl_s": 900, "memory_need_fraction": 0.2, "interval_s": 0.1}


def test_the_supervisor_yields_an_idle_engine_and_keeps_a_busy_one(tmp_path, monkeypatch):
    sup = on_demand_supervisor(tmp_path, monkeypatch, POLICY, TOKEN)
    monkeypatch.setattr(sup, "node_memory", lambda: {"spark-head": (128 * 10**9, 100 * 10**9)})
    sup.tick()
    assert sup.yield_("wrong")[0] == 401
    assert sup.yield_(TOKEN)[0] == 409 and not sup.yielding.is_set()  # on standby: nothing to yield
    sup.wake(TOKEN)
    sup.tick()
    try:
        assert sup.proc is not None
        sup.watch.ready = True
        assert sup.yield_(TOKEN)[0] == 202
        assert not sup.yield_stop(busy=True) and sup.proc is not None  # a request runs: it keeps on
        sup.yield_(TOKEN)
        assert sup.yield_stop(busy=False)
        assert sup.proc is None and sup.state == contract.STANDBY
        events = [json.loads(x)["event"] for x in (tmp_path / "journal").read_text().splitlines()]
        assert "yield declined: the engine is busy or not serving yet" in events
        assert "yielded: stopped for another deployment" in events
    finally:
        sup.stop("test")
