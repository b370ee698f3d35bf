"""An upgrade's hold on the gateway (issue 39 item 5, deployment/gateway_hold): traffic for the deployment being
upgraded is drained and held, not dropped. The table keeps a held deployment out of every pick; the
gateway (stand-in engine on 127.0.0.1) keeps a request for it waiting while held and sends it once the
config no longer holds it; the controller's GatewayHold writes and removes the hold in the gateway's
config and waits until the gateway confirms it with nothing in flight."""

from __future__ import annotations

import contextlib
import io
import json
import os
import tarfile
import threading
import time

import docker.errors
import httpx
import pytest
from gateway_fakes import KEY, Engine, Served, config, in_rotation, start_gateway, until

from sparkcluster.container.spec import files_tar
from sparkcluster.deployment import gateway_hold, gateway_registry
from sparkcluster.deployment.gateway_registry import CONFIG_PATH
from sparkcluster.gateway import deploy
from sparkcluster.gateway.routes import Route, Table, Unavailable
from sparkcluster.labels import CONFIG_LABEL

BEARER = {"Authorization": f"Bearer {KEY}"}


def test_a_held_deployment_is_picked_by_no_request_until_its_hold_ends():
    table = Table.from_config(
        {
            "deployments": [{"key": "m@a", "names": ["m"], "upstream": "http://a", "supervisor": "http://a/r"}],
            "held_until": {"m@a": 1060.0},
        }
    )
    (r,) = table.routes
    r.up = True
    got = table.pick("m", now=1001.0)
    assert isinstance(got, Unavailable) and got.held_until == 1060.0 and "held for an upgrade" in got.reasons[0]
    assert table.pick("m", now=1061.0) is r  # the hold's bound ended: routed as usual
    free = Table([Route("m@a", ("m",), "http://a", "http://a/r", up=True)])
    assert free.pick("m", now=1001.0).key == "m@a"


def test_the_gateway_holds_a_request_and_sends_it_once_released(tmp_path):
    e = Engine(["m"])
    s = Served(e.app())
    path = tmp_path / "gateway.json"
    doc = config({"m@a": (e, s)})
    path.write_text(json.dumps(doc))
    gw, sg = start_gateway(json.loads(path.read_text()), str(path))
    e.release.set()  # the stand-in answers at once
    answered: list[httpx.Response] = []
    try:
        until(lambda: in_rotation(gw, "m@a"), what="in rotation")
        path.write_text(json.dumps({**doc, "held_until": {"m@a": time.time() + 60}}))
        os.utime(path, ns=(1, 1))
        until(lambda: gw.table.routes[0].held_until > time.time(), what="the hold read")
        asker = threading.Thread(
            target=lambda: answered.append(
                httpx.post(f"{sg.url}/v1/completions", json={"model": "m"}, headers=BEARER, timeout=30)
            )
        )
        asker.start()
        status = httpx.get(f"{sg.url}/gateway/status", headers=BEARER).json()["routes"][0]
        assert status["held_s"] > 0 and status["in_flight"] == 0, status
        asker.join(1.0)
        assert asker.is_alive() and not answered  # waiting, not refused with a 503
        path.write_text(json.dumps(doc))
        os.utime(path, ns=(2, 2))
        asker.join(15)
        assert answered and answered[0].status_code == 200, answered
    finally:
        for x in (sg, s):
            x.stop()


def test_a_reload_of_the_config_keeps_the_holds_deadline(tmp_path):
    """The hold's bound counts from when the hold began: a config written again meanwhile (`gateway
    up`, a wake token handed over) is read again, and the deadline stays where it was."""
    e = Engine(["m"])
    s = Served(e.app())
    path = tmp_path / "gateway.json"
    deadline = time.time() + 60
    doc = config({"m@a": (e, s)}, held_until={"m@a": deadline})
    path.write_text(json.dumps(doc))
    gw, sg = start_gateway(json.loads(path.read_text()), str(path))
    try:
        assert gw.table.routes[0].held_until == deadline
        time.sleep(0.05)  # a later read: a bound counted from it would end later
        path.write_text(json.dumps({**doc, "keys": [*doc["keys"], "third-client-key-000"]}))
        os.utime(path, ns=(1, 1))
        until(lambda: "third-client-key-000" in gw.keys, what="the config read again")
        assert gw.table.routes[0].held_until == deadline
    finally:
        for x in (sg, s):
            x.stop()


