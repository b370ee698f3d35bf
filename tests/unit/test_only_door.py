"""The gateway as the only door (issue 36 item 2): with the inventory's `engines_listen = "control"`
every engine listens only on its head's control address (vLLM's --host, no root needed); the
supervisor asks it there, bench's levels target it there from inside the head, and the controller's
own questions (up's readiness, status, bench's checks) reach it through the head's SSH connection, a
local port forwarded as `ssh -L` does. It is the default (issue 70); "all" is the owner's opt-out."""

from __future__ import annotations

import http.server
import json
import socket
import threading

import httpx
import pytest
from conftest import inventory_dict, make_inventory

from sparkcluster.bench.sweep import target_for
from sparkcluster.config import profile as profiles
from sparkcluster.config.flags import engine_host, reached_at
from sparkcluster.deployment import endpoint, server
from sparkcluster.facts import HostFacts, parsers
from sparkcluster.remote.forward import Forward
from sparkcluster.up.plan import make_plan

HEAD, WORKER = "spark-head", "spark-worker"


def _inv(listen: str | None = None):
    data = inventory_dict()
    if listen is not None:
        data["cluster"]["engines_listen"] = listen
    return make_inventory(data)


@pytest.fixture(scope="module")
def prof():
    return profiles.load_profile("testbed")


def _facts():
    return {n: HostFacts(n, hostname=n, image_id=None, ours=parsers.docker_inspect_json("[]")) for n in (HEAD, WORKER)}


def _host_flag(argv: list[str]) -> str:
    return argv[argv.index("--host") + 1]


def test_engines_listen_only_on_the_heads_control_address(prof):
    inv = _inv("control")
    plan = make_plan(inv, prof, _facts(), serving=False, replace=False)
    ip = str(inv.head.control_ip)
    assert _host_flag(plan.serve.argv) == ip and plan.serve.host == ip
    assert engine_host(inv, prof) == ip
    assert target_for(prof, inv.cluster.api_port, bind=engine_host(inv, prof)).base_url == f"http://{ip}:8000"
    assert f"--host {ip}" in plan.render()


def test_the_owners_opt_out_binds_as_the_profile_says(prof):
    inv = _inv("all")
    plan = make_plan(inv, prof, _facts(), serving=False, replace=False)
    assert _host_flag(plan.serve.argv) == prof.serve.host == "0.0.0.0" and plan.serve.host == "127.0.0.1"
    assert target_for(prof, 8000).base_url == target_for(prof, 8000, bind=engine_host(inv, prof)).base_url


def test_an_unknown_choice_is_refused():
    from pydantic import ValidationError

    from sparkcluster.config import inventory

    with pytest.raises(ValidationError, match="engines_listen"):
        inventory.Inventory.model_validate({**inventory_dict(), "cluster": {"name": "p", "engines_listen": "lan"}})


def test_reached_at():
    assert reached_at("0.0.0.0") == reached_at("") == "127.0.0.1"
    assert reached_at("198.18.1.2") == "198.18.1.2" and reached_at("fd00::2") == "[fd00::2]"


def test_the_supervisor_is_told_where_to_ask_the_engine():
    from test_up_plan import FakeAPI, spec

    api = FakeAPI()
    s = server.ServeSpec(**{**spec(["vllm", "serve", "m"]).__dict__, "host": "198.18.1.2"})
    rec = server.start(api, s, {}, "testbed", {})
    desired = json.loads(api.archives["/etc/sparkcluster/serve-desired.json"])
    assert desired["host"] == "198.18.1.2" and rec.container == s.container


def test_the_supervisor_asks_the_engine_at_the_desired_host(monkeypatch, tmp_path):
    from sparkcluster.node import supervisor
    from sparkcluster.node.journal import Journal
    from sparkcluster.node.verdict import Watch

    asked = []
    monkeypatch.setattr(supervisor, "http_status", lambda url, timeout: asked.append(url) or 503)
    sup = supervisor.Supervisor({"node": HEAD, "nodes": [], "peers": []}, Journal(str(tmp_path / "j")))
    monkeypatch.setattr(sup, "low_memory", lambda policy: {})

    class Alive:
        pid = 1

        def poll(self):
            return None

    sup.proc, sup.watch = Alive(), Watch(started=0.0)
    sup.look(supervisor.Desired(port=8000, host="198.18.1.2", model="m"), supervisor.Policy())
    sup.look(supervisor.Desired.of({"port": 8000, "model": "m"}), supervisor.Policy())  # a desired state from before
    assert asked == ["http://198.18.1.2:8000/health", "http://127.0.0.1:8000/health"]
    sup.proc = None


