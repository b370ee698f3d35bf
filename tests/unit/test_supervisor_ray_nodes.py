"""Executor "ray": the supervisor tells from Ray's own node table that a Ray node carrying a rank of the
running engine is DEAD or replaced, journals one verdict naming the node and its old and new node_id,
and restarts the engine by its one restart path (node/raynodes, node/supervisor).

Every table here is Ray 2.60.0's state API as it answered on a real two-node cluster
(tests/captured/ray-2.60/README.md): head at 192.0.2.2, the workers at 127.0.0.2."""

from __future__ import annotations

import json
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from sparkcluster.node import contract, readings, supervisor
from sparkcluster.node.journal import Journal
from sparkcluster.node.raynodes import engine_nodes, node_lost, two_at_one_ip

CAPTURED = Path(__file__).parents[1] / "captured" / "ray-2.60"
HEAD_IP, WORKER_IP = "192.0.2.2", "127.0.0.2"
NODES = [{"name": "spark-head", "ip": HEAD_IP, "gpus": 1}, {"name": "spark-worker", "ip": WORKER_IP, "gpus": 1}]
HEAD = "ac98529a24064409736e7197e2eeb083abde9438a93b23deb3c74ec7"
A = "5cc2fd9506deee6e3b69c90ee624c4f0f84ad535bd99a89c59d31eb4"  # the first worker, killed
B = "789e67f7abbd08a11bf836494a044b1c714b20c16d3c08a2d96fd831"  # its replacement, later stopped
C = "b3c2651d"  # a third worker registered at the same IP while B ran (prefix)
HEALTH = "Unexpected termination: health check failed due to missing too many heartbeats"
SIGTERM = "Terminated due to preemption: Node received SIGTERM; draining before shutdown."


def text(name: str) -> str:
    return (CAPTURED / f"nodes-{name}.json").read_text()


def table(name: str) -> tuple[list[dict], bool]:
    return readings.ray_listing(text(name))


def started_on(name: str) -> dict[str, dict]:
    """What the supervisor records when the engine starts with Ray's table as in capture `name`."""
    rows, _ = table(name)
    assert two_at_one_ip(rows, NODES) is None
    return engine_nodes(rows, NODES)


# ---- the rule, over Ray's own tables -------------------------------------------------------------


def test_the_start_records_the_one_live_ray_node_at_each_ip():
    rows, complete = table("serving")
    assert complete and readings.ray_rows(text("serving")) == rows
    assert started_on("serving") == {
        "spark-head": {"ip": HEAD_IP, "node_id": HEAD},
        "spark-worker": {"ip": WORKER_IP, "node_id": A},
    }


def test_nothing_is_lost_while_ray_counts_every_recorded_node_alive():
    start = started_on("serving")
    assert node_lost(*table("serving"), start) == {}
    # killed half a second ago: Ray does not know yet (about 13 s: its health check), nor does the rule
    assert node_lost(*table("killed-0s"), start) == {}


def test_a_killed_worker_is_lost_once_ray_marks_it_dead():
    lost = node_lost(*table("killed-dead"), started_on("serving"))
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
    lost = node_lost(*table("replaced"), started_on("serving"))
    assert (lost["old_node_id"], lost["new_node_id"], lost["ray_state"]) == (A, B, "DEAD")
    assert "a new Ray node 789e67f7… is live at that IP" in lost["cause"]


def test_a_second_live_node_at_the_ip_leaves_an_engine_whose_node_is_alive_alone():
    """Ray counts both live while the old one's health check runs, and a stray raylet (an orphan
    container, a manual `ray start`) looks the same: only DEAD or absent is gone (found by the
    final read: the first rule stopped a healthy engine for a stray)."""
    start = started_on("replaced")  # the engine restarted on B
    assert start["spark-worker"]["node_id"] == B
    assert node_lost(*table("two-alive"), start) == {}


