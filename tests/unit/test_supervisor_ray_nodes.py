"""Executor "ray": the supervisor tells from Ray's own node table that a Ray node carrying a rank of the
running engine is DEAD or gone, journals one verdict naming the node and its old and new node_id,
and restarts the engine by its one restart path (node/raynodes, node/supervisor). A second Ray node
live beside an ALIVE one is journalled once and leaves the engine alone; a start waits while an IP
has two live nodes, or while its one live node started before the node's agent.

Every table here is Ray 2.60.0's state API as it answered on a real two-node cluster
(tests/captured/ray-2.60/README.md): head at 192.0.2.2, the workers at 127.0.0.2. The first session's
tables (nodes-*.json) are unfiltered reads; the second's (alive-*.json, node-*.json) are the
supervisor's own reads: the live nodes with their start times, and one node by its node_id."""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest

from sparkcluster.node import contract, memreport, readings, supervisor
from sparkcluster.node.journal import Journal
from sparkcluster.node.raynodes import (
    STRAY_AFTER_S,
    engine_nodes,
    node_lost,
    older_than_agent,
    others_at_ip,
    two_at_one_ip,
    waiting_on_two,
)

CAPTURED = Path(__file__).parents[1] / "captured" / "ray-2.60"
HEAD_IP, WORKER_IP = "192.0.2.2", "127.0.0.2"
NODES = [{"name": "spark-head", "ip": HEAD_IP, "gpus": 1}, {"name": "spark-worker", "ip": WORKER_IP, "gpus": 1}]
# the first session (unfiltered reads)
HEAD = "ac98529a24064409736e7197e2eeb083abde9438a93b23deb3c74ec7"
A = "5cc2fd9506deee6e3b69c90ee624c4f0f84ad535bd99a89c59d31eb4"  # the first worker, killed
B = "789e67f7abbd08a11bf836494a044b1c714b20c16d3c08a2d96fd831"  # its replacement, later stopped
C = "b3c2651d"  # a third worker registered at the same IP while B ran (prefix)
HEALTH = "Unexpected termination: health check failed due to missing too many heartbeats"
SIGTERM = "Terminated due to preemption: Node received SIGTERM; draining before shutdown."
# the second session (the supervisor's reads): README.md says when each started
HEAD2 = "8d4e5bcc22e6760161d6c15211db8f5f40d1d7cbb35f02be510c0b72"
A2 = "b333bc897e7db119d6f5cc205f2ff7d4ede0ef9dbd18c6f77bae6b4a"  # the worker, killed with its whole process group
B2 = "8f5a92d71aa4f7949d0fdf5bc0aa6b639a9554c50b5a53b65ec97e44"  # the restarted container's raylet
C2 = (
    "318268cda89eca08d28d1009c9139a6f8597a5e6b3e45f95e413e60e"  # a stray raylet started at the worker's IP while B2 ran
)
B2_AGENT = 1795775356.8457456  # when the restarted container's agent started: just before B2's `ray start`


def text(name: str) -> str:
    return (CAPTURED / f"{name}.json").read_text()


def table(name: str) -> tuple[list[dict], bool]:
    return readings.ray_listing(text(name))


def started_on(name: str) -> dict[str, dict]:
    """What the supervisor records when the engine starts with Ray's table as in capture `name`."""
    rows, _ = table(name)
    assert two_at_one_ip(rows, NODES) is None
    return engine_nodes(rows, NODES)


# ---- the rule, over Ray's own tables -------------------------------------------------------------


def test_the_start_records_the_one_live_ray_node_at_each_ip():
    rows, complete = table("nodes-serving")
    assert complete and readings.ray_rows(text("nodes-serving")) == rows
    assert started_on("nodes-serving") == {
        "spark-head": {"ip": HEAD_IP, "node_id": HEAD},
        "spark-worker": {"ip": WORKER_IP, "node_id": A},
    }
    assert started_on("alive-serving") == {
        "spark-head": {"ip": HEAD_IP, "node_id": HEAD2},
        "spark-worker": {"ip": WORKER_IP, "node_id": A2},
    }


