"""A service from its own image (issue 72 item 2): a profile's binds, secrets, ports and GPU flag
judged in one place (config/service_profile); the service's own container (its image's entrypoint
kept, its secrets files, its binds' modes, no GPU where it says none) and its supervisor beside it
(the cluster's image, the Docker socket); the ports checked free on facts; the supervisor watching
a container through the Engine API over a Unix socket (node/docker_socket); the gateway sending a
service its own key; no secret in a dry run, a label, an argv or an environment."""

from __future__ import annotations

import io
import json
import re
import socket
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from conftest import make_inventory
from test_service import ASR, CLUSTER, HEAD, FakeApi, FakeCluster, FakeDocker, FakeHost, Quiet, _supervisor, asr

from sparkcluster import redact
from sparkcluster.config import profile as profiles
from sparkcluster.container import spec as specs
from sparkcluster.container.service_container import server_spec, service_config, service_spec
from sparkcluster.deployment import deployments
from sparkcluster.errors import InputError
from sparkcluster.facts import parsers
from sparkcluster.gateway import rollout
from sparkcluster.labels import CLUSTER_LABEL, ROLE_LABEL
from sparkcluster.node import contract, docker_socket
from sparkcluster.up import service_up

KEY = "sk-tts-key-0123456789abcdefXYZ"  # an OpenAI-style key: masked wherever it shows up
TTS = """
kind = "service"
image = "ghcr.io/devnen/chatterbox-tts-server:main-cu130"
port = 8004
ports = [8005]
health = "/api/model-info"
memory_gb = 8
routes = ["/v1/audio/speech"]
gpu = false
[[binds]]
source = "/home/owner/voices"
target = "/app/voices"
[[binds]]
source = "tts-cache"
target = "/app/hf_cache"
read_only = false
[[secrets]]
name = "TTS_API_KEY"
file_env = "API_KEY_FILE"
bearer = true
[supervisor]
image = "sparkcluster/vllm-ray:test"
"""


def tts(text: str = TTS):
    return profiles.parse(text, "tts")


def refused(text: str) -> list[str]:
    with pytest.raises(InputError) as e:
        profiles.parse(text, "tts")
    return e.value.details


# -- the profile


def test_binds_secrets_and_ports_are_read_with_their_defaults():
    svc = tts()
    assert svc.args == [] and svc.all_ports == [8004, 8005] and not svc.gpu
    voices, cache = svc.binds
    assert (voices.read_only, voices.volume, voices.docker_bind()) == (True, False, "/home/owner/voices:/app/voices:ro")
    assert (cache.read_only, cache.volume, cache.docker_bind()) == (False, True, "tts-cache:/app/hf_cache:rw")
    key = svc.secrets[0]
    assert key.file == "/run/sparkcluster-secrets/TTS_API_KEY" and svc.bearer is key
    # the profile of before (args, the engine's GPUs) reads as it did
    old = asr()
    assert old.args[0] == "python3" and old.gpu and old.binds == [] and old.secrets == []


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (('source = "/home/owner/voices"', 'source = "voices"'), None),  # a named volume: fine
        (('source = "/home/owner/voices"', 'source = "./voices"'), "neither an absolute path"),
        (('source = "/home/owner/voices"', 'source = "/home/owner/../../etc"'), "may not contain '..'"),
        (('source = "/home/owner/voices"', 'source = "/"'), "the node's whole filesystem"),
        (('target = "/app/voices"', 'target = "/"'), "would cover"),
        (('target = "/app/voices"', 'target = "/etc"'), "would cover"),
        (('target = "/app/voices"', 'target = "/run/sparkcluster-secrets/x"'), "would cover"),
        (('target = "/app/voices"', 'target = "/app/hf_cache"'), "mounted more than once"),
        (('target = "/app/voices"', 'target = "/app/a:b"'), "Docker's bind syntax"),
        (('name = "TTS_API_KEY"', 'name = "TTS-API-KEY"'), "name"),
        (('file_env = "API_KEY_FILE"', 'file_env = "API_KEY_FILE"\npath = "/app/hf_cache/key"'), "a mount would hide"),
        (("ports = [8005]", "ports = [8004]"), "listed twice"),
        (("ports = [8005]", "ports = [70000]"), "ports"),
    ],
)
def test_a_bind_a_secret_or_a_port_that_cannot_work_is_refused_naming_it(change, said):
    text = TTS.replace(*change)
    if said is None:
        assert tts(text).binds[0].volume
        return
    details = refused(text)
    assert any(said in d for d in details), details


