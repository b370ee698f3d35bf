"""`status`: the pure verdict over per-node state, Ray's rows and the endpoint, and parsing Ray's
state API document."""

from __future__ import annotations

import json

from conftest import make_inventory

from sparkcluster.deployment.endpoint import EngineView
from sparkcluster.deployment.ray_members import parse_state_api
from sparkcluster.status.status import NodeStatus, judge, node_script

HEAD_IP, WORKER_IP = "198.19.2.1", "198.19.2.2"
ENDPOINT = "http://spark-head:8000"


def ray_row(ip: str, head: bool, state: str = "ALIVE", gpus: float = 1.0) -> dict:
    return {
        "node_id": ("a" if head else "b") * 56,
        "node_ip": ip,
        "is_head_node": head,
        "state": state,
        "state_message": None,
        "node_name": ip,
        "resources_total": {
            "CPU": 2.0,
            "GPU": gpus,
            "memory": 17179869184.0,
            "object_store_memory": 2147483648.0,
            f"node:{ip}": 1.0,
            **({"node:__internal_head__": 1.0} if head else {}),
        },
        "labels": {"ray.io/node_id": ("a" if head else "b") * 56},
        "start_time_ms": 1795000000000,
        "end_time_ms": 0,
    }


def ray_doc(rows: list[dict]) -> str:
    return json.dumps(
        {
            "result": True,
            "msg": "",
            "data": {
                "result": {
                    "total": len(rows),
                    "num_after_truncation": len(rows),
                    "num_filtered": len(rows),
                    "result": rows,
                    "partial_failure_warning": "",
                    "warnings": None,
                }
            },
        }
    )


def running(name: str, role: str) -> NodeStatus:
    return NodeStatus(
        name,
        container=f"sparkcluster-pair-{role}" + ("" if role == "head" else f"-{name}"),
        state="running",
        started_at="2026-11-22T03:00:00Z",
        profile="testbed",
        uptime_s=1000.0,
        mem_available_gib=80.0,
    )


def healthy_inputs():
    nodes = [running("spark-head", "head"), running("spark-worker", "worker")]
    rows = [ray_row(HEAD_IP, True), ray_row(WORKER_IP, False)]
    return nodes, rows


def verdict(nodes, rows, health=200, models=("testbed-tiny",), pid=4242, responds=True, probe=""):
    engine = EngineView(health, list(models), responds if health == 200 else None, probe)
    return judge(make_inventory(), nodes, rows, ENDPOINT, engine, pid)


# ---- parse_state_api ----------------------------------------------------------------------------


def test_parse_ray_nodes_realistic_document():
    rows = parse_state_api(ray_doc([ray_row(HEAD_IP, True), ray_row(WORKER_IP, False)]))
    assert [(r["node_ip"], r["is_head_node"], r["state"]) for r in rows] == [
        (HEAD_IP, True, "ALIVE"),
        (WORKER_IP, False, "ALIVE"),
    ]
    assert rows[0]["resources_total"]["GPU"] == 1.0


def test_parse_ray_nodes_bad_input():
    assert parse_state_api("") == []
    assert parse_state_api("curl: (7) Failed to connect to 127.0.0.1 port 8265") == []
    assert parse_state_api(json.dumps({"result": False, "msg": "boom", "data": {}})) == []


def test_parse_ray_nodes_other_json_is_no_rows():
    # whatever else answers on the dashboard port must not crash status
    for text in (
        "null",
        "[]",
        "5",
        '"x"',
        '{"data": null}',
        '{"data": {"result": null}}',
        '{"data": {"result": {"result": null}}}',
        '{"data": []}',
    ):
        assert parse_state_api(text) == [], text


def test_parse_ray_nodes_list_result_and_junk_rows():
    doc = json.dumps({"data": {"result": [ray_row(HEAD_IP, True), "junk", 3]}})
    assert [r["node_ip"] for r in parse_state_api(doc)] == [HEAD_IP]


# ---- judge --------------------------------------------------------------------------------------


def test_healthy():
    nodes, rows = healthy_inputs()
    st = verdict(nodes, parse_state_api(ray_doc(rows)))
    assert st.state == "healthy", st.problems
    assert st.problems == []
    assert st.ray_nodes == 2 and st.ray_gpus == 2.0
    assert [n.ray_alive for n in st.nodes] == [True, True]
    assert st.endpoint == ENDPOINT + "/v1"
    assert st.models == ["testbed-tiny"] and st.server_pid == 4242
    doc = json.loads(st.as_json())
    assert doc["state"] == "healthy" and doc["nodes"][1]["node"] == "spark-worker"