def test_nothing_is_lost_while_ray_counts_every_recorded_node_alive():
    start = started_on("nodes-serving")
    assert node_lost(*table("nodes-serving"), start) == {}
    # killed half a second ago: Ray does not know yet (about 13 s: its health check), nor does the rule
    assert node_lost(*table("nodes-killed-0s"), start) == {}


def test_a_killed_worker_is_lost_once_ray_marks_it_dead():
    lost = node_lost(*table("nodes-killed-dead"), started_on("nodes-serving"))
    assert {k: v for k, v in lost.items() if k != "cause"} == {
        "node": "spark-worker",
        "ip": WORKER_IP,
        "old_node_id": A,
        "new_node_id": None,
        "ray_state": "DEAD",
        "ray_says": HEALTH,
    }
    assert lost["cause"].startswith("spark-worker (127.0.0.2): Ray marks the node 5cc2fd95… that carried a rank DEAD")
    assert HEALTH in lost["cause"] and "cannot rejoin" in lost["cause"]


def test_a_replaced_worker_names_the_old_and_the_new_node():
    lost = node_lost(*table("nodes-replaced"), started_on("nodes-serving"))
    assert (lost["old_node_id"], lost["new_node_id"], lost["ray_state"]) == (A, B, "DEAD")
    assert "a new Ray node 789e67f7… is live at that IP" in lost["cause"]


def test_a_second_live_node_beside_an_alive_recorded_one_is_no_verdict():
    """A stray raylet joining the head's GCS at a node's IP (an orphan worker container of a
    renamed cluster, a manual `ray start`) must not kill a healthy engine: Ray still lists the
    recorded node ALIVE. Were the container replaced, Ray would declare the old node DEAD within its
    health check (the verdict below, `sigterm`)."""
    start = started_on("nodes-replaced")  # the engine restarted on B
    assert start["spark-worker"]["node_id"] == B
    assert node_lost(*table("nodes-two-alive"), start) == {}
    (other,) = others_at_ip(table("nodes-two-alive")[0], start)
    assert (other["node"], other["ip"], other["node_id"]) == ("spark-worker", WORKER_IP, B)
    assert other["other_node_id"].startswith(C)
    assert other["why"].startswith(
        "spark-worker (127.0.0.2): a second Ray node b3c2651d… is live at that IP beside 789e67f7…"
    )
    assert "left alone" in other["why"] and "docker ps" in other["fix"] and "--purge-gcs" in other["fix"]
    assert others_at_ip(table("nodes-replaced")[0], start) == []  # B alone at its IP


def test_a_stopped_worker_is_dead_within_a_second_with_rays_reason():
    lost = node_lost(*table("nodes-sigterm"), started_on("nodes-replaced"))
    assert (lost["old_node_id"], lost["ray_state"], lost["ray_says"]) == (B, "DEAD", SIGTERM)
    assert lost["new_node_id"].startswith(C)
    assert others_at_ip(table("nodes-sigterm")[0], started_on("nodes-replaced")) == []  # B is DEAD: the verdict's


def test_a_table_cut_by_its_limit_judges_only_the_rows_it_holds():
    rows, complete = table("nodes-limit-2")
    assert not complete and len(rows) == 2
    # the head and C are past the limit: unknown, not gone
    assert node_lost(rows, complete, started_on("nodes-sigterm")) == {}
    # B is in it, and DEAD
    assert node_lost(rows, complete, started_on("nodes-replaced"))["old_node_id"] == B


def test_a_node_absent_from_a_whole_table_is_gone():
    start = started_on("nodes-sigterm")  # the head and worker C
    lost = node_lost(*table("nodes-serving"), start)  # a whole table without C
    assert (lost["node"], lost["ray_state"], lost["new_node_id"]) == ("spark-worker", "absent", A)
    assert "Ray no longer lists the node b3c2651d… that carried a rank as alive" in lost["cause"]


def test_no_answer_judges_nothing():
    start = started_on("nodes-serving")
    for body in ("", "curl: (7) Failed to connect to 127.0.0.1 port 8265", '{"result": false, "data": {}}'):
        assert readings.ray_listing(body) == ([], False)
        assert node_lost(*readings.ray_listing(body), start) == {}


# ---- the supervisor's reads: live nodes only (Ray's filter), a recorded node by its node_id ---------


