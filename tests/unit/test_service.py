"""A service beside the models (issue 60 item 2): a profile of kind "service" (config/service_profile),
its reservation in the one admission arithmetic, its container and agent config, its supervisor
(node/service_supervisor: restart on failing health, bounded, memory-gated, the first start not
retried), the gateway routing by route then model name, `status` judging it by its supervisor, and
monitoring scraping its agent. Item 5: a restart of one never starves another deployment on the node,
and a wedge in one is not a wedge in another."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest
from conftest import make_inventory
from gateway_fakes import KEY, Engine, Served, config, in_rotation, start_gateway, until
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route as Path_

from sparkcluster.config import profile as profiles
from sparkcluster.container.service_container import server_spec, service_spec
from sparkcluster.deployment import deployments
from sparkcluster.errors import InputError
from sparkcluster.gateway import health, rollout
from sparkcluster.gateway.routes import Route, Table, Unavailable
from sparkcluster.labels import (
    CLUSTER_LABEL,
    NODES_LABEL,
    PORT_LABEL,
    PROFILE_LABEL,
    RESERVED_LABEL,
    ROLE_LABEL,
    SERVER_ROLE,
    SERVICE_ROLE,
    SLOT_LABEL,
    container_name,
)
from sparkcluster.monitor import scrape
from sparkcluster.node import contract, memory_fit, service_supervisor
from sparkcluster.node.journal import Journal
from sparkcluster.status import status
from sparkcluster.up import bringup, service_up

HEAD, WORKER = "spark-head", "spark-worker"
GB, GiB = memory_fit.GB, memory_fit.GiB
CLUSTER = make_inventory().cluster.name
ASR = """
kind = "service"
description = "seed 004's Spark 1 ASR service on :8765"
image = "example/asr:1"
args = ["python3", "-m", "asr", "--port", "8765"]
port = 8765
memory_gb = 4
routes = ["/v1/audio/transcriptions"]
served_name = "parakeet"
[supervisor]
max_restarts = 2
image = "sparkcluster/vllm-ray:test"
"""


def asr():
    return profiles.parse(ASR, "asr")


def test_a_service_profile_is_read_and_a_model_only_command_refuses_it_in_one_line(tmp_path, monkeypatch):
    svc = asr()
    assert svc.kind == "service" and svc.health_url() == "http://127.0.0.1:8765/health"
    assert svc.routes == ["/v1/audio/transcriptions"] and svc.served_names == ["parakeet"]
    (tmp_path / "asr.toml").write_text(ASR)
    monkeypatch.setenv(profiles.PROFILES_ENV_VAR, str(tmp_path))
    assert profiles.load_profile("asr", service=True) == svc
    with pytest.raises(InputError, match="is a service") as e:
        profiles.load_profile("asr")
    assert "--beside" in e.value.fix
    with pytest.raises(InputError, match="not a profile kind"):
        profiles.parse('kind = "sidecar"', "x")
    for bad, why in (
        (ASR.replace('routes = ["/v1/audio/transcriptions"]', 'routes = ["audio"]'), "routes"),
        (ASR + '\n[env]\nHF_TOKEN = "hf_abcdefghijklmnopqrstu"\n', "env"),
        (ASR.replace("port = 8765", "port = 0"), "port"),
    ):
        with pytest.raises(InputError) as e:
            profiles.parse(bad, "asr")
        assert any(why in d for d in e.value.details), e.value.details


def test_the_role_word_is_one_on_both_sides_and_a_service_container_is_named_for_its_node():
    assert SERVICE_ROLE == contract.SERVICE_ROLE
    assert container_name(CLUSTER, SERVICE_ROLE, HEAD) == f"sparkcluster-{CLUSTER}-service-{HEAD}"
    assert container_name(CLUSTER, SERVICE_ROLE, HEAD, 2) == f"sparkcluster-{CLUSTER}-d2-service-{HEAD}"


def test_the_container_carries_the_labels_and_the_agent_its_service():
    inv = make_inventory().only([WORKER]).at_slot(1)
    server = server_spec(inv, asr(), inv.head, {})
    spec = service_spec(inv, asr(), inv.head, "sparkcluster/vllm-ray:test", server.config_hash())
    assert spec.name == f"sparkcluster-{CLUSTER}-d1-service-{WORKER}" and spec.image == "sparkcluster/vllm-ray:test"
    assert server.name == spec.name + "-server" and server.image == "example/asr:1"
    for c, role in ((spec, SERVICE_ROLE), (server, SERVER_ROLE)):
        assert c.labels[ROLE_LABEL] == role and c.labels[RESERVED_LABEL] == "4" and c.labels[SLOT_LABEL] == "1"
        assert c.labels[PORT_LABEL] == "8765" and c.labels[NODES_LABEL] == WORKER
    # the supervisor runs the agent with the node's Docker socket; the service's image keeps its entrypoint
    assert spec.agent_command() == ["python3", contract.AGENT_DIR, contract.CONFIG_PATH]
    assert spec.binds == {"/var/run/docker.sock": "/run/docker.sock"} and "--gpus" not in spec.docker_run_equivalent()
    assert server.agent_command() == asr().args and "--entrypoint" not in server.docker_run_equivalent()
    assert "entrypoint" not in server.create_kwargs() and server.host_config_kwargs()["restart_policy"] == {
        "Name": "no"
    }
    cfg = json.loads(spec.files[contract.CONFIG_PATH])
    assert cfg["role"] == SERVICE_ROLE and cfg["ray_argv"] == [] and cfg["report_port"] == inv.cluster.agent_port
    assert cfg["service"]["container"] == server.name and cfg["service"]["reserved_bytes"] == 4 * GB
    assert cfg["service"]["policy"]["max_restarts"] == 2 and cfg["service"]["health_url"].endswith(":8765/health")
    assert cfg["server_hash"] == server.config_hash()  # a change of the service makes its supervisor anew


def _listed(name: str, profile: str, slot: int = 0, role: str = "head", **labels) -> dict:
    return {
        "Id": f"{name}-id",
        "Names": [f"/{name}"],
        "Labels": {
            CLUSTER_LABEL: CLUSTER,
            ROLE_LABEL: role,
            PROFILE_LABEL: profile,
            NODES_LABEL: HEAD,
            **({SLOT_LABEL: str(slot)} if slot else {}),
            **labels,
        },
    }


def test_a_service_is_a_deployment_holding_its_reservation():
    inv = make_inventory()
    svc = _listed(f"sparkcluster-{CLUSTER}-d1-service-{HEAD}", "asr", 1, SERVICE_ROLE)
    svc["Labels"].update({RESERVED_LABEL: "4", PORT_LABEL: "8765"})
    found = deployments.group(inv, {HEAD: [_listed(f"sparkcluster-{CLUSTER}-head", "qwen"), svc]})
    assert [(d.profile, d.service, d.reserved_gb, d.port) for d in found] == [
        ("qwen", False, None, None),
        ("asr", True, 4.0, 8765),
    ]
    held = deployments.held(found[1])
    assert held.bytes_of(128 * GB) == 4 * GB and held.said(128 * GB) == "its reservation"


def test_admission_counts_a_services_reservation_beside_the_engines_shares():
    total, floor = 128 * GB, 6 * GiB
    qwen = memory_fit.Held("'qwen'", 0.55)  # seed 004's Spark 1
    want = memory_fit.Held("'asr'", None, 4 * GB)
    assert memory_fit.admit(total, [qwen], want, floor) is None
    why = memory_fit.admit(
        total, [qwen, memory_fit.Held("'nano'", 0.3)], memory_fit.Held("'tts'", None, 20 * GB), floor
    )
    assert why.startswith("'tts' needs 20.0 GB (its reservation)") and "'nano' holds 38.4 GB" in why and "short" in why
    inv = make_inventory().only([HEAD]).at_slot(1)
    beside = [deployments.Deployment("qwen", (HEAD,), fraction=0.55), deployments.Deployment("nano", (HEAD,), slot=2)]
    beside[1].fraction = 0.3
    with pytest.raises(InputError) as e:
        bringup.admit_beside(
            inv, "tts", memory_fit.Held("'tts'", None, 20 * GB), floor, {HEAD: total}, beside, "memory_gb"
        )
    assert "lower memory_gb in profile 'tts'" in e.value.fix and "--beside" in e.value.fix


def test_a_service_runs_on_one_named_node():
    inv = make_inventory()
    assert [n.name for n in service_up.service_node(inv, asr(), (WORKER,)).nodes] == [WORKER]
    with pytest.raises(InputError, match="runs on one node") as e:
        service_up.service_node(inv, asr(), None)
    assert "--node" in e.value.fix
    with pytest.raises(InputError, match="runs on one node"):
        service_up.service_node(inv, asr(), (HEAD, WORKER))


# -- its supervisor


class Clock:
    def __init__(self):
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class FakeDocker:
    """The node's Docker as node/docker_socket.Docker answers the supervisor, for the one container it
    supervises: an inspect document's `State` fields (Running, Pid, ExitCode: the Engine API's
    ContainerInspect, https://docs.docker.com/reference/api/engine/version/v1.43/#tag/Container/
    operation/ContainerInspect), start and stop."""

    def __init__(self):
        self.running, self.pid, self.code, self.calls = False, 100, 0, []

    def inspect(self, name):
        return {"State": {"Running": self.running, "Pid": self.pid if self.running else 0, "ExitCode": self.code}}

    def start(self, name):
        self.calls.append(("start", name))
        if not self.running:
            self.running, self.pid = True, self.pid + 1

    def stop(self, name, grace_s):
        self.calls.append(("stop", name))
        if self.running:
            self.running, self.code = False, 143

    def exit(self, code: int) -> None:
        self.running, self.code = False, code


def _supervisor(tmp_path, monkeypatch, answers: list, mem_available_gib: float = 100.0, docker=None, **policy):
    """A ServiceSupervisor over a fake Docker (the service's container), its health answers from
    `answers` (the last repeats), its files in tmp_path, the node's meminfo a file the test writes."""
    for name in ("STATE_PATH", "RECORD_PATH", "MEMINFO"):
        monkeypatch.setattr(service_supervisor, name, str(tmp_path / name.lower()))
    meminfo(tmp_path, mem_available_gib)

    def healthy(url):
        return answers.pop(0) if len(answers) > 1 else answers[0]

    monkeypatch.setattr(service_supervisor, "healthy", healthy)
    cfg = {
        "node": HEAD,
        "service": {
            "container": "svc-server",
            "health_url": "http://127.0.0.1:1/health",
            "reserved_bytes": 4 * GB,
            "policy": {"health_failures": 2, "max_restarts": 2, "ready_timeout_s": 30.0, **policy},
        },
    }
    clock = Clock()
    docker = docker or FakeDocker()
    sup = service_supervisor.ServiceSupervisor(cfg, Journal(str(tmp_path / "journal")), clock, docker=docker)
    return sup, clock


def meminfo(tmp_path, available_gib: float, total_gb: float = 128) -> None:
    kib = int(total_gb * GB / 1024)
    (tmp_path / "meminfo").write_text(f"MemTotal: {kib} kB\nMemAvailable: {int(available_gib * GiB / 1024)} kB\n")


def _events(tmp_path) -> list[str]:
    return [json.loads(x)["event"] for x in (tmp_path / "journal").read_text().splitlines()]


OK, DOWN = (True, ""), (False, "http://127.0.0.1:1/health: ConnectionRefusedError")


def test_a_failing_health_check_restarts_the_service_within_its_bound(tmp_path, monkeypatch):
    answers = [OK, DOWN, DOWN]
    sup, clock = _supervisor(tmp_path, monkeypatch, answers)
    try:
        sup.tick()  # the first start
        assert sup.state == contract.STARTING and sup.proc is not None
        sup.tick()
        assert sup.state == contract.SERVING
        first = sup.proc.pid
        sup.tick()  # one failed answer: not yet
        assert sup.state == contract.SERVING and sup.failures == 1
        sup.tick()  # two in a row: restarted
        assert sup.state == contract.RESTARTING and sup.proc is None
        assert "2 failed health checks in a row" in sup.causes[-1]["cause"]
        sup.tick()  # the backoff holds it
        assert sup.proc is None
        clock.now += 60
        answers[:] = [OK]
        sup.tick()
        assert sup.state == contract.STARTING and sup.proc.pid != first
        sup.tick()
        assert sup.state == contract.SERVING
        state = json.loads(Path(service_supervisor.STATE_PATH).read_text())
        assert state["state"] == contract.SERVING and len(state["restarts"]) == 1
        assert health.judge({"ts": clock.now, "supervisor": state}).up  # the gateway judges it as an engine
        # the bound: at max_restarts in the window, it stops for good
        for _ in range(2):
            answers[:] = [DOWN]
            sup.tick()
            sup.tick()
            clock.now += 60
            answers[:] = [OK]
            sup.tick()
            sup.tick()
        assert sup.state == contract.LIMIT and sup.proc is None
        assert "service stopped" in _events(tmp_path)
    finally:
        sup.stop("test")


def test_an_exit_is_a_verdict_and_a_first_start_that_never_serves_is_not_retried(tmp_path, monkeypatch):
    sup, clock = _supervisor(tmp_path, monkeypatch, [DOWN])
    try:
        sup.tick()
        clock.now += 31  # past ready_timeout_s without one healthy answer
        sup.tick()
        assert sup.state == contract.FAILED and sup.proc is None and sup.causes[-1]["kind"] == "not-ready"
        sup.tick()
        assert sup.proc is None  # final: only `up` starts it again
    finally:
        sup.stop("test")
    (tmp_path / "b").mkdir()
    sup, clock = _supervisor(tmp_path / "b", monkeypatch, [OK])
    try:
        sup.first_start = False
        sup.tick()
        sup.tick()
        sup.docker.exit(1)
        sup.tick()
        assert sup.state == contract.RESTARTING and "exited" in sup.causes[-1]["cause"]
    finally:
        sup.stop("test")


def test_a_restart_waits_until_the_node_covers_its_reservation_and_the_floor(tmp_path, monkeypatch):
    """Item 5: what another deployment on the node holds is not in MemAvailable; a restart that would
    take it waits (and past memory_wait_s gives up), never starts into it."""
    sup, clock = _supervisor(tmp_path, monkeypatch, [OK], mem_available_gib=8.0, memory_wait_s=100.0)
    try:
        sup.first_start = False  # it served, then failed: a restart
        sup.tick()
        assert sup.proc is None and sup.state == contract.MEMORY_WAIT  # 8 GiB < 4 GB + the 6 GiB floor
        meminfo(tmp_path, 12.0)
        sup.tick()
        assert sup.proc is not None and sup.state == contract.STARTING
        events = _events(tmp_path)
        assert events.index("memory came back") < events.index("service started")
        sup.stop("test")
        meminfo(tmp_path, 2.0)
        sup.tick()
        clock.now += 101
        sup.tick()
        assert sup.state == contract.NO_MEMORY and sup.proc is None
    finally:
        sup.stop("test")


def test_its_container_restart_keeps_the_count_and_a_final_state(tmp_path, monkeypatch):
    sup, clock = _supervisor(tmp_path, monkeypatch, [OK])
    sup.restarts = [clock.now]
    sup.set_state(contract.LIMIT)
    again, _ = _supervisor(tmp_path, monkeypatch, [OK])
    assert again.state == contract.LIMIT and again.restarts == [clock.now] and not again.first_start


def test_the_agents_metrics_carry_the_services_supervisor(tmp_path, monkeypatch):
    from sparkcluster.node.metrics import supervisor_samples

    sup, _ = _supervisor(tmp_path, monkeypatch, [OK])
    try:
        sup.tick()
        sup.tick()
        names = {(n, tuple(sorted(labels.items()))): v for n, labels, v in supervisor_samples(sup, sup.clock())}
        assert names[("sparkcluster_supervisor_state", (("state", contract.SERVING),))] == 1
        assert names[("sparkcluster_probe_success", ())] == 1
        assert names[("sparkcluster_supervisor_restart_limit", ())] == 2
    finally:
        sup.stop("test")


# -- the gateway, status, monitoring


def test_the_gateway_routes_a_service_by_route_then_by_model_name():
    def route(key, names=(), paths=(), up=True):
        r = Route(key, tuple(names), f"http://{key}", f"http://{key}/r", paths=tuple(paths))
        r.up = up
        return r

    asr_a = route("asr@a", ["parakeet"], ["/v1/audio/transcriptions"])
    asr_b = route("whisper@a", ["whisper"], ["/v1/audio/transcriptions"])
    tts = route("tts@b", [], ["/v1/audio/speech"], up=False)
    t = Table([route("qwen@a", ["qwen"]), asr_a, asr_b, tts])
    assert t.paths() == {"/v1/audio/transcriptions", "/v1/audio/speech"}
    assert t.pick_path("/v1/audio/transcriptions", "whisper") is asr_b
    assert t.pick_path("/v1/audio/transcriptions", "parakeet") is asr_a
    assert {t.pick_path("/v1/audio/transcriptions", None).key for _ in range(4)} == {"asr@a", "whisper@a"}
    assert isinstance(t.pick_path("/v1/audio/speech", "tts-1"), Unavailable)
    assert t.pick_path("/v1/embeddings", None) is None
    assert t.pick("qwen").key == "qwen@a"


def test_rollout_sends_a_service_its_routes_at_its_port_and_no_engine_key():
    inv = make_inventory()
    d = deployments.Deployment("asr", (HEAD,), slot=1, service=True, port=8765)
    ups = rollout.upstreams(inv, [d], {"asr": asr()})
    ip = inv.node(HEAD).control_ip
    assert ups[0].url == f"http://{ip}:8765" and ups[0].paths == ("/v1/audio/transcriptions",)
    assert ups[0].supervisor == f"http://{ip}:{inv.at_slot(1).cluster.agent_port}/"
    plan = rollout.GatewayPlan(inv, HEAD, "img", 4000, 30, ups, ["k" * 24], upstream_key="engine-key-123456789")
    entry = plan.config()["deployments"][0]
    assert entry["paths"] == ["/v1/audio/transcriptions"] and entry["api_key"] is None


class Asr:
    """A stand-in service: the OpenAI transcription route (multipart, as clients send it) and its
    agent's report, whose supervisor state the test sets."""

    def __init__(self):
        self.state, self.causes, self.seen = contract.SERVING, [], []

    def app(self) -> Starlette:
        async def transcribe(request: Request):  # the multipart body as it came (no form parser needed)
            body = await request.body()
            self.seen.append({"headers": dict(request.headers), "body": body})
            return JSONResponse({"text": f"heard {body.count(b'RIFF')} file"})

        async def report(request: Request):
            sup = {"state": self.state, "updated": 0, "causes": self.causes, "policy": {}, "memory_unknown": {}}
            return JSONResponse({"ts": 0, "supervisor": sup})

        return Starlette(
            routes=[
                Path_("/v1/audio/transcriptions", transcribe, methods=["POST"]),
                Path_("/report", report),
                Path_("/health", lambda r: Response("ok")),
            ]
        )


def test_two_models_and_a_service_on_one_node_a_wedge_in_one_leaves_the_others_answering():
    """Item 5 through the gateway: two engines and a service on one node; the first engine's
    supervisor publishes a wedge: only it leaves rotation, the other model and the service answer."""
    a, b, s = Engine(["qwen"]), Engine(["nano"]), Asr()
    sa, sb, ss = Served(a.app()), Served(b.app()), Served(s.app())
    cfg = config({"qwen@spark-head": (a, sa), "nano@spark-head": (b, sb)})
    for d in cfg["deployments"]:
        d["nodes"] = [HEAD]
    cfg["deployments"].append(
        {
            "key": "asr@spark-head",
            "names": ["parakeet"],
            "upstream": ss.url,
            "supervisor": f"{ss.url}/report",
            "api_key": None,
            "nodes": [HEAD],
            "paths": ["/v1/audio/transcriptions"],
        }
    )
    gw, sg = start_gateway(cfg)
    bearer = {"Authorization": f"Bearer {KEY}"}
    try:
        until(lambda: all(in_rotation(gw, k) for k in ("qwen@spark-head", "nano@spark-head", "asr@spark-head")))
        files = {"file": ("a.wav", b"RIFF" + b"\0" * 60, "audio/wav")}
        r = httpx.post(f"{sg.url}/v1/audio/transcriptions", files=files, data={"model": "parakeet"}, headers=bearer)
        assert r.status_code == 200 and r.json() == {"text": "heard 1 file"}
        sent = s.seen[-1]
        assert sent["headers"]["content-type"].startswith("multipart/form-data; boundary=")
        assert b'name="model"\r\n\r\nparakeet' in sent["body"] and "authorization" not in sent["headers"]
        assert httpx.post(f"{sg.url}/v1/audio/transcriptions", files=files).status_code == 401
        a.state = contract.RESTARTING
        a.causes = [{"ts": 1, "kind": "wedged", "cause": "no progress for 60s"}]
        until(lambda: in_rotation(gw, "qwen@spark-head", up=False), what="the wedged engine out of rotation")
        assert httpx.post(f"{sg.url}/v1/chat/completions", json={"model": "qwen"}, headers=bearer).status_code == 503
        assert httpx.post(f"{sg.url}/v1/chat/completions", json={"model": "nano"}, headers=bearer).status_code == 200
        r = httpx.post(f"{sg.url}/v1/audio/transcriptions", files=files, headers=bearer)
        assert r.status_code == 200
        s.state = contract.LIMIT
        until(lambda: in_rotation(gw, "asr@spark-head", up=False), what="the service out of rotation")
        r = httpx.post(f"{sg.url}/v1/audio/transcriptions", files=files, headers=bearer)
        assert r.status_code == 503 and "restart limit reached" in r.json()["error"]["message"]
        assert httpx.post(f"{sg.url}/v1/chat/completions", json={"model": "nano"}, headers=bearer).status_code == 200
        routes = httpx.get(f"{sg.url}/gateway/status", headers=bearer).json()["routes"]
        assert routes[-1]["paths"] == ["/v1/audio/transcriptions"]
    finally:
        a.release.set()
        b.release.set()
        for x in (sg, sa, sb, ss):
            x.stop()


def test_status_judges_a_service_by_its_supervisor():
    inv = make_inventory().only([HEAD]).at_slot(1)
    node = [status.NodeStatus(HEAD, state="running")]
    sup = {"state": contract.SERVING, "updated": 0, "age_s": 1.0, "policy": {}}
    st = status.judge_service(inv, node, "http://h:8765", 42, sup)
    assert st.state == "healthy" and st.endpoint == "http://h:8765" and st.server_pid == 42
    cause = {"ts": 1, "kind": "unhealthy", "cause": "3 failed health checks in a row"}
    st = status.judge_service(inv, node, "", None, {**sup, "state": contract.RESTARTING, "causes": [cause]})
    assert st.state == "degraded" and "3 failed health checks" in st.problems[0]
    st = status.judge_service(inv, node, "", None, {**sup, "state": contract.FAILED, "causes": [cause]})
    assert "the service failed to start" in st.problems[0]
    from rich.console import Console

    from sparkcluster.cli import status_cmd

    console = Console(width=160, record=True)
    console.print(status_cmd.render(status.judge_service(inv, node, "http://h:8765", 42, sup)))
    assert "endpoint: http://h:8765  service: serving  service pid 42" in console.export_text()
    st = status.judge_service(inv, [status.NodeStatus(HEAD, state="exited")], "", None, None)
    assert st.state == "degraded" and st.problems == [f"{HEAD}: container exited"]


def test_monitoring_scrapes_a_services_agent_and_no_vllm_target():
    inv = make_inventory()
    found = [
        deployments.Deployment("qwen", (HEAD,)),
        deployments.Deployment("asr", (HEAD,), slot=1, service=True, port=8765),
    ]
    served = scrape.served(inv, found)
    assert served[1].service and served[1].port == 8765
    targets = scrape.targets(inv, served)
    ip = inv.node(HEAD).control_ip
    agent = [t for t in targets if t.address == f"{ip}:{inv.at_slot(1).cluster.agent_port}"]
    assert agent and agent[0].labels["role"] == SERVICE_ROLE and agent[0].labels["deployment"] == f"asr@{HEAD}"
    assert not [t for t in targets if t.job == scrape.VLLM_JOB and t.address.endswith(":8765")]


def test_an_engines_restart_never_starts_into_what_a_neighbour_holds():
    """Item 5, the engine's side: seed 004's Spark 1 with Qwen (0.55) serving beside a 0.2 engine that
    restarts: what Qwen holds is not in MemAvailable, so the restart waits until its own share and the
    floor are free again (node/verdict.memory_for_restart, the supervisor's restart gate)."""
    from sparkcluster.node.verdict import memory_for_restart

    total = 128 * GB
    policy = contract.Policy(memory_need_fraction=0.2)
    left_by_qwen = total - int(0.55 * total)  # 57.6 GB, before the restarting engine's memory came back
    covered, seen = memory_for_restart({HEAD: (total, left_by_qwen - 30 * GB)}, policy)
    assert not covered and "short" in seen[HEAD]
    covered, _ = memory_for_restart({HEAD: (total, left_by_qwen - 2 * GB)}, policy)
    assert covered


def test_seed_004s_services_as_the_stacks_guide_writes_them():
    """docs/guides/stacks.md: the log's ASR and TTS as service profiles of public arm64 images
    (Speaches' multi-arch build, Chatterbox-TTS-Server's cu130 arm64 build), each with its own
    entrypoint kept (no `args`), its port and health URL as its sources give them, the page's sums
    beside Qwen and Gemma the admission's; a secret a file named by the variable the server reads."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "guides" / "stacks.md").read_text()
    blocks = [b for b in re.findall(r"```toml\n(.*?)```", page, re.S) if 'kind = "service"' in b]
    stt, tts = (profiles.parse(b, n) for b, n in zip(blocks, ("speaches-stt", "chatterbox-tts"), strict=True))
    assert (stt.port, stt.routes, tts.port, tts.routes) == (
        8765,
        ["/v1/audio/transcriptions"],
        8004,
        ["/v1/audio/speech"],
    )
    assert (stt.health, tts.health) == ("/health", "/api/model-info")
    assert stt.image == "ghcr.io/speaches-ai/speaches:latest-cuda" and stt.env == {"UVICORN_PORT": "8765"}
    assert tts.image == "ghcr.io/devnen/chatterbox-tts-server:main-cu130" and not stt.args and not tts.args
    assert stt.secrets == [] and [(x.name, x.file_env) for x in tts.secrets] == [("HF_TOKEN", "HF_TOKEN_PATH")]
    ro = {b.target: b.read_only for b in tts.binds}
    assert ro["/app/voices"] and ro["/app/reference_audio"] and not ro["/app/config.yaml"] and stt.gpu and tts.gpu
    assert "are not reachable from where this guide was written" in page.replace("\n", " ")
    total, floor = 128 * GB, 6 * GiB
    qwen, gemma = memory_fit.Held("'qwen'", 0.55), memory_fit.Held("'gemma'", 0.80)
    for engine, svc, said in ((qwen, stt, "81.8 GB"), (gemma, tts, "116.8 GB")):
        want = memory_fit.Held(f"'{svc.name}'", None, int(svc.memory_gb * GB))
        assert memory_fit.admit(total, [engine], want, floor) is None
        assert memory_fit.gb(engine.bytes_of(total) + want.bytes_of(total) + floor) == said and said in page


# -- up of a service, against a fake Docker API


class FakeApi:
    """The Engine API as up/service_up uses it: one container of ours at most, the state file its
    supervisor writes (set by the test), the image present or pulled."""

    def __init__(self, states: list[dict | None], image: bool = True):
        self.states, self.image = states, image
        self.listed: list[dict] = []
        self.made: list[dict] = []
        self.removed: list[str] = []
        self.pulled: list[str] = []
        self.started: list[str] = []

    def containers(self, all=False, filters=None):
        return self.listed

    def inspect_image(self, ref):
        import docker.errors

        if not self.image:
            raise docker.errors.ImageNotFound("no such image")

    def pull(self, ref):
        self.pulled.append(ref)

    def create_host_config(self, **kw):
        return kw

    def create_container(self, host_config=None, **kw):
        self.made.append(kw)
        return {"Id": f"cid{len(self.made)}"}

    def put_archive(self, cid, path, data):
        pass

    def start(self, cid):
        self.started.append(cid)

    def get_archive(self, cid, path):
        import io
        import tarfile

        import docker.errors

        doc = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        if doc is None:
            raise docker.errors.NotFound("no state yet")
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            data = json.dumps(doc).encode()
            info = tarfile.TarInfo("supervisor.json")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        return [buf.getvalue()], {}

    def remove_container(self, cid, force=False):
        self.removed.append(cid)

    def logs(self, cid, tail=None, **kw):
        return b"asr: no model at /models\n"


class FakeHost:
    name, address = HEAD, "192.0.2.10"

    def __init__(self, api):
        self.api = api

    def docker(self):
        return self

    def run(self, cmd, timeout=30.0, stdin=None, *, warn=False):
        class Done:
            ok, stdout, stderr, exit_code = True, "", "", 0

        return Done()


class Quiet:
    def stage(self, name):
        pass

    def done(self, name, seconds, note=""):
        self.note = note

    def info(self, text):
        pass


def test_up_makes_the_container_waits_for_serving_and_again_changes_nothing(monkeypatch):
    from sparkcluster.deployment import teardown

    monkeypatch.setattr(teardown, "remove_container", lambda host, cid: host.api.removed.append(cid) or True)
    inv = make_inventory().only([HEAD]).at_slot(2)
    svc = asr()
    server = server_spec(inv, svc, inv.head, {})
    spec = service_spec(inv, svc, inv.head, "sparkcluster/vllm-ray:test", server.config_hash())
    api = FakeApi([None, {"state": contract.STARTING}, {"state": contract.SERVING, "pid": 7}], image=False)
    got = service_up._start(FakeHost(api), inv, svc, spec, server, Quiet(), 0.0)
    assert not got.unchanged and got.pid == 7 and got.slot == 2 and got.endpoint == "http://192.0.2.10:8765"
    assert api.pulled == ["example/asr:1", "sparkcluster/vllm-ray:test"] and api.removed == []
    # the service's own container is made first and left for its supervisor to start; the supervisor is started
    assert [m["name"] for m in api.made] == [server.name, spec.name] and api.started == ["cid2"]
    # again: the same configuration serving in its container is left alone
    api.listed = [{"Id": "cid2", "State": "running", "Labels": spec.create_kwargs()["labels"]}]
    again = service_up._start(FakeHost(api), inv, svc, spec, server, Quiet(), 0.0)
    assert again.unchanged and len(api.made) == 2 and api.removed == []


def test_up_of_a_service_that_fails_to_start_removes_its_container_and_says_why(monkeypatch):
    from sparkcluster.deployment import server, teardown
    from sparkcluster.errors import SparkError

    monkeypatch.setattr(teardown, "remove_container", lambda host, cid: host.api.removed.append(cid) or True)
    monkeypatch.setattr(server, "supervisor_tail", lambda api, cid: "the journal's last lines")
    inv = make_inventory().only([HEAD]).at_slot(1)
    failed = {"state": contract.FAILED, "causes": [{"kind": "not-ready", "cause": "no healthy answer within 600s"}]}
    api = FakeApi([failed])
    server = server_spec(inv, asr(), inv.head, {})
    spec = service_spec(inv, asr(), inv.head, "sparkcluster/vllm-ray:test", server.config_hash())
    with pytest.raises(SparkError, match="did not serve: no healthy answer within 600s") as e:
        service_up._start(FakeHost(api), inv, asr(), spec, server, Quiet(), 0.0)
    assert api.removed == ["cid1", "cid2"] and "events --profile asr" in e.value.fix
    # the service's own last lines under its supervisor's: a server that refused to start says why
    shown = "\n".join(e.value.details)
    assert "| the journal's last lines" in shown and "| asr: no model at /models" in shown, shown


class FakeCluster:
    def __init__(self, hosts):
        self.hosts = hosts

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


def test_up_of_a_service_where_models_run_asks_for_beside_and_its_dry_run_names_its_slot(monkeypatch):
    inv = make_inventory()
    qwen = deployments.Deployment("qwen", (HEAD,), fraction=0.55)
    monkeypatch.setattr(
        service_up, "connect_reachable", lambda full: (FakeCluster({HEAD: FakeHost(FakeApi([None]))}), {})
    )
    monkeypatch.setattr(deployments, "on", lambda cluster, full: ([qwen], {}))
    with pytest.raises(InputError, match="'qwen' on spark-head runs on the node service 'asr' needs") as e:
        service_up.run(inv, asr(), Quiet(), monitoring=None, node=(HEAD,))
    assert e.value.fix.startswith(f"sparkcluster up --profile asr --node {HEAD} --beside")
    plan = service_up.run(inv, asr(), Quiet(), monitoring=None, node=(HEAD,), beside=True, dry_run=True)
    assert plan.slot == 1 and f"--name sparkcluster-{CLUSTER}-d1-service-{HEAD}" in plan.docker_run
    assert "admitted beside 'qwen' on spark-head" in plan.render()
    other = deployments.Deployment("whisper", (HEAD,), slot=1, service=True, port=8765)
    monkeypatch.setattr(deployments, "on", lambda cluster, full: ([qwen, other], {}))
    with pytest.raises(InputError, match="answers on port 8765") as e:
        service_up.run(inv, asr(), Quiet(), monitoring=None, node=(HEAD,), beside=True, dry_run=True)
    assert "another port" in e.value.fix
    with pytest.raises(InputError, match="--replace is for a model's profile"):
        service_up.run(inv, asr(), Quiet(), monitoring=None, node=(HEAD,), replace=True)


def test_the_command_line_takes_a_service_where_it_can_and_refuses_it_in_one_line_elsewhere(
    tmp_path, monkeypatch, capsys
):
    from sparkcluster.cli.main import main

    (tmp_path / "asr.toml").write_text(ASR)
    monkeypatch.setenv(profiles.PROFILES_ENV_VAR, str(tmp_path))
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    pair = re.search(r"```toml\n(.*?)```", readme.split("### A complete inventory: the pair", 1)[1], re.S).group(1)
    (tmp_path / "cluster.toml").write_text(pair)
    assert main(["profile", "list"]) == 0
    assert "service: /v1/audio/transcriptions (example/asr:1)" in capsys.readouterr().out
    assert main(["profile", "lint", "asr"]) == 2
    err = capsys.readouterr().err
    assert "profile 'asr' is a service" in err and "--beside" in err
    inventory = ["--inventory", str(tmp_path / "cluster.toml")]
    assert main([*inventory, "up", "--profile", "asr", "--node", "spark-a", "--dry-run", "--offline"]) == 2
    assert "--offline is for a model's plan" in capsys.readouterr().err
    assert main([*inventory, "up", "--profile", "asr", "--node", "spark-a", "--smoke"]) == 2
    assert "is a service" in capsys.readouterr().err


def test_up_of_a_service_walks_exactly_the_steps_its_dry_run_prints(monkeypatch):
    """A service's `up` is steps of the shared engine (steps/walk), each with its run: what its dry run
    prints (admitted, its container looked for, its image pulled, made, waited on) is what runs."""
    import contextlib

    from sparkcluster.deployment import teardown
    from sparkcluster.steps import walk

    class MemHost(FakeHost):
        def run(self, cmd, timeout=30.0, stdin=None, *, warn=False):
            class Done:
                ok, stderr, exit_code = True, "", 0
                stdout = "MemTotal:       125000000 kB\nMemAvailable:   120000000 kB\n"

            return Done()

    walked: list[str] = []
    monkeypatch.setattr(walk, "event", lambda step, outcome, seconds=None: walked.append(step.id))
    monkeypatch.setattr(teardown, "remove_container", lambda host, cid: True)
    monkeypatch.setattr(service_up, "NodeLocks", lambda *a: contextlib.nullcontext())
    api = FakeApi([{"state": contract.SERVING, "pid": 7}], image=False)
    monkeypatch.setattr(service_up, "connect_reachable", lambda full: (FakeCluster({HEAD: MemHost(api)}), {}))
    monkeypatch.setattr(deployments, "on", lambda cluster, full: ([], {}))
    inv = make_inventory()
    plan = service_up.run(inv, asr(), Quiet(), monitoring=None, node=(HEAD,), dry_run=True)
    ids = [s["id"] for s in json.loads(plan.as_json())]
    actions = ("admit", "look", "pull", "pull-supervisor", "create-server", "create-supervisor", "wait")
    assert ids == [f"service/{HEAD}/{a}" for a in actions] and walked == []
    assert all(s.run is not None for s in plan.steps()) and "[service]" in plan.render()
    got = service_up.run(inv, asr(), Quiet(), monitoring=lambda *a: contextlib.nullcontext(), node=(HEAD,))
    assert walked == ids and got.pid == 7 and api.pulled == ["example/asr:1", "sparkcluster/vllm-ray:test"]