def test_two_secrets_that_collide_or_a_secret_in_env_are_refused():
    twice = TTS + '[[secrets]]\nname = "TTS_API_KEY"\n'
    assert any("more than once" in d for d in refused(twice))
    two_bearers = TTS + '[[secrets]]\nname = "OTHER_KEY"\nbearer = true\n'
    assert any("at most one" in d for d in refused(two_bearers))
    shadowed = TTS.replace("gpu = false", 'gpu = false\n[env]\nAPI_KEY_FILE = "/elsewhere"')
    assert any("also set in env" in d for d in refused(shadowed))
    # a secret's value in env is refused as before: docker inspect would show it
    in_env = TTS.replace("gpu = false", f'gpu = false\n[env]\nTTS_API_KEY = "{KEY}"')
    assert any("docker inspect" in d for d in refused(in_env))


# -- its two containers


def test_the_services_own_container_keeps_its_image_and_carries_its_secret_as_a_file_only():
    inv = make_inventory().only([HEAD]).at_slot(1)
    server = server_spec(inv, tts(), inv.head, {"TTS_API_KEY": KEY})
    assert server.name == f"sparkcluster-{CLUSTER}-d1-service-{HEAD}-server"
    kw, hc = server.create_kwargs(), server.host_config_kwargs()
    assert "entrypoint" not in kw and kw["command"] == []  # the image's ENTRYPOINT and CMD both stay
    assert kw["environment"] == {"API_KEY_FILE": "/run/sparkcluster-secrets/TTS_API_KEY"}
    assert hc["binds"] == {
        "/home/owner/voices": {"bind": "/app/voices", "mode": "ro"},
        "tts-cache": {"bind": "/app/hf_cache", "mode": "rw"},
    }
    # gpu = false: no GPUs; a service gets none of the engines' fabric flags; Docker restarts nothing
    assert "device_requests" not in hc and "devices" not in hc and "cap_add" not in hc and "ipc_mode" not in hc
    assert hc["restart_policy"] == {"Name": "no"} and hc["network_mode"] == "host"
    run = server.docker_run_equivalent()
    assert "--gpus" not in run and "--entrypoint" not in run and "-v /home/owner/voices:/app/voices:ro" in run
    assert server.secret_files == {"/run/sparkcluster-secrets/TTS_API_KEY": (KEY, 0o444)}
    for shown in (run, json.dumps(kw), json.dumps(hc), repr(server), server.config_hash()):
        assert KEY not in shown
    # a new key makes a new container (its digest counts in the hash); the same key, the same
    again = server_spec(inv, tts(), inv.head, {"TTS_API_KEY": KEY})
    other = server_spec(inv, tts(), inv.head, {"TTS_API_KEY": KEY + "2"})
    assert again.config_hash() == server.config_hash() != other.config_hash()
    # with the GPUs
    gpu = server_spec(inv, tts(TTS.replace("gpu = false", "gpu = true")), inv.head, {})
    assert gpu.host_config_kwargs()["device_requests"][0]["Capabilities"] == [["gpu"]]
    assert "--gpus all" in gpu.docker_run_equivalent()


def test_an_engines_container_is_unchanged_by_the_services_fields():
    """The fields a service's containers add change nothing of an engine's (its hash included)."""
    plain = specs.ContainerSpec("n", "head", "c", "img", ["ray"], {}, {}, "1g", {"/a": "/a"})
    hc = plain.host_config_kwargs()
    assert hc["ipc_mode"] == "host" and hc["devices"] == specs.DEVICES and hc["device_requests"]
    assert hc["restart_policy"] == specs.RESTART_POLICY and hc["binds"] == {"/a": {"bind": "/a", "mode": "rw"}}
    assert plain._service_doc() == {}