def test_the_table_of_live_nodes_is_whole_though_ray_keeps_dead_rows():
    """Filtered on state=ALIVE, the API's `total` still counts the GCS's DEAD rows; `num_filtered`
    is what a whole answer holds."""
    doc = json.loads(text("alive-replaced"))["data"]["result"]
    rows, complete = table("alive-replaced")
    assert complete and [r["state"] for r in rows] == ["ALIVE", "ALIVE"]
    assert doc["num_filtered"] == len(rows) < doc["total"]
    assert {r["node_id"] for r in rows} == {HEAD2, B2} and all(r["start_time_ms"] > 0 for r in rows)
    rows, complete = table("alive-limit-1")  # the same filter, cut at limit=1
    assert not complete and len(rows) == 1


def test_the_supervisor_asks_ray_for_live_nodes_and_for_one_node_by_its_id():
    """The query strings sent for the captures (README.md): Ray 2.60's filter parameters."""
    url = urllib.parse.urlsplit(contract.STATE_API_URL)
    assert urllib.parse.parse_qs(url.query) == {
        "filter_keys": ["state"],
        "filter_predicates": ["="],
        "filter_values": ["ALIVE"],
        "detail": ["true"],
        "limit": ["1000"],
    }
    one = urllib.parse.urlsplit(readings.ray_node_query(contract.STATE_API_URL, A2))
    assert (one.scheme, one.netloc, one.path) == (url.scheme, url.netloc, url.path)
    assert urllib.parse.parse_qs(one.query) == {
        "filter_keys": ["node_id"],
        "filter_predicates": ["="],
        "filter_values": [A2],
        "detail": ["true"],
    }


def test_a_recorded_node_missing_from_the_live_table_is_judged_by_its_own_row():
    start = started_on("alive-serving")
    rows, complete = table("alive-replaced")  # A2 is no longer live; B2 is, at its IP
    own, _ = table("node-a-dead")
    lost = node_lost(rows + own, complete, start)
    assert (lost["old_node_id"], lost["new_node_id"], lost["ray_state"], lost["ray_says"]) == (A2, B2, "DEAD", HEALTH)
    # its own row not read (no answer): absent from a whole table of live nodes is not alive
    lost = node_lost(rows, complete, start)
    assert (lost["old_node_id"], lost["ray_state"]) == (A2, "absent")
    # a node Ray does not know answers no row
    assert table("node-unknown") == ([], False)


def test_a_start_waits_while_two_ray_nodes_are_live_at_one_ip():
    want, live = two_at_one_ip(table("nodes-two-alive")[0], NODES)
    assert want["name"] == "spark-worker" and [r["node_id"][:8] for r in live] == ["789e67f7", C]
    assert waiting_on_two(want, live, 5.0, {}) == (
        "spark-worker has 2 live Ray nodes at 127.0.0.2 (789e67f7…, b3c2651d…): "
        "waiting for Ray to declare a replaced one dead (its health check)"
    )
    assert two_at_one_ip(table("nodes-sigterm")[0], NODES) is None


def test_past_a_minute_the_wait_names_the_stray_and_how_to_remove_it():
    want, live = two_at_one_ip(table("alive-stray")[0], NODES)
    why = waiting_on_two(want, live, STRAY_AFTER_S + 1, {"spark-worker": B2_AGENT})
    assert why.startswith("spark-worker has 2 live Ray nodes at 127.0.0.2 for 61s, longer than Ray takes")
    for r in live:  # both node_ids, whole, with the start Ray gives
        t = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(r["start_time_ms"] / 1000))
        assert f"{r['node_id']} (started {t})" in why
    assert "`docker ps` on spark-worker" in why and "sparkcluster down --purge-gcs" in why
    # two live nodes at a restarted node's IP, a minute on (not seen: Ray declared the old one dead
    # after 17 s): the one that started before the node's agent is marked so
    want, live = two_at_one_ip(table("alive-two")[0], NODES)
    why = waiting_on_two(want, live, STRAY_AFTER_S, {"spark-worker": B2_AGENT})
    assert f"{A2} (started " in why and "before the node's agent did" in why
    assert why.count("before the node's agent") == 1
    # the first session's rows have no start times (read without `detail`)
    want, live = two_at_one_ip(table("nodes-two-alive")[0], NODES)
    assert f"{B} (start unknown)" in waiting_on_two(want, live, 90.0, {})