def test_a_stopped_worker_is_dead_within_a_second_with_rays_reason():
    lost = node_lost(*table("sigterm"), started_on("replaced"))
    assert (lost["old_node_id"], lost["ray_state"], lost["ray_says"]) == (B, "DEAD", SIGTERM)
    assert lost["new_node_id"].startswith(C)


def test_a_table_cut_by_its_limit_judges_only_the_rows_it_holds():
    rows, complete = table("limit-2")
    assert not complete and len(rows) == 2
    # the head and C are past the limit: unknown, not gone
    assert node_lost(rows, complete, started_on("sigterm")) == {}
    # B is in it, and DEAD
    assert node_lost(rows, complete, started_on("replaced"))["old_node_id"] == B


def test_a_node_absent_from_a_whole_table_is_gone():
    start = started_on("sigterm")  # the head and worker C
    lost = node_lost(*table("serving"), start)  # a whole table without C
    assert (lost["node"], lost["ray_state"], lost["new_node_id"]) == ("spark-worker", "absent", A)
    assert "Ray no longer lists the node b3c2651d…" in lost["cause"]


def test_no_answer_judges_nothing():
    start = started_on("serving")
    for body in ("", "curl: (7) Failed to connect to 127.0.0.1 port 8265", '{"result": false, "data": {}}'):
        assert readings.ray_listing(body) == ([], False)
        assert node_lost(*readings.ray_listing(body), start) == {}


def test_a_start_waits_while_two_ray_nodes_are_live_at_one_ip():
    why = two_at_one_ip(table("two-alive")[0], NODES)
    assert why == (
        "spark-worker has 2 live Ray nodes at 127.0.0.2 (789e67f7…, b3c2651d…): "
        "a replaced node Ray has not declared dead yet, or a stray raylet joined the head's Ray "
        "(`docker ps` on that node; `sparkcluster down --purge-gcs` clears a stale head)"
    )
    assert two_at_one_ip(table("sigterm")[0], NODES) is None


# ---- the supervisor, reading a dashboard that serves those tables ---------------------------------


class _Table(BaseHTTPRequestHandler):
    def do_GET(self):
        body = self.server.doc.encode()
        self.server.hits += 1
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def dashboard():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Table)
    srv.doc, srv.hits = text("serving"), 0
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def head_supervisor(tmp_path, monkeypatch, state_api: str) -> supervisor.Supervisor:
    for name in ("SERVE_LOG", "RECORD_PATH", "STATE_PATH", "SECRETS_PATH", "DESIRED_PATH"):
        monkeypatch.setattr(supervisor, name, str(tmp_path / name.lower()))
    cfg = {"node": "spark-head", "ray_argv": ["ray"], "state_api": state_api, "nodes": NODES, "peers": []}
    return supervisor.Supervisor(cfg, Journal(str(tmp_path / "journal")))


def journal(tmp_path) -> list[dict]:
    return [json.loads(x) for x in (tmp_path / "journal").read_text().splitlines()]