class FakeGateway:
    """The gateway's container as GatewayHold reaches it: its config file, and its status, which
    confirms a hold from the second look with one request still in flight at the first."""

    def __init__(self):
        self.doc = {"port": 4000, "keys": [KEY], "deployments": [{"key": "m@a"}]}
        self.looks = 0

    def read(self, api, container):
        return json.loads(json.dumps(self.doc))

    def write(self, api, container, doc):
        self.doc = doc

    def run_in(self, api, container, argv, warn=False):
        if argv[-1] == gateway_hold.CLOCK:  # the gateway node's clock
            return type("R", (), {"stdout": "5000.5\n"})()
        self.looks += 1
        held = "m@a" in (self.doc.get("held_until") or {})
        route = {"deployment": "m@a", "held_s": 1799.0 if held and self.looks > 1 else 0.0, "in_flight": 0}
        if self.looks == 2:
            route["in_flight"] = 1
        return type("R", (), {"stdout": json.dumps({"routes": [route]})})()


def test_hold_waits_for_the_gateway_to_confirm_with_nothing_in_flight_and_release_removes_it(monkeypatch):
    fake = FakeGateway()
    monkeypatch.setattr(gateway_registry, "read_doc", fake.read)
    monkeypatch.setattr(gateway_registry, "write_doc", fake.write)
    monkeypatch.setattr(gateway_hold, "run_in", fake.run_in)
    monkeypatch.setattr(gateway_hold, "LOOK_S", 0.01)
    h = gateway_hold.GatewayHold(lambda: contextlib.nullcontext("api"), "sparkcluster-gateway", "m@a")
    said = h.hold()
    # the deadline on the gateway node's clock: the same however often the gateway reads its config
    assert fake.doc["held_until"] == {"m@a": 5000.5 + gateway_hold.HOLD_S} and fake.looks == 3, (fake.looks, said)
    assert "none in flight" in said
    assert "again" in h.release() and fake.doc["held_until"] == {}
    assert fake.doc["keys"] == [KEY]  # the rest of the config kept as it was


def test_find_returns_the_gateway_routing_the_deployment_and_none_elsewhere(monkeypatch):
    from types import SimpleNamespace

    from conftest import make_inventory

    from sparkcluster.remote import fanout

    closed: list[str] = []
    host = SimpleNamespace(docker=lambda: SimpleNamespace(api="api-b"), close=lambda: closed.append("b"))
    monkeypatch.setattr(fanout, "connect_all", lambda inv, nodes: SimpleNamespace(succeeded={"spark-worker": host}))
    monkeypatch.setattr(
        gateway_registry, "find", lambda api, cluster: {"State": "running", "Names": ["/sparkcluster-gateway"]}
    )
    monkeypatch.setattr(gateway_registry, "read_doc", lambda api, c: {"deployments": [{"key": "m@spark-worker"}]})
    inv = make_inventory()
    got = gateway_hold.find(inv, "m@spark-worker")
    assert got is not None and [(h.container, h.node, h.deployment) for h in got.each] == [
        ("sparkcluster-gateway", "spark-worker", "m@spark-worker")
    ]
    assert gateway_hold.find(inv, "other@spark-head") is None  # the gateway there routes no such deployment
    assert closed == ["b", "b"]  # the look's connections are closed; each hold opens its own


def test_gateway_up_keeps_the_running_gateways_holds_and_their_deadlines(monkeypatch):
    """`gateway up` during an upgrade writes a new config: the hold in the running gateway's config
    (its deadline unchanged) is in it, whether the container is kept or replaced; read again just
    before the write, so a hold released since the plan stays released."""
    from conftest import make_inventory

    from sparkcluster.config import profile as profiles
    from sparkcluster.deployment.deployments import Deployment
    from sparkcluster.gateway import rollout
    from sparkcluster.labels import CONFIG_LABEL

    inv = make_inventory()
    node = inv.nodes[0].name
    key = f"testbed-single@{node}"
    held = {key: 5000.5}
    running_doc = {"keys": [KEY], "deployments": [{"key": key}], "held_until": held}
    written: list[dict] = []
    monkeypatch.setattr(gateway_registry, "read_doc", lambda api, c: json.loads(json.dumps(running_doc)))
    monkeypatch.setattr(gateway_registry, "write_doc", lambda api, c, doc: written.append(doc))
    monkeypatch.setattr(deploy, "create", lambda api, plan: written.append(plan.config()))
    monkeypatch.setattr(deploy, "halt", lambda api, cid: None)
    monkeypatch.setattr(deploy, "remove", lambda api, cid: None)
    monkeypatch.setattr(deploy, "port_holder", lambda host, port: "")
    monkeypatch.setattr(deploy, "wait_ready", lambda api, c, address, plan: {"routes": []})

    def plan(running):
        found, loaded = (
            [Deployment("testbed-single", (node,))],
            {"testbed-single": profiles.load_profile("testbed-single")},
        )
        return rollout.make(
            inv, node, found, loaded, {}, [KEY], "img:1", running, held=gateway_registry.holds("api", running)
        )

    same = {"Id": "c1", "State": "running", "Labels": {CONFIG_LABEL: plan(None).config_hash()}}
    kept = plan(same)
    assert [s.action for s in kept.steps()] == ["config", "ready"] and f"the hold of {key} kept" in kept.render()
    deploy.apply("api", kept, host=type("H", (), {"address": "h"})())
    assert written[-1]["held_until"] == held and written[-1]["deployments"][0]["key"] == key

    other = {"Id": "c1", "State": "running", "Labels": {CONFIG_LABEL: "0000"}}
    replaced = plan(other)
    assert [s.action for s in replaced.steps()][0] == "replace"
    deploy.apply("api", replaced, host=type("H", (), {"address": "h"})())
    assert written[-1]["held_until"] == held  # the new container's config carries the hold

    released = plan(same)
    running_doc.pop("held_until")  # the upgrade released it after the plan was made
    deploy.apply("api", released, host=type("H", (), {"address": "h"})())
    assert "held_until" not in written[-1]