def test_degraded_worker_container_exited():
    nodes, rows = healthy_inputs()
    nodes[1].state = "exited"
    st = verdict(nodes, rows[:1])
    assert st.state == "degraded"
    assert "spark-worker: container exited" in st.problems
    assert not any("spark-head" in p for p in st.problems)


def test_degraded_worker_not_alive_in_ray():
    nodes, rows = healthy_inputs()
    rows[1]["state"] = "DEAD"
    st = verdict(nodes, rows)
    assert st.state == "degraded"
    assert st.problems == [f"spark-worker is not alive in Ray at {WORKER_IP}"]
    assert st.ray_nodes == 1 and st.ray_gpus == 1.0
    assert [n.ray_alive for n in st.nodes] == [True, False]


def test_degraded_worker_registered_at_wrong_address():
    nodes, rows = healthy_inputs()
    rows[1] = ray_row("169.254.3.3", False)
    st = verdict(nodes, rows)
    assert st.state == "degraded"
    assert st.problems == [f"spark-worker is not alive in Ray at {WORKER_IP}"]


def test_degraded_worker_without_its_gpu_in_ray():
    nodes, rows = healthy_inputs()
    rows[1]["resources_total"]["GPU"] = 0.0
    st = verdict(nodes, rows)
    assert st.state == "degraded"
    assert st.problems == ["spark-worker reports 0 GPU(s) in Ray, expected 1"]
    assert st.ray_gpus == 1.0
    rows[1]["resources_total"].pop("GPU")
    assert verdict(nodes, rows).problems == ["spark-worker reports 0 GPU(s) in Ray, expected 1"]


def test_two_gpus_expected_from_inventory():
    from conftest import inventory_dict

    data = inventory_dict()
    data["nodes"][1]["gpus"] = 2
    nodes, rows = healthy_inputs()
    rows[1]["resources_total"]["GPU"] = 2.0
    st = judge(make_inventory(data), nodes, rows, ENDPOINT, EngineView(200, ["testbed-tiny"], True), 1)
    assert st.state == "healthy", st.problems
    assert st.ray_gpus == 3.0


def test_degraded_endpoint_health_not_200():
    nodes, rows = healthy_inputs()
    st = verdict(nodes, rows, health=503, models=())
    assert st.state == "degraded"
    assert st.problems == ["endpoint /health: 503"]
    st = verdict(nodes, rows, health=None, models=())
    assert st.problems == ["endpoint /health: no answer"]


def test_degraded_server_not_running():
    nodes, rows = healthy_inputs()
    st = verdict(nodes, rows, pid=None)
    assert st.state == "degraded"
    assert st.problems == ["vllm serve is not running"]


def test_degraded_node_unreachable():
    nodes, rows = healthy_inputs()
    nodes[1] = NodeStatus("spark-worker", reachable=False, error="connection timed out")
    st = verdict(nodes, rows[:1])
    assert st.state == "degraded"
    assert st.problems == ["spark-worker unreachable: connection timed out"]


def test_degraded_ray_does_not_answer():
    nodes, _ = healthy_inputs()
    st = verdict(nodes, None)
    assert st.state == "degraded"
    assert "Ray does not answer on the head" in st.problems
    assert st.ray_nodes is None and [n.ray_alive for n in st.nodes] == [None, None]


def test_down_when_no_containers_anywhere():
    nodes = [NodeStatus("spark-head"), NodeStatus("spark-worker")]
    st = verdict(nodes, None, health=None, models=(), pid=None)
    assert st.state == "down"
    assert not any("Ray" in p or "endpoint" in p or "vllm serve" in p for p in st.problems)


def test_unreachable_node_is_not_down():
    nodes = [NodeStatus("spark-head"), NodeStatus("spark-worker", reachable=False, error="no route to host")]
    st = verdict(nodes, None, health=None, models=(), pid=None)
    assert st.state == "degraded"
    assert "spark-worker unreachable: no route to host" in st.problems


# ---- node_script --------------------------------------------------------------------------------


def test_every_node_answers_as_a_possible_head_in_its_one_round_trip():
    """Deployments decide which node heads which: each node's script asks Ray and its own head
    container's name, so one round trip per node serves every deployment."""
    inv = make_inventory()
    worker = node_script(inv, "spark-worker")
    assert "8265/api/v0/nodes" in worker and "org.sparkcluster.cluster=pair" in worker
    assert "sparkcluster-pair-head) timeout -k 1 8 docker exec $c sh -c" in worker