def test_a_live_node_older_than_its_nodes_agent_is_the_previous_containers():
    """Right after Docker restarted a worker's container, Ray lists the old raylet ALIVE (its
    health check has not failed yet) and the new one has not registered: a start then would record
    the dead node. Its start_time_ms is before the new container's agent started."""
    rows, _ = table("alive-killed-0s")
    assert [r["node_id"] for r in readings.live_at(rows, WORKER_IP)] == [A2]
    why = older_than_agent(rows, NODES, {"spark-worker": B2_AGENT})
    assert why.startswith(f"spark-worker's live Ray node {A2[:8]}… at 127.0.0.2 started ")
    assert "0.4s before the node's agent did" in why and "waiting for the new one" in why
    assert older_than_agent(rows, NODES, {}) is None  # an agent that does not say: today's start
    assert older_than_agent(table("alive-replaced")[0], NODES, {"spark-worker": B2_AGENT}) is None
    assert older_than_agent(table("nodes-killed-0s")[0], NODES, {"spark-worker": B2_AGENT}) is None  # no start times


# ---- the supervisor, reading a dashboard that serves those tables ---------------------------------


class _Dashboard(BaseHTTPRequestHandler):
    """Ray's dashboard as captured: the table of live nodes, or one node's by its node_id."""

    def do_GET(self):
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
        self.server.hits += 1
        if query.get("filter_keys") == ["node_id"]:
            self.server.asked.append(query["filter_values"][0])
            body = self.server.nodes.get(query["filter_values"][0], text("node-unknown"))
        else:
            body = self.server.doc
        _answer(self, body.encode())

    def log_message(self, *args):
        pass