def test_the_record_says_where_the_engine_was_asked():
    """`up` compares it with where the engine would be asked now: switching engines_listen is not
    "already serving" (bringup._run_locked); a record from before has none: loopback."""
    from test_up_plan import FakeAPI, spec

    api = FakeAPI()
    api.archives[server.RECORD_PATH] = json.dumps(
        {"pid": 1, "exec_id": "", "profile": "p", "model": "m", "port": 8000, "started_at": 0.0, "host": "198.18.1.2"}
    ).encode()
    assert server.read_record(api, spec([]).container).host == "198.18.1.2"
    assert server.Record(1, "", "p", "m", 8000, 0.0).host == ""


# ---- the controller's way in: a local port forwarded through the head's SSH connection ----------


class _Engine(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        body = json.dumps({"path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


@pytest.fixture
def engine():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd.server_address[1]
    httpd.shutdown()


class FakeHead:
    """A connected head whose `tunnel` is what the SSH channel amounts to: a connection to ip:port
    made from the head (here a plain socket to the stand-in engine on loopback)."""

    address = "198.51.100.7"  # the head's SSH address: never asked when the tunnel is used

    def __init__(self, engine_port: int):
        self.engine_port = engine_port
        self.tunnels: list[tuple[str, int]] = []

    def tunnel(self, ip: str, port: int, timeout: float = 10.0):
        self.tunnels.append((ip, port))
        return socket.create_connection(("127.0.0.1", self.engine_port), timeout=timeout)


def test_a_forward_carries_requests_both_ways(engine):
    with Forward(lambda: socket.create_connection(("127.0.0.1", engine))) as fwd:
        with httpx.Client() as c:
            for i in range(3):  # keep-alive and new connections alike
                assert c.get(f"{fwd.url()}/v1/models?n={i}").json() == {"path": f"/v1/models?n={i}"}
        assert httpx.get(f"{fwd.url()}/health").status_code == 200


def test_a_refused_tunnel_closes_the_local_connection():
    def refuse():
        raise OSError("administratively prohibited")

    with Forward(refuse) as fwd, pytest.raises(httpx.HTTPError):
        httpx.get(f"{fwd.url()}/health", timeout=5)


def test_the_controller_reaches_the_engine_through_the_heads_ssh_when_it_listens_only_there(engine):
    inv = _inv("control")
    head = FakeHead(engine)
    with endpoint.reached(head, inv, 8000) as base:
        assert base.startswith("http://127.0.0.1:")
        assert httpx.get(f"{base}/health").json() == {"path": "/health"}
    assert set(head.tunnels) == {(str(inv.head.control_ip), 8000)}  # a first channel checks forwarding


def test_an_sshd_refusing_to_forward_is_said_with_its_fix_not_read_as_an_engine_not_answering(engine):
    from sparkcluster.errors import InputError

    class Prohibited(FakeHead):
        def tunnel(self, ip, port, timeout=10.0):
            raise InputError(
                f"spark-head: its sshd refuses to forward a connection to {ip}:{port}", "AllowTcpForwarding"
            )

    with (
        pytest.raises(InputError, match="refuses to forward"),
        endpoint.reached(Prohibited(engine), _inv("control"), 8000),
    ):
        pass


def test_the_tunnel_names_a_prohibited_forward(monkeypatch):
    """paramiko's ChannelException with code 1 (OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED, what OpenSSH
    answers under AllowTcpForwarding no) becomes the one-line error; code 2 (connect failed: nothing
    listens) stays paramiko's, for the caller to find the engine not answering."""
    import paramiko

    from sparkcluster.errors import InputError
    from sparkcluster.remote import ssh

    class Transport:
        def __init__(self, code):
            self.code = code

        def is_active(self):
            return True

        def open_channel(self, *a, **k):
            raise paramiko.ChannelException(
                self.code, "administratively prohibited" if self.code == 1 else "Connect failed"
            )

    def host_with(code):
        h = object.__new__(ssh.Host)
        h.name = "spark-head"
        h._conn = type("C", (), {"client": type("Cl", (), {"get_transport": lambda self: Transport(code)})()})()
        return h

    with pytest.raises(InputError, match="sshd refuses to forward") as got:
        host_with(1).tunnel("198.19.2.1", 8000)
    assert "AllowTcpForwarding yes" in got.value.fix
    with pytest.raises(paramiko.ChannelException):
        host_with(2).tunnel("198.19.2.1", 8000)


def test_with_the_owners_opt_out_the_controller_asks_the_heads_address(engine):
    head = FakeHead(engine)
    with endpoint.reached(head, _inv("all"), 8000) as base:
        assert base == "http://198.51.100.7:8000"
    assert head.tunnels == []


def test_status_asks_through_the_same_way(engine, monkeypatch):
    from sparkcluster.status import status

    seen = []
    monkeypatch.setattr(status.endpoint_mod, "look", lambda base, key: seen.append(base) or endpoint.EngineView(200))
    head = FakeHead(engine)
    assert status._look(head, _inv("control"), 8000, None).health == 200
    assert seen[0].startswith("http://127.0.0.1:")  # a forward (the tunnel opens per connection)
    assert status._look(None, _inv("control"), 8000, None).health is None  # an unreachable head