def test_supervisor_restarts_an_engine_whose_worker_ray_node_was_replaced(tmp_path, monkeypatch, dashboard):
    sup = head_supervisor(tmp_path, monkeypatch, f"http://127.0.0.1:{dashboard.server_port}/api/v0/nodes?limit=100")
    desired = {
        "generation": "g1",
        "argv": [sys.executable, "-c", "import time; time.sleep(60)"],  # an idle engine: it notices nothing
        "model": "m",
        "host": "127.0.0.1",
        "port": closed_port(),
        "policy": {"memory_floor_gib": 0.0},
    }
    Path(supervisor.DESIRED_PATH).write_text(json.dumps(desired))
    try:
        sup.tick()  # every node a Ray member: started, on the nodes Ray lists now
        assert sup.state == contract.STARTING
        started = [e for e in journal(tmp_path) if e["event"] == "vllm serve started"]
        assert started[-1]["ray_nodes"] == {"spark-head": HEAD, "spark-worker": A}
        assert json.loads(Path(supervisor.RECORD_PATH).read_text())["ray_nodes"] == started[-1]["ray_nodes"]
        assert json.loads(Path(supervisor.STATE_PATH).read_text())["ray_nodes"] == started[-1]["ray_nodes"]
        sup.first_start, sup.watch.ready, sup.state = False, True, contract.SERVING  # it served, then sat idle

        dashboard.doc = text("replaced")  # the worker's container killed and replaced
        sup.tick()
        dead = [e for e in journal(tmp_path) if e["event"] == "dead"]
        assert len(dead) == 1
        assert {k: dead[0][k] for k in ("node", "ip", "old_node_id", "new_node_id", "ray_state", "ray_says")} == {
            "node": "spark-worker",
            "ip": WORKER_IP,
            "old_node_id": A,
            "new_node_id": B,
            "ray_state": "DEAD",
            "ray_says": HEALTH,
        }
        assert dead[0]["cause"].startswith("spark-worker (127.0.0.2): Ray marks the node 5cc2fd95…")
        # the one restart path: stopped, counted against the bound, restarted after the backoff
        assert sup.proc is None and sup.state == contract.RESTARTING and len(sup.restarts) == 1
        assert sup.counts["verdict:dead"] == 1 and sup.causes[-1] == {**sup.causes[-1], "kind": "dead"}
        stopped = [e for e in journal(tmp_path) if e["event"] == "vllm serve stopped"]
        assert stopped[-1]["why"] == dead[0]["cause"]

        sup.next_start = 0.0
        sup.tick()  # the restart records the replacement's node_id
        started = [e for e in journal(tmp_path) if e["event"] == "vllm serve started"]
        assert len(started) == 2 and started[-1]["ray_nodes"] == {"spark-head": HEAD, "spark-worker": B}
        sup.tick()
        assert len([e for e in journal(tmp_path) if e["event"] == "dead"]) == 1  # one verdict, not one per look
    finally:
        sup.stop("test")


def test_a_start_waits_for_ray_to_retire_a_replaced_node(tmp_path, monkeypatch, dashboard):
    sup = head_supervisor(tmp_path, monkeypatch, f"http://127.0.0.1:{dashboard.server_port}/api/v0/nodes?limit=100")
    dashboard.doc = text("two-alive")
    assert sup.nodes_ready().startswith("spark-worker has 2 live Ray nodes at 127.0.0.2")
    assert sup.ray_nodes == {}
    dashboard.doc = text("sigterm")
    assert sup.nodes_ready() is None
    assert sup.ray_node_ids()["spark-worker"].startswith(C)


def test_ray_s_table_is_read_at_most_once_per_look_interval(tmp_path, monkeypatch, dashboard):
    sup = head_supervisor(tmp_path, monkeypatch, f"http://127.0.0.1:{dashboard.server_port}/api/v0/nodes?limit=100")
    assert sup.nodes_ready() is None and dashboard.hits == 1
    policy = {**contract.DEFAULT_POLICY, "interval_s": 2.0}
    dashboard.doc = text("killed-dead")
    assert sup.ray_node_lost(100.0, policy)["old_node_id"] == A and dashboard.hits == 2
    # a starting engine is looked at every 0.25 s (agent.BUSY_LOOK_S): Ray's table is not
    assert sup.ray_node_lost(100.25, policy) == {} and sup.ray_node_lost(101.9, policy) == {}
    assert dashboard.hits == 2
    assert sup.ray_node_lost(102.0, policy)["ray_state"] == "DEAD" and dashboard.hits == 3


def test_a_dashboard_that_does_not_answer_judges_nothing(tmp_path, monkeypatch):
    sup = head_supervisor(tmp_path, monkeypatch, f"http://127.0.0.1:{closed_port()}/api/v0/nodes?limit=100")
    sup.ray_nodes = started_on("serving")
    assert sup.ray_node_lost(100.0, contract.DEFAULT_POLICY) == {}