def _answer(handler: BaseHTTPRequestHandler, body: bytes) -> None:
    """200 with a JSON body, as the dashboard and an agent's report endpoint answer."""
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def serve(handler, address: str = "127.0.0.1"):
    srv = ThreadingHTTPServer((address, 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.fixture
def dashboard():
    srv = serve(_Dashboard)
    srv.doc, srv.nodes, srv.hits, srv.asked = text("alive-serving"), {}, 0, []
    yield srv
    srv.shutdown()
    srv.server_close()


class _Report(BaseHTTPRequestHandler):
    def do_GET(self):
        _answer(self, json.dumps(self.server.report).encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def worker_agent():
    """The worker's agent report endpoint at its control IP (127.0.0.2, a loopback address)."""

    class Ray:
        def poll(self):
            return None

    srv = serve(_Report, WORKER_IP)
    srv.report = memreport.node_report("spark-worker", Ray(), B2_AGENT)
    yield srv
    srv.shutdown()
    srv.server_close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def state_api(port: int) -> str:
    return contract.STATE_API_URL.replace("127.0.0.1:8265", f"127.0.0.1:{port}")


def head_supervisor(tmp_path, monkeypatch, url: str, peers: list | None = None, port: int = 0):
    for name in ("SERVE_LOG", "RECORD_PATH", "STATE_PATH", "SECRETS_PATH", "DESIRED_PATH"):
        monkeypatch.setattr(supervisor, name, str(tmp_path / name.lower()))
    cfg = {
        "node": "spark-head",
        "ray_argv": ["ray"],
        "state_api": url,
        "nodes": NODES,
        "peers": peers or [],
        "report_port": port,
    }
    return supervisor.Supervisor(cfg, Journal(str(tmp_path / "journal")))


def journal(tmp_path) -> list[dict]:
    return [json.loads(x) for x in (tmp_path / "journal").read_text().splitlines()]


def idle_engine() -> dict:
    return {
        "generation": "g1",
        "argv": [sys.executable, "-c", "import time; time.sleep(60)"],  # an idle engine: it notices nothing
        "model": "m",
        "host": "127.0.0.1",
        "port": closed_port(),
        "policy": {"memory_floor_gib": 0.0},
    }


def test_supervisor_restarts_an_engine_whose_worker_ray_node_was_replaced(tmp_path, monkeypatch, dashboard):
    sup = head_supervisor(tmp_path, monkeypatch, state_api(dashboard.server_port))
    Path(supervisor.DESIRED_PATH).write_text(json.dumps(idle_engine()))
    try:
        sup.tick()  # every node a Ray member: started, on the nodes Ray lists now
        assert sup.state == contract.STARTING
        started = [e for e in journal(tmp_path) if e["event"] == "vllm serve started"]
        assert started[-1]["ray_nodes"] == {"spark-head": HEAD2, "spark-worker": A2}
        assert json.loads(Path(supervisor.RECORD_PATH).read_text())["ray_nodes"] == started[-1]["ray_nodes"]
        assert json.loads(Path(supervisor.STATE_PATH).read_text())["ray_nodes"] == started[-1]["ray_nodes"]
        sup.first_start, sup.watch.ready, sup.state = False, True, contract.SERVING  # it served, then sat idle

        # the worker's container killed and restarted: A2 has left the live nodes, B2 is there
        dashboard.doc, dashboard.nodes = text("alive-replaced"), {A2: text("node-a-dead")}
        sup.tick()
        assert dashboard.asked == [A2]  # the recorded node missing from the live ones, by its node_id
        dead = [e for e in journal(tmp_path) if (e["event"], e.get("kind")) == ("verdict", "dead")]
        assert len(dead) == 1
        assert {k: dead[0][k] for k in ("node", "ip", "old_node_id", "new_node_id", "ray_state", "ray_says")} == {
            "node": "spark-worker",
            "ip": WORKER_IP,
            "old_node_id": A2,
            "new_node_id": B2,
            "ray_state": "DEAD",
            "ray_says": HEALTH,
        }
        assert dead[0]["cause"].startswith(f"spark-worker (127.0.0.2): Ray marks the node {A2[:8]}…")
        # the one restart path: stopped, counted against the bound, restarted after the backoff
        assert sup.proc is None and sup.state == contract.RESTARTING and len(sup.restarts) == 1
        assert sup.counts["verdict:dead"] == 1 and sup.causes[-1] == {**sup.causes[-1], "kind": "dead"}
        stopped = [e for e in journal(tmp_path) if e["event"] == "vllm serve stopped"]
        assert stopped[-1]["why"] == dead[0]["cause"]

        sup.next_start = 0.0
        sup.tick()  # the restart records the replacement's node_id
        started = [e for e in journal(tmp_path) if e["event"] == "vllm serve started"]
        assert len(started) == 2 and started[-1]["ray_nodes"] == {"spark-head": HEAD2, "spark-worker": B2}
        sup.tick()
        assert (
            len([e for e in journal(tmp_path) if (e["event"], e.get("kind")) == ("verdict", "dead")]) == 1
        )  # one verdict, not one per look
    finally:
        sup.stop("test")


def test_a_stray_raylet_beside_the_engines_node_is_journalled_once_and_left_alone(tmp_path, monkeypatch, dashboard):
    sup = head_supervisor(tmp_path, monkeypatch, state_api(dashboard.server_port))
    dashboard.doc = text("alive-replaced")
    # every look reads Ray's table; the idle engine's closed port is not what this test is about
    policy = {"memory_floor_gib": 0.0, "interval_s": 0.0, "health_failures": 100}
    Path(supervisor.DESIRED_PATH).write_text(json.dumps({**idle_engine(), "policy": policy}))
    try:
        sup.tick()
        assert sup.ray_node_ids() == {"spark-head": HEAD2, "spark-worker": B2}
        sup.first_start, sup.watch.ready, sup.state = False, True, contract.SERVING

        dashboard.doc = text("alive-stray")  # C2 joined at the worker's IP; B2 is ALIVE
        sup.tick()
        sup.tick()
        assert sup.proc is not None and sup.proc.poll() is None and sup.restarts == []
        assert not [e for e in journal(tmp_path) if e["event"] in ("verdict", "vllm serve stopped")]
        (seen,) = [e for e in journal(tmp_path) if e["event"] == "another Ray node at an engine node's IP"]
        assert (seen["node"], seen["ip"], seen["node_id"], seen["other_node_id"]) == ("spark-worker", WORKER_IP, B2, C2)
        assert dashboard.asked == []  # every recorded node is live: no node read by its id

        dashboard.doc = text("alive-after-stray")  # the stray stopped
        sup.tick()
        assert sup.proc is not None and sup.proc.poll() is None and sup.restarts == []
    finally:
        sup.stop("test")


def test_a_start_waits_while_two_nodes_are_live_at_one_ip_and_after_a_minute_names_the_stray(
    tmp_path, monkeypatch, dashboard
):
    sup = head_supervisor(tmp_path, monkeypatch, state_api(dashboard.server_port))
    dashboard.doc = text("alive-stray")
    assert sup.nodes_ready().startswith(
        f"spark-worker has 2 live Ray nodes at 127.0.0.2 ({C2[:8]}…, {B2[:8]}…): waiting for Ray to declare"
    )
    assert sup.ray_nodes == {}
    sup.two_since -= STRAY_AFTER_S  # the same two, a minute on
    why = sup.nodes_ready()
    assert (
        "one of them is a stray raylet beside the node's own" in why and B2 in why and C2 in why and "docker ps" in why
    )
    assert sup.ray_nodes == {}
    dashboard.doc = text("alive-after-stray")  # the stray stopped
    assert sup.nodes_ready() is None and sup.ray_node_ids()["spark-worker"] == B2
    dashboard.doc = text("alive-stray")  # a new wait starts its own minute
    assert "waiting for Ray to declare a replaced one dead" in sup.nodes_ready()


def test_a_start_after_a_container_restart_waits_for_its_new_raylet(tmp_path, monkeypatch, dashboard, worker_agent):
    peers = [{"name": "spark-worker", "ip": WORKER_IP}]
    sup = head_supervisor(tmp_path, monkeypatch, state_api(dashboard.server_port), peers, worker_agent.server_port)
    dashboard.doc = text("alive-killed-0s")  # A2 still ALIVE, though its container was restarted
    why = sup.nodes_ready()
    assert why.startswith(f"spark-worker's live Ray node {A2[:8]}… at 127.0.0.2 started ") and sup.ray_nodes == {}
    assert sup.reports["spark-worker"]["agent_started"] == B2_AGENT
    dashboard.doc = text("alive-replaced")
    assert sup.nodes_ready() is None and sup.ray_node_ids() == {"spark-head": HEAD2, "spark-worker": B2}

    # an older agent, whose report does not say when it started: the start records what is live
    worker_agent.report = {k: v for k, v in worker_agent.report.items() if k != "agent_started"}
    dashboard.doc = text("alive-killed-0s")
    assert sup.nodes_ready() is None and sup.ray_node_ids()["spark-worker"] == A2


def test_a_lone_raylet_older_than_its_agent_past_a_minute_is_the_nodes_own(
    tmp_path, monkeypatch, dashboard, worker_agent
):
    """Ray declares a replaced raylet dead within 13-30 s: a lone live node that still looks older
    than its agent a minute on is the node's own, and the host's clock stepped back between the two
    starts (NTP at boot). The start records it and says so, rather than waiting for good."""
    peers = [{"name": "spark-worker", "ip": WORKER_IP}]
    sup = head_supervisor(tmp_path, monkeypatch, state_api(dashboard.server_port), peers, worker_agent.server_port)
    dashboard.doc = text("alive-killed-0s")
    assert "before the node's agent did" in sup.nodes_ready() and sup.ray_nodes == {}
    sup.older_since -= STRAY_AFTER_S  # the same lone node, a minute on
    assert sup.nodes_ready() is None and sup.ray_node_ids()["spark-worker"] == A2
    taken = [e for e in journal(tmp_path) if e["event"].startswith("a Ray node that started before its agent")]
    assert len(taken) == 1 and "clock stepped back" in taken[0]["hint"] and A2[:8] in taken[0]["why"]


def test_a_cut_table_of_live_nodes_says_so_rather_than_not_a_member(tmp_path, monkeypatch, dashboard):
    sup = head_supervisor(tmp_path, monkeypatch, state_api(dashboard.server_port))
    dashboard.doc = text("alive-limit-1")
    why = sup.nodes_ready()
    assert "is not among the 1 live Ray nodes the state API returned" in why and "not a Ray member" not in why


class _Restarting(BaseHTTPRequestHandler):
    """A dashboard going down mid-answer: a body cut short, or no HTTP status line."""

    def do_GET(self):
        if self.server.mode == "cut":
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 4000\r\n\r\n")
            self.wfile.write(text("alive-serving").encode()[:100])
        else:
            self.wfile.write(b"\x15\x03\x01\x00\x02\x02\n")
        self.wfile.flush()
        self.close_connection = True

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("mode", ["cut", "no-status"])
def test_a_restarting_dashboard_is_no_answer_in_both_reads(tmp_path, monkeypatch, mode):
    srv = serve(_Restarting)
    srv.mode = mode
    try:
        sup = head_supervisor(tmp_path, monkeypatch, state_api(srv.server_port))
        why = sup.nodes_ready()  # before a start: waits, says why
        assert why.startswith("Ray's state API does not answer yet (")
        assert ("IncompleteRead" if mode == "cut" else "BadStatusLine") in why
        sup.ray_nodes = started_on("alive-serving")  # while the engine runs: judges nothing
        assert sup.ray_node_lost(100.0, contract.Policy()) == {}
    finally:
        srv.shutdown()
        srv.server_close()


def test_ray_s_table_is_read_at_most_once_per_look_interval(tmp_path, monkeypatch, dashboard):
    sup = head_supervisor(tmp_path, monkeypatch, state_api(dashboard.server_port))
    assert sup.nodes_ready() is None and dashboard.hits == 1
    policy = contract.Policy(interval_s=2.0)
    dashboard.doc, dashboard.nodes = text("alive-replaced"), {A2: text("node-a-dead")}
    assert sup.ray_node_lost(100.0, policy)["old_node_id"] == A2 and dashboard.hits == 3  # the table, A2's row
    # a starting engine is looked at every 0.25 s (agent.BUSY_LOOK_S): Ray's table is not
    assert sup.ray_node_lost(100.25, policy) == {} and sup.ray_node_lost(101.9, policy) == {}
    assert dashboard.hits == 3
    assert sup.ray_node_lost(102.0, policy)["ray_state"] == "DEAD" and dashboard.hits == 5


def test_the_read_interval_runs_on_the_monotonic_clock(tmp_path, monkeypatch, dashboard):
    """A wall clock stepped back (NTP, a host without RTC at boot) must not stop the reads."""
    sup = head_supervisor(tmp_path, monkeypatch, state_api(dashboard.server_port))
    desired = {**idle_engine(), "policy": {"memory_floor_gib": 0.0, "interval_s": 0.05}}
    Path(supervisor.DESIRED_PATH).write_text(json.dumps(desired))
    try:
        sup.tick()
        policy = sup.policy()
        assert sup.look(contract.Desired.of(desired), policy).ray_lost == {}
        wall = time.time() - 3600  # an hour back
        monkeypatch.setattr(supervisor, "time", SimpleNamespace(time=lambda: wall, monotonic=time.monotonic))
        time.sleep(0.1)
        dashboard.doc, dashboard.nodes = text("alive-replaced"), {A2: text("node-a-dead")}
        assert sup.look(contract.Desired.of(desired), policy).ray_lost["old_node_id"] == A2
    finally:
        monkeypatch.undo()
        sup.stop("test")


def test_a_recorded_node_past_the_cut_of_the_live_table_is_read_by_its_id_and_kept(tmp_path, monkeypatch, dashboard):
    sup = head_supervisor(tmp_path, monkeypatch, state_api(dashboard.server_port))
    assert sup.nodes_ready() is None and sup.ray_node_ids()["spark-worker"] == A2
    dashboard.doc, dashboard.nodes = text("alive-limit-1"), {A2: text("node-a-alive")}  # A2 past the limit
    assert sup.ray_node_lost(100.0, contract.Policy()) == {} and dashboard.asked == [A2]
    dashboard.nodes = {}  # no row for it (as node-unknown answers): a cut table says nothing of it
    assert sup.ray_node_lost(200.0, contract.Policy()) == {}


def test_a_dashboard_that_does_not_answer_judges_nothing(tmp_path, monkeypatch):
    sup = head_supervisor(tmp_path, monkeypatch, state_api(closed_port()))
    sup.ray_nodes = started_on("nodes-serving")
    assert sup.ray_node_lost(100.0, contract.Policy()) == {}
