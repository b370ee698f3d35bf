"""On demand (issue 36 item 4), the node's half: a server `up` handed over on demand stays on
standby (no engine, nothing held); a wake with the deployment's token starts it once however many
come; every start is admitted against each node's memory (the restart wait's arithmetic) or refused
naming what holds the memory; an engine idle but for the supervisor's own probes is stopped after
its TTL and is back on standby; the agent's `POST /wake` is its only input."""

from __future__ import annotations

import json
import socket
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import on_demand_supervisor

from sparkcluster.node import contract, memreport, readings, supervisor
from sparkcluster.node.journal import Journal
from sparkcluster.node.verdict import Look, Watch, admission, idle_for

GiB = 2**30
TOTAL = 121 * GiB  # a Spark's unified pool (MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark#259)
CAPTURED = Path(__file__).parents[1] / "captured"
TOKEN = "wake-token-3f9c2e7a"
POLICY = {"on_demand": True, "idle_ttl_s": 60.0, "memory_need_fraction": 0.2, "memory_wait_s": 3600.0}
SUCCESS = "vllm:request_success_total"


def _on_demand(tmp_path, monkeypatch, memory=None, policy=None):
    sup = on_demand_supervisor(tmp_path, monkeypatch, {**POLICY, **(policy or {})}, TOKEN)
    need = int(0.2 * TOTAL)
    memory = memory if memory is not None else {"spark-head": (TOTAL, need + 20 * GiB)}

    def node_memory():
        sup.held = {"spark-head": {"processes": 70 * GiB, "shared memory": 3 * GiB}}
        return dict(memory)

    monkeypatch.setattr(sup, "node_memory", node_memory)
    return sup, memory


def _events(tmp_path) -> list[str]:
    return [json.loads(x)["event"] for x in (tmp_path / "journal").read_text().splitlines()]


def test_up_on_demand_leaves_the_server_on_standby_with_nothing_running(tmp_path, monkeypatch):
    sup, _ = _on_demand(tmp_path, monkeypatch)
    sup.tick()
    sup.tick()
    assert sup.proc is None and sup.state == contract.STANDBY
    state = json.loads(Path(supervisor.STATE_PATH).read_text())
    assert state["state"] == "standby" and state["pid"] is None and state["generation"] == "g1"
    assert "vllm serve started" not in _events(tmp_path)


def test_a_wake_needs_the_deployments_token(tmp_path, monkeypatch):
    sup, _ = _on_demand(tmp_path, monkeypatch)
    sup.tick()
    assert sup.wake("")[0] == 401 and sup.wake("wake-token-3f9c2e7b")[0] == 401
    assert not sup.woken.is_set()
    code, doc = sup.wake(TOKEN)
    assert code == 202 and doc == {"state": "standby"} and sup.woken.is_set()


def test_a_wake_for_a_server_not_on_demand_changes_nothing(tmp_path, monkeypatch):
    sup, _ = _on_demand(tmp_path, monkeypatch, policy={"on_demand": False})
    try:
        sup.tick()  # an ordinary server: started at once
        assert sup.proc is not None
        assert sup.wake(TOKEN)[0] == 409
    finally:
        sup.stop("test")