def test_the_supervisor_holds_the_docker_socket_and_no_secret():
    inv = make_inventory().only([HEAD]).at_slot(1)
    server = server_spec(inv, tts(), inv.head, {"TTS_API_KEY": KEY})
    sup = service_spec(inv, tts(), inv.head, "sparkcluster/vllm-ray:test", server.config_hash())
    assert sup.binds == {"/var/run/docker.sock": "/run/docker.sock"} and sup.image == "sparkcluster/vllm-ray:test"
    assert "device_requests" not in sup.host_config_kwargs() and sup.host_config_kwargs()["restart_policy"] == {
        "Name": "unless-stopped"
    }
    cfg = service_config(inv, tts(), inv.head)
    assert cfg["service"]["container"] == server.name and cfg["service"]["socket"] == "/run/docker.sock"
    assert "image" not in cfg["service"]["policy"]
    for text in (*sup.files.values(), sup.docker_run_equivalent()):
        assert KEY not in text


class Api(FakeApi):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.archives: list[tuple[str, bytes]] = []

    def put_archive(self, cid, path, data):
        self.archives.append((cid, data))


def test_the_secret_is_written_into_the_container_before_it_starts_and_the_service_is_left_to_its_supervisor():
    inv = make_inventory().only([HEAD]).at_slot(1)
    server = server_spec(inv, tts(), inv.head, {"TTS_API_KEY": KEY})
    api = Api([None])
    cid = specs.create_and_start(api, server, start=False)
    assert api.started == [] and api.archives[-1][0] == cid
    with tarfile.open(fileobj=io.BytesIO(api.archives[-1][1])) as tar:
        member = tar.getmember("run/sparkcluster-secrets/TTS_API_KEY")
        assert member.mode == 0o444 and tar.extractfile(member).read().decode() == KEY
    assert KEY not in json.dumps(api.made)


# -- up: the ports, the supervisor's image, the dry run


# `ss -Htlnp` as the listeners probe prints it, each line with its container (the format of
# tests/unit/test_parsers.py's captured lines): a process of the owner's on the service's second port
SS = 'LISTEN 0      4096         0.0.0.0:8005       0.0.0.0:*    users:(("ollama",pid=3120,fd=3)) container=\n'


def test_a_port_the_service_declares_held_on_the_node_is_refused_naming_the_holder():
    e = service_up.ports_refused(tts(), parsers.ss_listeners(SS), HEAD)
    assert e is not None and ":8005 held by ollama (pid 3120)" in e.message
    assert f"sparkcluster up --profile tts --node {HEAD} --beside" in e.fix
    assert service_up.ports_refused(tts(), [], HEAD) is None


def test_the_supervisors_image_is_the_clusters_own_or_the_profiles_and_its_absence_is_one_line():
    class Listing:
        def __init__(self, listed):
            self.listed = listed

        def containers(self, all=False, filters=None):
            return self.listed

    head = {"Image": "sparkcluster/vllm-ray:abc", "Labels": {CLUSTER_LABEL: CLUSTER, ROLE_LABEL: "head"}}
    svc = {"Image": "ghcr.io/x/y:1", "Labels": {CLUSTER_LABEL: CLUSTER, ROLE_LABEL: "service-server"}}
    bare = tts(TTS.replace('image = "sparkcluster/vllm-ray:test"\n', ""))
    assert service_up.supervisor_image(bare, Listing([svc, head]), CLUSTER, HEAD) == "sparkcluster/vllm-ray:abc"
    assert service_up.supervisor_image(tts(), Listing([]), CLUSTER, HEAD) == "sparkcluster/vllm-ray:test"
    with pytest.raises(InputError, match="no model's container") as e:
        service_up.supervisor_image(bare, Listing([svc]), CLUSTER, HEAD)
    assert "[supervisor] image" in e.value.fix