def test_degraded_engine_wedged_while_health_200():
    # vLLM 0.32 answers /health without the engine: a stopped rank leaves it at 200
    nodes, rows = healthy_inputs()
    st = verdict(nodes, rows, responds=False, probe="a 1-token completion did not return within 10s")
    assert st.state == "degraded"
    assert st.problems == ["engine wedged: /health is 200 but a 1-token completion did not return within 10s"]
    assert st.engine_responds is False


def test_engine_dead_is_reported_whatever_the_exit_status():
    # a killed rank: the API server exits 0 and /health stops answering; the record's PID is gone
    nodes, rows = healthy_inputs()
    st = verdict(nodes, rows, health=None, models=(), pid=None)
    assert st.state == "degraded"
    assert st.problems == [
        "vllm serve is not running (endpoint /health: no answer); see why with: sparkcluster logs --node spark-head"
    ]


def test_not_probed_without_the_key_is_not_a_wedge():
    nodes, rows = healthy_inputs()
    st = verdict(nodes, rows, responds=None, probe="not probed: the endpoint wants the API key")
    assert st.state == "healthy", st.problems


def test_the_head_containers_sections_give_pid_supervisor_and_journal():
    """What node/container_status's script prints in the head's container, as sections: a running server's PID, the supervisor's
    state and its journal; a PID that no longer runs is no server; no container, nothing."""
    from sparkcluster.facts.probes import SECTION, split_sections
    from sparkcluster.status.status import head_container_view

    rec = '{"profile": "testbed", "model": "testbed-tiny", "port": 8000, "pid": 412, "started_at": 1.0}'
    sup = '{"state": "serving", "since": 1.0, "updated": 2.0, "pid": 412, "restarts": []}'
    journal = '{"ts": 1.0, "event": "vllm serve started", "pid": 412}\n{"ts": 2.0, "event": "state: serving"}'

    def printed(record_rc: int, alive_rc: int) -> str:
        body = {"record": (rec, record_rc), "alive": ("", alive_rc), "supervisor": (sup, 0), "journal": (journal, 0)}
        return "\n".join(f"{SECTION} {name}\n{text}\n{SECTION} {name} rc={rc}" for name, (text, rc) in body.items())

    pid, state, entries = head_container_view(split_sections(printed(0, 0)))
    assert pid == 412 and state["state"] == "serving"
    assert [e["event"] for e in entries] == ["vllm serve started", "state: serving"]
    assert head_container_view(split_sections(printed(0, 1)))[0] is None  # recorded, but the PID is gone
    assert head_container_view(split_sections(printed(1, 1)))[0] is None  # no record
    assert head_container_view({}) == (None, None, [])  # no head container: the exec printed nothing


# ---- a node whose Docker does not answer (issue 23) ---------------------------------------------


class _Host:
    """A node whose SSH round trip printed `out` (sections as node_script prints them)."""

    def __init__(self, name: str, out: str):
        self.name, self.out = name, out

    def run(self, script, timeout, warn):
        from types import SimpleNamespace

        return SimpleNamespace(stdout=self.out, ok=False)


def _printed(**sections) -> str:
    from sparkcluster.facts.probes import SECTION

    return "\n".join(f"{SECTION} {name}\n{text}\n{SECTION} {name} rc={rc}" for name, (text, rc) in sections.items())


MEMINFO = "MemTotal:       127535200 kB\nMemAvailable:   100000000 kB\n"
# what `docker ps` prints on a Spark whose dockerd is stopped (Docker 28's client)
DAEMON_DOWN = "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?"


def test_a_node_whose_docker_is_down_is_docker_not_answering_not_absent():
    from sparkcluster.status.status import DOCKER_SILENT, _one

    out = _printed(uptime=("5000.0 1.0\n1763900000.0", 0), meminfo=(MEMINFO, 0), ours=(DAEMON_DOWN, 1))
    got = _one(_Host("spark-worker", out), make_inventory())
    st = got.status
    assert (st.state, st.error, got.containers) == (DOCKER_SILENT, DAEMON_DOWN, None)
    assert st.mem_available_gib is not None  # what the node did say is kept
    nodes = [running("spark-head", "head"), st]
    got = verdict(nodes, [ray_row(HEAD_IP, True)])
    assert got.state == "degraded" and f"spark-worker: docker not answering: {DAEMON_DOWN}" in got.problems


