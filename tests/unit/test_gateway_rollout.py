"""`gateway up`'s plan (issue 36): routes from the deployments and their profiles, replicas named,
keys only in the config written into the container (never in the plan, argv or labels), the
container kept when only routes change; the LiteLLM export; the shipped files run on their own."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import httpx
import pytest
from conftest import make_inventory
from gateway_fakes import until

from sparkcluster import redact
from sparkcluster.config import profile as profiles
from sparkcluster.config.secrets import split_keys
from sparkcluster.deployment.deployments import Deployment
from sparkcluster.errors import InputError
from sparkcluster.gateway import litellm, rollout
from sparkcluster.labels import CONFIG_LABEL

INV = make_inventory()
A, B = INV.nodes[0].name, INV.nodes[1].name
SINGLE = profiles.load_profile("testbed-single")
FOUND = [Deployment("testbed-single", (A,)), Deployment("testbed-single", (B,))]
KEYS = split_keys("gateway-key-one-0001, gateway-key-two-0002")
UPSTREAM_KEY = "vllm-key-abcdef-0003"
redact.register(UPSTREAM_KEY)


def make(running=None, **kw):
    return rollout.make(
        INV, A, FOUND, {"testbed-single": SINGLE}, {"VLLM_API_KEY": UPSTREAM_KEY}, KEYS, "img:1", running, **kw
    )


def test_routes_from_the_deployments_with_replicas_named():
    p = make()
    assert [(u.key, u.names) for u in p.routes] == [
        (f"testbed-single@{A}", ("testbed-tiny-single",)),
        (f"testbed-single@{B}", ("testbed-tiny-single",)),
    ]
    assert p.routes[1].url == f"http://{INV.node(B).control_ip}:{INV.cluster.api_port}"
    assert p.routes[1].supervisor == f"http://{INV.node(B).control_ip}:{INV.cluster.agent_port}/"
    assert "served by 2 deployments" in p.render() and "replicas" in p.render()
    assert [s.id for s in p.steps()] == [f"gateway/{A}/port", f"gateway/{A}/create", f"gateway/{A}/ready"]


def test_keys_reach_only_the_config_file():
    p = make()
    shown = p.render() + p.as_json() + p.docker_run_equivalent() + json.dumps(p.create_kwargs()) + repr(p)
    for secret in (*KEYS, UPSTREAM_KEY):
        assert secret not in shown
    cfg = p.config()
    assert cfg["keys"] == KEYS and {d["api_key"] for d in cfg["deployments"]} == {UPSTREAM_KEY}
    assert p.create_kwargs()["command"] == ["python3", rollout.CODE_DIR, rollout.CONFIG_PATH]


def test_no_key_or_no_image_is_refused_in_one_line():
    with pytest.raises(InputError, match="at least one client key"):
        rollout.make(INV, A, FOUND, {"testbed-single": SINGLE}, {}, [], "img:1", None)
    with pytest.raises(InputError, match="no sparkcluster image"):
        rollout.make(INV, A, FOUND, {"testbed-single": SINGLE}, {}, KEYS, None, None)


def test_a_running_gateway_with_the_same_code_is_kept_and_its_config_rewritten():
    fresh = make()
    same = {"Id": "c1", "State": "running", "Labels": {CONFIG_LABEL: fresh.config_hash()}}
    assert [s.action for s in make(running=same).steps()] == ["config", "ready"]
    other = {"Id": "c1", "State": "running", "Labels": {CONFIG_LABEL: "0000"}}
    assert [s.action for s in make(running=other).steps()] == ["replace", "port", "create", "ready"]
    assert make(port=4001).config_hash() != fresh.config_hash()


def test_aliases_are_served_names_and_routes():
    prof = SINGLE.model_copy(update={"aliases": ["tiny", "small"]})
    from sparkcluster.config.flags import serve_argv

    argv = serve_argv(prof)
    i = argv.index("--served-model-name")
    assert argv[i + 1 : i + 4] == ["testbed-tiny-single", "tiny", "small"]
    ups = rollout.upstreams(INV, FOUND[:1], {"testbed-single": prof})
    assert ups[0].names == ("testbed-tiny-single", "tiny", "small")


def test_litellm_export_in_sparkruns_shape_without_secrets():
    text = litellm.render(make().routes, "pair", upstream_key=True)
    assert text.count('- model_name: "testbed-tiny-single"') == 2  # replicas: LiteLLM balances them
    assert f'api_base: "http://{INV.node(B).control_ip}:{INV.cluster.api_port}/v1"' in text
    assert 'model: "openai/testbed-tiny-single"' in text and "drop_params: true" in text
    assert '"os.environ/VLLM_API_KEY"' in text and '"os.environ/LITELLM_MASTER_KEY"' in text
    assert UPSTREAM_KEY not in text and KEYS[0] not in text
    try:
        import yaml
    except ImportError:
        return
    doc = yaml.safe_load(text)
    assert doc["model_list"][0]["litellm_params"]["model"] == "openai/testbed-tiny-single"
    assert doc["general_settings"]["require_auth_for_metrics_endpoint"] is False


def _run_shipped(tmp_path, extra: dict, scheme: str = "http"):
    """The shipped files run by a Python that cannot see this checkout (-I: no cwd, no PYTHONPATH),
    as the container runs them; yields the base URL while it serves, then its output."""
    for path, text in rollout.code_files().items():
        f = tmp_path / path.lstrip("/")
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = tmp_path / "gateway.json"
    cfg.write_text(json.dumps({"host": "127.0.0.1", "port": port, "keys": KEYS, "deployments": [], **extra}))
    proc = subprocess.Popen(
        [sys.executable, "-I", str(tmp_path / rollout.CODE_DIR.lstrip("/")), str(cfg)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    base = f"{scheme}://127.0.0.1:{port}"

    def answers():
        try:
            return httpx.get(f"{base}/health", timeout=1, verify=False).status_code == 200
        except httpx.HTTPError:
            assert proc.poll() is None, proc.stdout.read().decode()
            return False

    try:
        until(answers, timeout=30, what="the shipped gateway to answer")
        yield base
    finally:
        proc.terminate()
        # uvicorn shuts down gracefully, then re-raises the SIGTERM it caught (so Docker sees 143)
        assert proc.wait(30) in (0, -15)
    yield proc.stdout.read()


def test_the_shipped_files_run_the_gateway_on_their_own(tmp_path):
    shipped = {p.removeprefix(f"{rollout.CODE_DIR}/") for p in rollout.code_files()}
    assert "sparkcluster/gateway/rollout.py" not in shipped and "sparkcluster/node/contract.py" in shipped
    run = _run_shipped(tmp_path, {})
    base = next(run)
    r = httpx.get(f"{base}/v1/models", headers={"x-api-key": KEYS[1]})
    assert r.status_code == 200 and r.json()["data"] == []
    said = next(run)
    assert b"gateway started" in said and b"gateway stopped" in said


def test_tls_with_the_owners_certificate(tmp_path):
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "spark-head")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    (tmp_path / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "key.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    tls = {"cert": str(tmp_path / "cert.pem"), "key": str(tmp_path / "key.pem")}
    run = _run_shipped(tmp_path, {"tls": tls}, scheme="https")
    base = next(run)
    assert httpx.get(f"{base}/gateway/status", headers={"x-api-key": KEYS[0]}, verify=False).status_code == 200
    next(run)
    p = make(tls={"cert": "/home/spark/tls/cert.pem", "key": "/home/spark/tls/key.pem"})
    assert p.config()["tls"] == {"cert": "/etc/sparkcluster/tls/cert.pem", "key": "/etc/sparkcluster/tls/key.pem"}
    assert p.binds() == {"/home/spark/tls": "/etc/sparkcluster/tls"} and ":ro" in p.docker_run_equivalent()
    with pytest.raises(InputError, match="different folders"):
        make(tls={"cert": "/a/cert.pem", "key": "/b/key.pem"})


def test_the_journal_is_the_gateways_json_lines_in_its_log():
    from sparkcluster.gateway import deploy

    class API:
        def logs(self, cid, stdout=True, stderr=False):
            return b'{"ts": 1.0, "event": "gateway started"}\nINFO: uvicorn noise\n{"ts": 2.0, "event": "out of rotation"}\n'

    assert [e["event"] for e in deploy.journal(API(), "c")] == ["gateway started", "out of rotation"]


def test_a_port_held_by_another_program_stops_before_anything_is_created():
    from types import SimpleNamespace

    from sparkcluster.errors import SparkError
    from sparkcluster.gateway import deploy

    held = "LISTEN 0 4096 0.0.0.0:4000 0.0.0.0:*"
    host = SimpleNamespace(run=lambda cmd, timeout, warn: SimpleNamespace(stdout=held + "\n"), address="h")

    class API:
        def create_host_config(self, **kw):
            raise AssertionError("nothing may be created")

    with pytest.raises(SparkError, match="port 4000 on spark-head is held by another program"):
        deploy.apply(API(), make(), host)


def test_monitoring_finds_the_gateway_to_scrape():
    """`monitor up` and the retarget after planned work scrape the gateway's /metrics where it runs."""
    from types import SimpleNamespace

    from sparkcluster.deployment import gateway_registry
    from sparkcluster.labels import CLUSTER_LABEL, GATEWAY_ROLE, PORT_LABEL, ROLE_LABEL
    from sparkcluster.monitor import scrape

    gw = {"State": "running", "Labels": {CLUSTER_LABEL: "pair", ROLE_LABEL: GATEWAY_ROLE, PORT_LABEL: "4000"}}
    head = {"State": "running", "Labels": {CLUSTER_LABEL: "pair", ROLE_LABEL: "head"}}

    def host(listed):
        api = SimpleNamespace(containers=lambda all, filters: listed)
        return SimpleNamespace(docker=lambda: SimpleNamespace(api=api))

    ports = gateway_registry.ports({A: host([head, gw]), B: host([head])}, "pair")
    assert ports == {A: 4000}
    jobs = [(t.job, t.address) for t in scrape.targets(INV, [], ports)]
    assert (scrape.GATEWAY_JOB, f"{INV.node(A).control_ip}:4000") in jobs