def test_the_dry_run_names_the_socket_the_ports_and_the_secrets_file_never_its_value(monkeypatch):
    redact.register(KEY)
    host = FakeHost(FakeApi([None]))
    monkeypatch.setattr(service_up, "connect_reachable", lambda full: (FakeCluster({HEAD: host}), {}))
    monkeypatch.setattr(deployments, "on", lambda cluster, full: ([], {}))
    inv = make_inventory()
    secrets = {"TTS_API_KEY": KEY}
    plan = service_up.run(inv, tts(), Quiet(), monitoring=None, node=(HEAD,), dry_run=True, secrets=secrets)
    text, doc = plan.render(), plan.as_json()
    for shown in (text, doc, plan.docker_run):
        assert KEY not in shown
    assert "/var/run/docker.sock" in doc and "API_KEY_FILE=/run/sparkcluster-secrets/TTS_API_KEY" in doc
    assert "port(s) 8004, 8005: free on the node" in text and "root on the node" in text
    assert "secret(s) TTS_API_KEY written as files" in text
    ids = [s["id"].rsplit("/", 1)[1] for s in json.loads(doc)]
    assert ids == ["admit", "look", "pull", "pull-supervisor", "create-server", "create-supervisor", "wait"]

    class Held(FakeHost):
        def run(self, cmd, timeout=30.0, stdin=None, *, warn=False):
            class Done:
                ok, stderr, exit_code, stdout = True, "", 0, SS

            return Done()

    monkeypatch.setattr(service_up, "connect_reachable", lambda full: (FakeCluster({HEAD: Held(FakeApi([None]))}), {}))
    with pytest.raises(InputError, match="held by ollama"):
        service_up.run(inv, tts(), Quiet(), monitoring=None, node=(HEAD,), dry_run=True, secrets=secrets)
    # a service already here holds its own ports: not refused for them (its `look` decides)
    again = deployments.Deployment("tts", (HEAD,), slot=0, service=True, port=8004)
    monkeypatch.setattr(deployments, "on", lambda cluster, full: ([again], {}))
    plan = service_up.run(inv, tts(), Quiet(), monitoring=None, node=(HEAD,), dry_run=True, secrets=secrets)
    assert "its own (already here)" in plan.render()


def test_up_of_a_service_with_secrets_refuses_in_one_line_when_one_is_missing(tmp_path, monkeypatch, capsys):
    from sparkcluster.cli.main import main

    (tmp_path / "tts.toml").write_text(TTS)
    monkeypatch.setenv(profiles.PROFILES_ENV_VAR, str(tmp_path))
    env = tmp_path / ".env"
    env.write_text("VLLM_API_KEY=sk-engines-key-0123456789abcdef\n")
    env.chmod(0o600)
    monkeypatch.setenv("SPARKCLUSTER_ENV_FILE", str(env))
    monkeypatch.delenv("TTS_API_KEY", raising=False)
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    pair = re.search(r"```toml\n(.*?)```", readme.split("### A complete inventory: the pair", 1)[1], re.S).group(1)
    inv = tmp_path / "cluster.toml"
    inv.write_text(pair)
    assert main(["--inventory", str(inv), "up", "--profile", "tts", "--node", "spark-a"]) == 2
    err = capsys.readouterr().err
    assert "missing secret(s): TTS_API_KEY" in err and "Traceback" not in err


# -- the supervisor: a container through Docker's socket


class Engine(BaseHTTPRequestHandler):
    """The Engine API's three routes the supervisor calls, as Docker documents them
    (https://docs.docker.com/reference/api/engine/version/v1.43/: ContainerInspect 200/404,
    ContainerStart 204/304, ContainerStop 204/304), over a Unix socket."""

    state = {"Running": False, "Pid": 0, "ExitCode": 0}
    calls: list[str] = []

    def log_message(self, *a):
        pass

    def _send(self, status: int, doc: dict | None = None) -> None:
        body = json.dumps(doc).encode() if doc is not None else b""
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self.calls.append(f"GET {self.path}")
        if self.path == "/containers/svc-server/json":
            self._send(200, {"Id": "abc", "State": dict(self.state)})
        else:
            self._send(404, {"message": f"No such container: {self.path.split('/')[2]}"})

    def do_POST(self):
        self.calls.append(f"POST {self.path}")
        if self.path.startswith("/containers/svc-server/start"):
            was = self.state["Running"]
            self.state.update(Running=True, Pid=4321)
            self._send(304 if was else 204)
        elif self.path.startswith("/containers/svc-server/stop"):
            was = self.state["Running"]
            self.state.update(Running=False, Pid=0, ExitCode=143)
            self._send(204 if was else 304)
        else:
            self._send(404, {"message": "No such container"})


class UnixServer(HTTPServer):
    address_family = socket.AF_UNIX

    def server_bind(self):
        self.socket.bind(self.server_address)
        self.server_name, self.server_port = "docker", 0

    def get_request(self):
        conn, _ = self.socket.accept()
        return conn, ("local", 0)