def test_a_hung_docker_is_named_with_its_bound_and_the_cluster_is_not_called_down():
    from sparkcluster.status.status import DOCKER_BOUND_S, DOCKER_SILENT, _one

    hung = _printed(uptime=("5000.0 1.0\n1763900000.0", 0), meminfo=(MEMINFO, 0), ours=("", 124))
    cut = _printed(uptime=("5000.0 1.0\n1763900000.0", 0), meminfo=(MEMINFO, 0))  # the round trip's own bound
    for out in (hung, cut):
        st = _one(_Host("spark-head", out), make_inventory()).status
        assert st.state == DOCKER_SILENT and f"did not return within {DOCKER_BOUND_S}s" in st.error
    nodes = [
        NodeStatus("spark-head", state=DOCKER_SILENT, error="x"),
        NodeStatus("spark-worker", state=DOCKER_SILENT, error="x"),
    ]
    assert verdict(nodes, None, health=None, models=(), pid=None).state == "degraded"


def test_every_docker_call_in_the_status_script_has_a_bound():
    from sparkcluster.status.status import DOCKER_BOUND_S

    script = node_script(make_inventory(), "spark-head")
    calls = [seg for seg in script.split("docker ")[:-1]]
    assert calls and all(seg.endswith(f"timeout -k 1 {DOCKER_BOUND_S} ") for seg in calls), script


def test_a_supervisor_state_older_than_a_few_looks_is_stale_not_current():
    from sparkcluster.status.status import supervisor_problem

    sup = {"state": "serving", "updated": 100.0, "policy": {"interval_s": 2.0}, "restarts": [], "causes": []}
    assert supervisor_problem({**sup, "age_s": 4.0}) is None
    said = supervisor_problem({**sup, "age_s": 95.0})
    assert said.startswith("supervisor: stale: its last state (serving) is 95s old")
    nodes, rows = healthy_inputs()
    st = judge(
        make_inventory(),
        nodes,
        rows,
        ENDPOINT,
        EngineView(200, ["testbed-tiny"], True, ""),
        4242,
        {**sup, "age_s": 95.0},
    )
    assert st.state == "degraded" and any("stale" in p for p in st.problems)


def test_a_peer_whose_memory_is_unknown_shows_in_status():
    from sparkcluster.status.status import supervisor_problem

    sup = {
        "state": "serving",
        "policy": {"interval_s": 2.0},
        "age_s": 1.0,
        "memory_unknown": {"spark-worker": "its memory report at 198.19.2.2:8297 does not answer (timed out)"},
    }
    assert supervisor_problem(sup) == (
        "supervisor: memory unknown on spark-worker: its memory report at 198.19.2.2:8297 does not answer (timed out)"
    )


def test_the_gateways_container_is_shown_apart_never_as_the_nodes_container():
    """Issue 36: `docker inspect` of ours on the head lists the gateway too; the node's row is the
    deployment's container, and the gateway is reported on its own."""
    import json

    from sparkcluster.labels import CLUSTER_LABEL, GATEWAY_ROLE, PORT_LABEL, ROLE_LABEL
    from sparkcluster.status.status import _one

    def inspected(name, labels):
        return {"Name": f"/{name}", "Config": {"Labels": labels}, "State": {"Status": "running", "StartedAt": ""}}

    listed = [
        inspected("sparkcluster-pair-gateway", {CLUSTER_LABEL: "pair", ROLE_LABEL: GATEWAY_ROLE, PORT_LABEL: "4000"}),
        inspected("sparkcluster-pair-head", {CLUSTER_LABEL: "pair", ROLE_LABEL: "head"}),
    ]
    out = _printed(uptime=("5000.0 1.0\n1763900000.0", 0), meminfo=(MEMINFO, 0), ours=(json.dumps(listed), 0))
    got = _one(_Host("spark-head", out), make_inventory())
    assert got.status.container == "sparkcluster-pair-head" and len(got.containers) == 1
    assert got.gateway == {
        "node": "spark-head",
        "container": "sparkcluster-pair-gateway",
        "state": "running",
        "port": 4000,
    }


def test_status_reads_the_gateways_models_from_its_health(monkeypatch):
    """Issue 36: `status` shows which models the gateway routes (its /health needs no key)."""
    from types import SimpleNamespace

    import httpx

    from sparkcluster.cli.status_cmd import render_all
    from sparkcluster.status import status as status_mod

    answer = {"status": "ok", "models": {"a": True, "b": False}}
    monkeypatch.setattr(httpx, "get", lambda url, timeout: SimpleNamespace(json=lambda: answer))
    assert status_mod._routed("198.18.0.2", 4000) == {"a": True, "b": False}

    def refused(url, timeout):
        raise httpx.ConnectError("refused")

    monkeypatch.setattr(httpx, "get", refused)
    assert status_mod._routed("198.18.0.2", 4000) is None
    st = verdict([running("spark-head", "head"), running("spark-worker", "worker")], [ray_row(HEAD_IP, True)])
    st.gateway = {"node": "spark-head", "container": "g", "state": "running", "port": 4000, "models": answer["models"]}
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(render_all([st]))
    text = console.export_text()
    assert "gateway: g on spark-head port 4000: running  models: a, b (out of rotation)" in text