def test_the_gateways_folder_is_made_and_bound_read_write_and_the_shipped_gateway_uses_it(tmp_path):
    """`gateway up` makes the gateway's folder on its node (its key file and usage ledger) and binds it
    read-write; a change of folder needs a new container; the shipped files read named keys there and
    open the ledger there, on their own."""
    from sparkcluster.gateway import keys

    folder = "/home/owner/.local/share/sparkcluster/gateway/testbed"
    p = make(data_dir=folder)
    assert [s.action for s in p.steps()] == ["data", "port", "create", "ready"]
    assert p.config()["data"] == rollout.DATA_MOUNT and "data" not in make().config()
    assert p.host_config_kwargs()["binds"] == {folder: {"bind": rollout.DATA_MOUNT, "mode": "rw"}}
    assert f"-v {folder}:{rollout.DATA_MOUNT}:rw" in p.docker_run_equivalent()
    assert p.config_hash() != make().config_hash()
    data = tmp_path / "data"
    data.mkdir()
    (data / keys.KEYS_FILE).write_text(keys.render([keys.Entry("owner", keys.digest("sk-spark-named-key-1"))]))
    run = _run_shipped(tmp_path / "code", {"data": str(data)})
    base = next(run)
    assert httpx.get(f"{base}/v1/models", headers={"x-api-key": "sk-spark-named-key-1"}).status_code == 200
    assert httpx.get(f"{base}/metrics", headers={"x-api-key": "sk-spark-named-key-1"}).status_code == 403
    next(run)
    assert (data / "usage" / "usage.db").is_file()


def test_the_console_reads_the_alerts_where_monitor_up_runs_prometheus_and_every_deployments_token():
    p = make(wake_tokens={d.key: f"token-of-{d.key}" for d in FOUND})
    cfg = p.config()
    head = INV.head
    assert cfg["alerts"] == f"http://{head.control_ip}:{INV.monitor.prometheus_port}/api/v1/alerts"
    # every deployment's token for the console's actions; a wake's only where it is on demand
    assert all(d["agent_token"] == f"token-of-{d['key']}" and "wake_token" not in d for d in cfg["deployments"])