class GatewayNode:
    """The Engine API of the gateway's node, as `gateway up` (deploy) and GatewayHold reach it: its
    containers by id or name, each with its files and whether it runs; `while_draining` runs inside
    `stop`, while the old gateway drains its streams and still runs, `once_stopped` right after."""

    def __init__(self, name: str, doc: dict):
        self.boxes = {"c1": {"name": name, "files": {CONFIG_PATH: json.dumps(doc)}, "running": True}}
        self.while_draining = self.once_stopped = lambda: None
        self._execs: dict[str, tuple[str, list[str]]] = {}

    def box(self, ref: str) -> dict:
        for cid, b in self.boxes.items():
            if ref in (cid, b["name"]):
                return b
        raise docker.errors.NotFound(f"No such container: {ref}")

    def doc(self, ref: str) -> dict:
        return json.loads(self.box(ref)["files"][CONFIG_PATH])

    def get_archive(self, ref, path):  # a stopped container's files are read too, as Docker's are
        b = self.box(ref)
        if path not in b["files"]:
            raise docker.errors.NotFound(f"Could not find the file {path} in container {ref}")
        return [files_tar({path.rsplit("/", 1)[-1]: b["files"][path]})], {}

    def put_archive(self, ref, path, data):
        b = self.box(ref)
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for m in tar.getmembers():
                if m.isfile():
                    b["files"]["/" + m.name] = tar.extractfile(m).read().decode()

    def exec_create(self, ref, argv, environment=None):
        if not self.box(ref)["running"]:
            raise docker.errors.APIError(f"409 Client Error: Conflict (container {ref} is not running)")
        self._execs[str(len(self._execs))] = (ref, argv)
        return {"Id": str(len(self._execs) - 1)}

    def exec_start(self, exec_id):
        ref, argv = self._execs[exec_id]
        files = self.box(ref)["files"]
        if argv[:2] == ["mv", "-f"]:
            files[argv[3]] = files.pop(argv[2])
            return b""
        if argv[0] == "cat":
            return files[argv[1]].encode()
        if argv[-1] == gateway_hold.CLOCK:
            return b"5000.5\n"
        # its /gateway/status: a hold in its config is confirmed, nothing in flight
        doc = json.loads(files[CONFIG_PATH])
        routes = [
            {"deployment": d["key"], "held_s": 1.0 if d["key"] in doc.get("held_until", {}) else 0.0, "in_flight": 0}
            for d in doc["deployments"]
        ]
        return json.dumps({"routes": routes}).encode()

    def exec_inspect(self, exec_id):
        return {"ExitCode": 0}

    def inspect_container(self, ref):
        return {"Config": {"StopTimeout": self.box(ref).get("stop_timeout", 3605)}}

    def stop(self, ref, timeout=None):
        # Docker's own wait and docker-py's HTTP wait both follow `timeout` (else 10 s + the client's)
        self.stop_timeouts = [*getattr(self, "stop_timeouts", []), timeout]
        self.while_draining()
        self.box(ref)["running"] = False
        self.once_stopped()

    def remove_container(self, ref, force=False):
        self.boxes = {cid: b for cid, b in self.boxes.items() if b is not self.box(ref)}

    def create_host_config(self, **kwargs):
        return kwargs

    def create_container(self, host_config=None, **kwargs):
        self.boxes["c2"] = {"name": kwargs["name"], "files": {}, "running": False}
        return {"Id": "c2"}

    def start(self, ref):
        self.box(ref)["running"] = True