def test_a_deployment_on_standby_is_healthy_and_a_refused_start_is_degraded_with_why():
    """On demand (issue 36): no engine until a request wakes it is the state asked for."""
    sup = {"state": "standby", "updated": 100.0, "age_s": 1.0, "policy": {"interval_s": 2.0, "on_demand": True}}
    nodes, rows = healthy_inputs()
    st = judge(make_inventory(), nodes, rows, ENDPOINT, EngineView(None, [], None, ""), None, sup)
    assert st.state == "healthy" and st.problems == []
    refused = {**sup, "state": "refused: not enough memory", "refusal": "spark-worker: 4.0 GiB short"}
    st = judge(make_inventory(), nodes, rows, ENDPOINT, EngineView(None, [], None, ""), None, refused)
    assert st.state == "degraded"
    assert st.problems == ["on demand: its last start was refused: spark-worker: 4.0 GiB short"]
    # the same state of a server not on demand is still "not running"
    st = judge(make_inventory(), nodes, rows, ENDPOINT, EngineView(None, [], None, ""), None, {**sup, "policy": {}})
    assert st.state == "degraded" and any("not running" in p for p in st.problems)


def test_a_later_slots_row_is_its_own_container_and_its_script_asks_its_own_agent():
    """Two deployments on one node (issue 60): the round trip of slot 1 reads its own agent (8307),
    its own Ray dashboard (8275) and names its own containers; its row is its own container, while
    every container still comes back for the grouping into deployments."""
    import json as json_mod

    from sparkcluster.labels import CLUSTER_LABEL, PROFILE_LABEL, ROLE_LABEL, SLOT_LABEL
    from sparkcluster.status.status import _one, node_script

    inv = make_inventory().only(["spark-head"]).at_slot(1)
    script = node_script(inv, "spark-head")
    assert ":8307/status" in script and "127.0.0.1:8275/api/v0/nodes" in script
    assert "sparkcluster-pair-d1-head" in script
    listed = [
        {
            "Id": i,
            "Name": f"/{name}",
            "Image": "sha256:" + "ab" * 32,
            "State": {"Status": "running", "Running": True, "StartedAt": "2025-11-23T12:00:00Z"},
            "Config": {"Labels": {CLUSTER_LABEL: "pair", ROLE_LABEL: "head", PROFILE_LABEL: prof, **extra}},
        }
        for i, name, prof, extra in (
            ("a", "sparkcluster-pair-head", "first", {}),
            ("b", "sparkcluster-pair-d1-head", "second", {SLOT_LABEL: "1"}),
        )
    ]
    out = _printed(uptime=("5000.0 1.0\n1763900000.0", 0), meminfo=(MEMINFO, 0), ours=(json_mod.dumps(listed), 0))
    got = _one(_Host("spark-head", out), inv)
    assert (got.status.container, got.status.profile) == ("sparkcluster-pair-d1-head", "second")
    assert len(got.containers) == 2
    first = _one(_Host("spark-head", out), make_inventory())
    assert first.status.container == "sparkcluster-pair-head"


def test_status_html_went_and_says_what_replaces_it(tmp_path, monkeypatch, capsys):
    """An owner's old script still asking `status --html FILE` gets one line naming the console's
    printable view (the head as ssh_config resolves its alias, the gateway's default port) and a fix
    that runs as printed; nothing is written and no node is asked (the inventory's port is closed)."""
    from sparkcluster.cli.main import main
    from tests.unit.test_first_hour import pair_toml

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ssh_config").write_text("Host spark-a-lan\n  HostName 192.0.2.10\n")
    inv = tmp_path / "pair.toml"
    inv.write_text(pair_toml(1, 'ssh_config = "ssh_config"', head="spark-a-lan"))

    for argv, head in (
        (["-i", str(inv), "status", "--html", "x.html"], "192.0.2.10"),
        (["-i", str(tmp_path / "none.toml"), "status", "--html=x.html"], "HEAD"),  # no inventory: a placeholder
    ):
        rc = main(argv)
        got = capsys.readouterr()
        assert rc == 2 and got.out == "", got
        assert got.err.splitlines() == [
            "error: status --html went: the web console's printable view replaces it, at "
            f"http://{head}:4000/console/print once the gateway runs (`gateway up`'s default node and port)",
            "fix: sparkcluster gateway up",
        ]
        assert not (tmp_path / "x.html").exists()
    main(["status", "--help"])
    assert "--html" not in capsys.readouterr().out  # hidden: only an old script finds it