def test_concurrent_wakes_start_the_engine_once(tmp_path, monkeypatch):
    sup, _ = _on_demand(tmp_path, monkeypatch)
    sup.tick()
    try:
        answers: list[int] = []
        threads = [threading.Thread(target=lambda: answers.append(sup.wake(TOKEN)[0])) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert answers == [202] * 16
        sup.tick()
        assert sup.proc is not None and sup.state == contract.STARTING
        first = sup.proc.pid
        for _ in range(3):  # more wakes while it starts: nothing new
            sup.wake(TOKEN)
            monkeypatch.setattr(sup, "look", lambda d, p: Look(now=__import__("time").time(), alive=True))
            sup.tick()
        assert sup.proc.pid == first and not sup.woken.is_set()
        assert _events(tmp_path).count("vllm serve started") == 1
        assert _events(tmp_path).count("woken on demand") == 1
    finally:
        sup.stop("test")


def test_a_start_that_does_not_fit_is_refused_naming_what_holds_the_memory(tmp_path, monkeypatch):
    need = int(0.2 * TOTAL)
    memory = {"spark-head": (TOTAL, need + 20 * GiB), "spark-worker": (TOTAL, need + 1 * GiB)}
    sup, memory = _on_demand(tmp_path, monkeypatch, memory)
    sup.tick()
    sup.wake(TOKEN)
    sup.tick()
    assert sup.proc is None and sup.state == contract.REFUSED
    state = json.loads(Path(supervisor.STATE_PATH).read_text())
    said = state["refusal"]
    assert said.startswith("spark-worker: MemAvailable 25.2 GiB, the engine needs 24.2 GiB") and "5.0 GiB short" in said
    assert "spark-head" not in said  # a node that fits is not named
    sup.tick()  # no new wake: it stays refused, nothing starts
    assert sup.proc is None and _events(tmp_path).count("start refused: not enough memory") == 1
    # the next wake asks again: memory came back, the start is admitted
    memory["spark-worker"] = (TOTAL, need + 8 * GiB)
    sup.wake(TOKEN)
    try:
        sup.tick()
        assert sup.proc is not None and sup.state == contract.STARTING
        assert "refusal" not in json.loads(Path(supervisor.STATE_PATH).read_text())
    finally:
        sup.stop("test")


def test_the_refusal_names_the_holders_largest_first():
    need = int(0.2 * TOTAL)
    held = {"b": {"processes": 80 * GiB, "shared memory": 2 * GiB, "kernel, drivers and GPU": 0}}
    ok, why = admission({"a": (TOTAL, 100 * GiB), "b": (TOTAL, need)}, held, contract.Policy.of(POLICY))
    assert not ok
    assert why.endswith("6.0 GiB short; held by processes 80.0 GiB, shared memory 2.0 GiB"), why
    ok, why = admission({"a": (TOTAL, 100 * GiB), "b": (None, None)}, {}, contract.Policy.of(POLICY))
    assert not ok and why == "b: memory unknown (no report)"  # unknown is never "enough"
    assert admission({"a": (TOTAL, 100 * GiB)}, {}, contract.Policy.of(POLICY)) == (True, "")


def test_what_holds_memory_from_a_real_meminfo():
    text = (CAPTURED / "host-meminfo.txt").read_text()
    got = readings.held(text)
    m = readings.meminfo(text)
    assert got["processes"] == m["AnonPages"] and got["shared memory"] == m["Shmem"]
    assert got["kernel, drivers and GPU"] == m["MemTotal"] - m["MemAvailable"] - m["AnonPages"] - m["Shmem"]


def _metrics(running: float, served: float) -> dict[str, float]:
    return {"vllm:num_requests_running": running, "vllm:num_requests_waiting": 0.0, SUCCESS: served}


def test_idle_counts_the_supervisors_own_probes_as_nothing():
    w = Watch(started=0.0, ready=True)
    assert idle_for(w, Look(now=10, alive=True, progress=_metrics(0, 22))) == 0
    # its own probe's answer taken at this look: it returned before this look's reading, so the
    # counter moved by one in it, still idle
    assert idle_for(w, Look(now=25, alive=True, progress=_metrics(0, 23), probe="")) == 15
    assert idle_for(w, Look(now=40, alive=True, progress=_metrics(0, 23))) == 30
    assert idle_for(w, Look(now=55, alive=True, progress=_metrics(0, 24), probe="")) == 45
    # a short request between two looks: the counter moved by more than the probes
    assert idle_for(w, Look(now=70, alive=True, progress=_metrics(0, 26))) == 0
    # a request running at a look
    assert idle_for(w, Look(now=85, alive=True, progress=_metrics(1, 26))) == 0
    assert idle_for(w, Look(now=100, alive=True, progress=_metrics(0, 26))) == 15


def test_the_supervisors_probe_in_flight_at_a_reading_is_not_a_request_of_anyone():
    """The probe runs on its own thread: a reading may catch it running, or just after it moved the
    success counter and before its answer is taken. Neither keeps an idle engine from its TTL; a
    user's request beside it still does."""
    w = Watch(started=0.0, ready=True)
    assert idle_for(w, Look(now=10, alive=True, progress=_metrics(0, 22))) == 0
    assert idle_for(w, Look(now=25, alive=True, progress=_metrics(1, 22), probe_in_flight=1)) == 15
    assert idle_for(w, Look(now=40, alive=True, progress=_metrics(0, 23), probe_in_flight=1)) == 30
    assert idle_for(w, Look(now=55, alive=True, progress=_metrics(2, 23), probe_in_flight=1)) == 0  # one is a user's


def test_an_engine_not_ready_yet_is_never_idle():
    w = Watch(started=0.0)
    assert idle_for(w, Look(now=500, alive=True)) == 0


def test_an_idle_engine_is_stopped_after_its_ttl_and_back_on_standby(tmp_path, monkeypatch):
    sup, _ = _on_demand(tmp_path, monkeypatch)
    sup.tick()
    sup.wake(TOKEN)
    sup.tick()
    assert sup.proc is not None
    sup.watch = Watch(started=0.0, ready=True, active_at=1.0)
    now = {"t": 30.0}
    monkeypatch.setattr(supervisor, "verdict", lambda w, look, p: None)
    monkeypatch.setattr(sup, "look", lambda d, p: Look(now=now["t"], alive=True, progress=_metrics(0, 5)))
    sup.tick()
    assert sup.proc is not None and sup.state == contract.SERVING  # 29 s idle, the TTL is 60 s
    now["t"] = 62.0
    sup.tick()
    assert sup.proc is None and sup.state == contract.STANDBY
    assert "idle: stopped after TTL" in _events(tmp_path)
    sup.tick()  # no wake: it stays down
    assert sup.proc is None and sup.state == contract.STANDBY
    sup.wake(TOKEN)  # the next request starts it again
    try:
        sup.tick()
        assert sup.proc is not None and _events(tmp_path).count("vllm serve started") == 2
    finally:
        sup.stop("test")


def test_a_new_up_puts_a_woken_server_back_on_standby(tmp_path, monkeypatch):
    sup, _ = _on_demand(tmp_path, monkeypatch)
    sup.tick()
    sup.wake(TOKEN)
    sup.tick()
    assert sup.proc is not None
    doc = json.loads(Path(supervisor.DESIRED_PATH).read_text())
    Path(supervisor.DESIRED_PATH).write_text(json.dumps({**doc, "generation": "g2"}))
    sup.tick()
    assert sup.proc is None and sup.state == contract.STANDBY and sup.generation == "g2"


@pytest.fixture
def agent_port():
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        return sk.getsockname()[1]


def _post(url: str, token: str | None) -> tuple[int, dict]:
    req = urllib.request.Request(
        url, data=b"", method="POST", headers={"Authorization": f"Bearer {token}"} if token else {}
    )
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_the_agents_wake_endpoint_passes_the_bearer_token_and_nothing_else(agent_port):
    seen: list[str] = []

    def wake(token: str):
        seen.append(token)
        return (202, {"state": "standby"}) if token == TOKEN else (401, {"error": "missing or wrong wake token"})

    memreport.serve_reports("127.0.0.1", agent_port, lambda: {"mem_available": 5}, wake=wake)
    base = f"http://127.0.0.1:{agent_port}"
    assert _post(f"{base}/wake", TOKEN) == (202, {"state": "standby"})
    assert _post(f"{base}/wake", None)[0] == 401
    assert _post(f"{base}/other", TOKEN)[0] == 404
    assert seen == [TOKEN, ""]
    with urllib.request.urlopen(f"{base}/", timeout=5) as r:  # the report is as before
        assert json.loads(r.read()) == {"mem_available": 5}


def test_a_worker_agent_takes_no_input(agent_port):
    memreport.serve_reports("127.0.0.1", agent_port, lambda: {"mem_available": 5})
    assert _post(f"http://127.0.0.1:{agent_port}/wake", TOKEN)[0] == 404


def test_a_wake_cuts_the_agents_wait_short():
    from sparkcluster.node import agent

    stopping, woken = threading.Event(), threading.Event()
    threading.Timer(0.05, woken.set).start()
    t0 = __import__("time").monotonic()
    agent.wait_or_wake(stopping, 30.0, woken)
    assert __import__("time").monotonic() - t0 < 5


def test_after_a_container_restart_an_on_demand_server_waits_for_a_wake_again(tmp_path, monkeypatch):
    """A reboot brings the agent back with the server `up` asked for: on demand, that is standby,
    not an engine holding the node's memory for nobody."""
    sup, _ = _on_demand(tmp_path, monkeypatch)
    sup.tick()
    sup.wake(TOKEN)
    sup.tick()
    assert sup.proc is not None
    sup.stop("the container is stopping")
    again = supervisor.Supervisor({"node": "spark-head", "nodes": [], "peers": []}, Journal(str(tmp_path / "journal")))
    again.tick()
    assert again.proc is None and again.state == contract.STANDBY and again.generation == "g1"


def test_a_running_gateway_gets_the_new_wake_token_after_up(monkeypatch):
    """A new head container has a new wake token: `up` hands it to the gateway already routing the
    deployment (its config rewritten), so its wakes are not refused with the old one."""
    from types import SimpleNamespace

    from conftest import make_inventory

    from sparkcluster.config.profile import load_profile
    from sparkcluster.deployment import gateway_registry
    from sparkcluster.deployment import server as server_mod
    from sparkcluster.up.stages import serve as serve_stage

    inv, prof = make_inventory(), load_profile("testbed")
    key = serve_stage.deployment_key(inv, prof)
    written: list[dict] = []
    host = SimpleNamespace(docker=lambda: SimpleNamespace(api="api"))
    r = SimpleNamespace(
        inv=inv,
        plan=SimpleNamespace(profile=prof, serve=SimpleNamespace(container="sparkcluster-testbed-head")),
        cluster=SimpleNamespace(head=host, hosts={"spark-head": host}),
        reach={"spark-head": host},
        progress=SimpleNamespace(info=lambda line: None),
    )
    monkeypatch.setattr(server_mod, "read_wake_token", lambda api, c: "new-token")
    monkeypatch.setattr(gateway_registry, "find", lambda api, cluster: {"State": "running", "Names": ["/gw"]})
    monkeypatch.setattr(
        gateway_registry, "read_doc", lambda api, c: {"deployments": [{"key": key, "wake_token": "old-token"}]}
    )
    monkeypatch.setattr(gateway_registry, "write_doc", lambda api, c, doc: written.append(doc))
    serve_stage.hand_wake_token(r)
    # the console's token (gateway/console) is the same one, handed over with it
    assert written == [{"deployments": [{"key": key, "wake_token": "new-token", "agent_token": "new-token"}]}]
    current = {"key": key, "wake_token": "new-token", "agent_token": "new-token"}
    monkeypatch.setattr(gateway_registry, "read_doc", lambda api, c: {"deployments": [dict(current)]})
    serve_stage.hand_wake_token(r)
    assert len(written) == 1  # already current: the config is left alone


def test_a_gateway_outside_the_deployment_gets_the_new_wake_token_after_up(monkeypatch):
    """The gateway may run on a node the deployment does not use (`gateway up --node`): `up` looks
    for it on every node of the inventory that answers, not only the deployment's. A node whose
    look fails is said, and `up` goes on."""
    from types import SimpleNamespace

    from conftest import make_inventory

    from sparkcluster.config.profile import load_profile
    from sparkcluster.deployment import gateway_registry
    from sparkcluster.deployment import server as server_mod
    from sparkcluster.errors import EngineUnreachable
    from sparkcluster.up.stages import serve as serve_stage

    inv, prof = make_inventory().only(["spark-head"]), load_profile("testbed-single")
    key = serve_stage.deployment_key(inv, prof)
    written: list[tuple[str, dict]] = []
    said: list[str] = []

    def host(api):
        return SimpleNamespace(docker=lambda: SimpleNamespace(api=api))

    def find(api, cluster):
        if api == "api-gone":
            raise EngineUnreachable("spark-gone", "list containers", ConnectionError("reset"))
        return {"State": "running", "Names": ["/gw"]} if api == "api-worker" else None

    head = host("api-head")
    r = SimpleNamespace(
        inv=inv,
        plan=SimpleNamespace(profile=prof, serve=SimpleNamespace(container="sparkcluster-testbed-single-head")),
        cluster=SimpleNamespace(head=head, hosts={"spark-head": head}),
        reach={"spark-head": head, "spark-worker": host("api-worker"), "spark-gone": host("api-gone")},
        progress=SimpleNamespace(info=said.append),
    )
    monkeypatch.setattr(server_mod, "read_wake_token", lambda api, c: "new-token")
    monkeypatch.setattr(gateway_registry, "find", find)
    monkeypatch.setattr(
        gateway_registry, "read_doc", lambda api, c: {"deployments": [{"key": key, "wake_token": "old-token"}]}
    )
    monkeypatch.setattr(gateway_registry, "write_doc", lambda api, c, doc: written.append((api, doc)))
    serve_stage.hand_wake_token(r)
    new = {"key": key, "wake_token": "new-token", "agent_token": "new-token"}
    assert written == [("api-worker", {"deployments": [new]})]
    assert any("gw on spark-worker" in line for line in said)
    assert any("spark-gone" in line and "gateway up" in line for line in said), said