@pytest.fixture
def engine(tmp_path):
    Engine.state = {"Running": False, "Pid": 0, "ExitCode": 0}
    Engine.calls = []
    path = str(tmp_path / "docker.sock")
    srv = UnixServer(path, Engine)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield docker_socket.Docker(path)
    srv.shutdown()
    srv.server_close()


def test_the_supervisors_docker_calls_are_the_engine_apis_three(engine):
    assert engine.inspect("other") is None
    assert docker_socket.state_of(engine.inspect("svc-server")) == (False, None, 0)
    engine.start("svc-server")
    engine.start("svc-server")  # already started: 304, fine
    assert docker_socket.state_of(engine.inspect("svc-server")) == (True, 4321, None)
    engine.stop("svc-server", 5)
    engine.stop("svc-server", 5)  # already stopped: 304, fine
    assert docker_socket.state_of(engine.inspect("svc-server")) == (False, None, 143)
    with pytest.raises(docker_socket.DockerError, match="404 No such container"):
        engine.start("other")
    assert "POST /containers/svc-server/stop?t=5" in Engine.calls


def test_the_supervisor_starts_watches_and_restarts_the_container_through_the_socket(tmp_path, monkeypatch, engine):
    ok, down = (True, ""), (False, "http://127.0.0.1:1/health: ConnectionRefusedError")
    answers = [ok]
    sup, clock = _supervisor(tmp_path, monkeypatch, answers, docker=engine)
    sup.tick()
    assert sup.state == contract.STARTING and sup.proc.pid == 4321 and Engine.state["Running"]
    sup.tick()
    assert sup.state == contract.SERVING
    answers[:] = [down]
    sup.tick()
    sup.tick()  # two failed answers: the container is stopped through Docker
    assert sup.state == contract.RESTARTING and not Engine.state["Running"]
    assert any(c.startswith("POST /containers/svc-server/stop") for c in Engine.calls)
    clock.now += 60
    answers[:] = [ok]
    sup.tick()
    sup.tick()
    assert sup.state == contract.SERVING and Engine.state["Running"] and len(sup.restarts) == 1


def test_a_supervisor_that_comes_back_takes_over_the_running_service_without_a_memory_wait(tmp_path, monkeypatch):
    docker = FakeDocker()
    docker.running, docker.pid = True, 77  # the service kept running while its supervisor's container restarted
    sup, _ = _supervisor(tmp_path, monkeypatch, [(True, "")], mem_available_gib=1.0, docker=docker)
    sup.first_start = False  # as after a resume: a restart would wait for memory the service itself holds
    sup.tick()
    assert sup.state == contract.STARTING and sup.proc.pid == 77 and docker.calls == [("start", "svc-server")]
    sup.tick()
    assert sup.state == contract.SERVING
    # the container stopped under it (an exit): a verdict, and Docker asked to stop what is stopped
    docker.exit(1)
    sup.tick()
    assert sup.causes[-1]["kind"] == "dead" and "exited with status 1" in sup.causes[-1]["cause"]


# -- the gateway sends a service its own key


def test_the_gateway_sends_a_service_its_bearer_key_and_never_the_engines():
    inv = make_inventory()
    d = deployments.Deployment("tts", (HEAD,), slot=1, service=True, port=8004)
    a = deployments.Deployment("asr", (HEAD,), slot=2, service=True, port=8765)
    loaded = {"tts": tts(), "asr": profiles.parse(ASR, "asr")}
    ups = rollout.upstreams(inv, [d, a], loaded)
    assert [u.bearer for u in ups] == ["TTS_API_KEY", None]
    secrets = {"VLLM_API_KEY": "sk-engines-key-0123456789abcdef", "TTS_API_KEY": KEY}
    plan = rollout.make(inv, HEAD, [d, a], loaded, secrets, ["k" * 24], "img", None)
    by_key = {e["key"]: e for e in plan.config()["deployments"]}
    assert by_key[d.key]["api_key"] == KEY and by_key[a.key]["api_key"] is None
    redact.register(KEY)
    assert KEY not in plan.render() and KEY not in plan.as_json()