def test_a_hold_taken_or_released_while_gateway_up_replaces_the_gateway_is_what_the_new_one_gets(monkeypatch):
    """`gateway up` that replaces the container stops the old one first, and its streams drain for
    up to drain_s: an upgrade's hold or release written into the old gateway meanwhile is what the
    new container's config carries (its deadline unchanged), never the holds as the plan read them
    before the drain. A write once the old gateway has stopped fails (the upgrade's step says so)."""
    from conftest import make_inventory

    from sparkcluster.config import profile as profiles
    from sparkcluster.deployment.deployments import Deployment
    from sparkcluster.gateway import rollout
    from sparkcluster.labels import gateway_name

    inv = make_inventory()
    node = inv.nodes[0].name
    key = f"testbed-single@{node}"
    name = gateway_name(inv.cluster.name)
    host = type("H", (), {"address": "h"})()
    monkeypatch.setattr(deploy, "port_holder", lambda host, port: "")
    monkeypatch.setattr(deploy, "wait_ready", lambda api, c, address, plan: {"routes": []})
    monkeypatch.setattr(gateway_hold, "LOOK_S", 0.01)
    deadline = 5000.5 + gateway_hold.HOLD_S

    def replace(held: dict, during, after=lambda upgrade: None) -> GatewayNode:
        doc = {"port": 4000, "keys": [KEY], "deployments": [{"key": key}], **({"held_until": held} if held else {})}
        api = GatewayNode(name, doc)
        upgrade = gateway_hold.GatewayHold(lambda: contextlib.nullcontext(api), name, key)
        api.while_draining, api.once_stopped = (lambda: during(upgrade)), (lambda: after(upgrade))
        running = {"Id": "c1", "State": "running", "Labels": {CONFIG_LABEL: "0000"}}  # another image: replaced
        found, loaded = (
            [Deployment("testbed-single", (node,))],
            {"testbed-single": profiles.load_profile("testbed-single")},
        )
        plan = rollout.make(
            inv, node, found, loaded, {}, [KEY], "img:1", running, held=gateway_registry.holds(api, running)
        )
        assert plan.held == held and [s.action for s in plan.steps()][0] == "replace"
        deploy.apply(api, plan, host)
        assert list(api.boxes) == ["c2"] and api.box(name)["running"]
        assert api.stop_timeouts == [3605]  # the drain's own bound (an hour's --drain-s), not docker-py's 10 s
        return api

    api = replace({key: deadline}, during=lambda upgrade: upgrade.release())
    assert "held_until" not in api.doc(name)  # released while the old one drained: not held again

    api = replace({}, during=lambda upgrade: upgrade.hold())
    assert api.doc(name)["held_until"] == {key: deadline}  # taken while it drained: carried, same deadline

    refused: list[Exception] = []

    def too_late(upgrade):
        try:
            upgrade.release()
        except docker.errors.APIError as e:
            refused.append(e)

    replace({key: deadline}, during=lambda upgrade: None, after=too_late)
    assert refused and "not running" in str(refused[0])  # said, not silently lost


def test_every_gateway_routing_the_deployment_is_held_and_each_released_even_when_one_fails(monkeypatch):
    """An owner may run a gateway on each node: an upgrade holds all of them. A release that fails
    (its node went away) does not keep the others held, and says when its hold ends and how to end
    it now."""
    from types import SimpleNamespace

    from conftest import make_inventory

    from sparkcluster.errors import SparkError
    from sparkcluster.remote import fanout

    hosts = {
        n: SimpleNamespace(docker=lambda n=n: SimpleNamespace(api=n), close=lambda: None)
        for n in ("spark-head", "spark-worker")
    }
    monkeypatch.setattr(fanout, "connect_all", lambda inv, nodes: SimpleNamespace(succeeded=hosts))
    monkeypatch.setattr(gateway_registry, "find", lambda api, cluster: {"State": "running", "Names": [f"/gw-{api}"]})
    monkeypatch.setattr(gateway_registry, "read_doc", lambda api, c: {"deployments": [{"key": "m@spark-head"}]})
    got = gateway_hold.find(make_inventory(), "m@spark-head")
    assert [h.node for h in got.each] == ["spark-head", "spark-worker"]

    calls: list[str] = []

    def fake(h, ok=True):
        h.hold = lambda: calls.append(f"hold {h.node}") or f"held by {h.container}"

        def release():
            calls.append(f"release {h.node}")
            if not ok:
                raise SparkError(f"{h.node} does not answer")
            return f"{h.container} sends requests again"

        h.release = release

    fake(got.each[0], ok=False)
    fake(got.each[1])
    assert got.hold() == "held by gw-spark-head; held by gw-spark-worker"
    with pytest.raises(SparkError) as e:
        got.release()
    assert calls == ["hold spark-head", "hold spark-worker", "release spark-head", "release spark-worker"]
    assert "gw-spark-head on spark-head: spark-head does not answer" in e.value.message
    assert "gw-spark-worker" not in e.value.message and "30 min after it began" in e.value.message
    assert "gateway down" in e.value.fix
