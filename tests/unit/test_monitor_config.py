"""`sparkcluster monitor`'s configuration (sparkcluster/monitor): the scrape targets made from the
inventory and the running deployments, prometheus.yml and alertmanager.yml accepted by Debian's
`promtool check config` and `amtool check-config` where installed, the containers' specs (listening
on control IPs, bounded retention, the webhook file 0600 for nobody, node_exporter as the owner),
the webhook never printed, and the planned-work silence."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from sparkcluster.cli.main import cli
from sparkcluster.config import inventory
from sparkcluster.deployment import deployments
from sparkcluster.labels import CLUSTER_LABEL
from sparkcluster.monitor import alerting, scrape, stack

INV_PATH = Path(__file__).parent / "data" / "profile-cluster.toml"
HOOK = "https://hooks.example.invalid/T000/secret-hook-value"


def inv(extra: str = "") -> inventory.Inventory:
    return inventory.parse(INV_PATH.read_text() + extra, path=INV_PATH)


def served() -> list[scrape.Served]:
    return [scrape.Served("big", ("spark-a", "spark-b"), 8000), scrape.Served("small", ("spark-b",), 8001)]


def test_targets_every_node_agent_and_exporter_and_each_deployment_on_its_head():
    got = {(t.job, t.address): t.labels for t in scrape.targets(inv(), served(), {"spark-a": 4000})}
    assert got[("sparkcluster-node", "192.168.100.11:8297")] == {"cluster": "pair", "node": "spark-b", "role": "worker"}
    assert ("node-exporter", "192.168.100.10:9100") in got and ("node-exporter", "192.168.100.11:9100") in got
    assert got[("vllm", "192.168.100.10:8000")]["deployment"] == "big@spark-a+spark-b"
    # a one-node deployment on the worker is served there, and labelled with that node
    assert got[("vllm", "192.168.100.11:8001")] == {
        "cluster": "pair",
        "node": "spark-b",
        "deployment": "small@spark-b",
        "profile": "small",
    }
    assert got[("gateway", "192.168.100.10:4000")]["node"] == "spark-a"


def test_no_node_exporter_when_the_owner_turns_it_off_and_listen_follows_the_setting():
    i = inv('\n[monitor]\nnode_exporter = false\nlisten = "0.0.0.0"\n')
    assert not [t for t in scrape.targets(i, []) if t.job == "node-exporter"]
    assert scrape.listen_ip(i, "spark-a") == "0.0.0.0" and scrape.reach_ip(i, "spark-a") == "192.168.100.10"


def test_prometheus_config_evaluates_at_every_scrape_and_promtool_accepts_it(tmp_path):
    doc = scrape.prometheus_config(inv(), scrape.targets(inv(), served()))
    assert doc["global"]["evaluation_interval"] == doc["global"]["scrape_interval"] == "10s"
    assert doc["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["192.168.100.10:9093"]
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not installed (Debian package prometheus)")
    (tmp_path / "prometheus.yml").write_text(scrape.render(doc))
    p = subprocess.run(
        ["promtool", "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True, text=True, check=False
    )
    assert p.returncode == 0, p.stdout + p.stderr


@pytest.mark.parametrize("hook", [HOOK, None])
def test_alertmanager_config_pages_without_waiting_and_amtool_accepts_it(tmp_path, hook):
    doc = alerting.alertmanager_config(inv(), hook)
    page = next(r for r in doc["route"]["routes"] if 'severity="page"' in r["matchers"])
    assert page["group_wait"] == "0s" and doc["route"]["group_wait"] == "10s"  # at most one scrape interval
    assert ("webhook_configs" in doc["receivers"][0]) == bool(hook)
    if shutil.which("amtool") is None:
        pytest.skip("amtool is not installed (Debian package prometheus-alertmanager)")
    (tmp_path / "am.yml").write_text(alerting.render(doc))
    p = subprocess.run(
        ["amtool", "check-config", str(tmp_path / "am.yml")], capture_output=True, text=True, check=False
    )
    assert p.returncode == 0, p.stdout + p.stderr


def _tar_members(blob: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(blob)) as t:
        return {m.name: m for m in t.getmembers()}


def test_specs_listen_on_control_ips_bound_retention_and_keep_the_webhook_for_nobody():
    i = inv()
    am_yml = alerting.render(alerting.alertmanager_config(i, HOOK))
    specs = {(s.component, s.node): s for s in stack.specs(i, "{}", am_yml, {"spark-b": "1001:1001"})}
    prom = specs[("prometheus", "spark-a")]
    assert "--web.listen-address=192.168.100.10:9090" in prom.args
    assert "--storage.tsdb.retention.time=15d" in prom.args and "--storage.tsdb.retention.size=4GB" in prom.args
    assert prom.volumes == {"sparkcluster-pair-prometheus-data": "/prometheus"}
    assert f"{scrape.RULES_DIR}/sparkcluster.yml" in prom.files
    am = specs[("alertmanager", "spark-a")]
    assert "--cluster.listen-address=" in am.args and "--web.listen-address=192.168.100.10:9093" in am.args
    members = _tar_members(stack.files_tar(am.files, am.user))
    secret = members[stack.AM_CONFIG.lstrip("/")]
    assert (secret.mode, secret.uid, secret.gid) == (0o600, 65534, 65534)
    ne = specs[("node-exporter", "spark-b")]
    assert ne.user == "1001:1001" and ne.read_only == {"/proc", "/sys", "/"}
    assert "--web.listen-address=192.168.100.11:9100" in ne.args
    assert HOOK not in json.dumps([s.describe() for s in specs.values()])


def test_monitoring_containers_are_no_deployment_and_down_leaves_them():
    i = inv()
    labels = stack.labels(i, stack.PROMETHEUS)
    assert CLUSTER_LABEL not in labels  # teardown removes what carries it; deployments count it
    assert deployments.group(i, {"spark-a": [{"Names": ["/x"], "Labels": labels}]}) == []


def test_monitor_config_prints_no_webhook(tmp_path, monkeypatch):
    monkeypatch.setenv("ALERT_WEBHOOK_URL", HOOK)
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(cli, ["-i", str(INV_PATH), "monitor", "config", "--alertmanager"], obj=None)
    assert r.exit_code == 0, r.output
    assert HOOK not in r.output and "webhook_configs" in r.output


def test_planned_silence_covers_the_nodes_until_the_end_given():
    argv = alerting.silence_argv(inv(), ["spark-a", "spark-b"], "sparkcluster down", 0.0)
    assert argv[:2] == ["/bin/amtool", "--alertmanager.url=http://192.168.100.10:9093"]
    assert "cluster=pair" in argv and "node=~spark-a|spark-b" in argv and "--end=1970-01-01T00:00:00Z" in argv
    assert alerting.end_argv(inv(), "abc", 60.0)[-2:] == ["--end=1970-01-01T00:01:00Z", "abc"]


class FakeAPI:
    """The Docker Engine API of one node, as far as monitor/planned uses it."""

    def __init__(self, monitoring: bool, deployments: list[dict] | None = None):
        self.monitoring, self.deployments, self.calls = monitoring, deployments or [], []

    def containers(self, all=False, filters=None):
        label = (filters or {}).get("label", "")
        if label.startswith("org.sparkcluster.monitor="):
            names = ["/sparkcluster-pair-alertmanager", "/sparkcluster-pair-prometheus"] if self.monitoring else []
            return [{"Names": [n], "State": "running"} for n in names]
        return self.deployments

    def exec_create(self, container, argv, environment=None):
        self.calls.append(("exec", container, argv))
        return {"Id": "e1"}

    def exec_start(self, exec_id):
        return b"6a1f-silence-id\n"

    def exec_inspect(self, exec_id):
        return {"ExitCode": 0}

    def put_archive(self, container, path, data):
        self.calls.append(("put", container, _tar_members(data)))

    def kill(self, container, signal=None):
        self.calls.append(("kill", container, signal))


class FakeHost:
    def __init__(self, name, api):
        self.name, self.api = name, api

    def docker(self):
        return type("D", (), {"api": self.api})()


def test_planned_work_is_silenced_then_the_new_deployment_scraped():
    from sparkcluster.monitor import planned

    served_now = [
        {
            "Names": ["/sparkcluster-pair-head"],
            "Labels": {CLUSTER_LABEL: "pair", "org.sparkcluster.profile": "p", "org.sparkcluster.nodes": "spark-a"},
        }
    ]
    head = FakeAPI(True, served_now)
    hosts = {"spark-a": FakeHost("spark-a", head), "spark-b": FakeHost("spark-b", FakeAPI(False))}
    with planned.planned(hosts, inv(), ["spark-a"], "sparkcluster up") as silence:
        assert silence == "6a1f-silence-id"
        assert head.calls[0][0] == "exec" and "node=~spark-a" in head.calls[0][2]
    kinds = [c[0] for c in head.calls]
    assert kinds == ["exec", "exec", "put", "kill"]
    assert head.calls[1][2][-1] == "6a1f-silence-id"  # the silence now ends GRACE_S after the work
    members = head.calls[2][2]
    assert members[stack.PROM_CONFIG.lstrip("/")].isfile() and head.calls[3] == (
        "kill",
        "sparkcluster-pair-prometheus",
        "SIGHUP",
    )


def test_planned_work_without_monitoring_touches_nothing_and_a_failure_is_not_the_commands():
    from sparkcluster.monitor import planned

    head = FakeAPI(False)
    with planned.planned({"spark-a": FakeHost("spark-a", head)}, inv(), ["spark-a"], "sparkcluster down"):
        pass
    assert head.calls == []

    class Broken(FakeAPI):
        def containers(self, all=False, filters=None):
            raise OSError("the engine does not answer")

    with planned.planned({"spark-a": FakeHost("spark-a", Broken(True))}, inv(), ["spark-a"], "x") as silence:
        assert silence is None


def test_alertmanagers_alerts_read_as_events_oldest_first():
    doc = json.loads((Path(__file__).parents[1] / "captured" / "alertmanager-0.25-alert-query.json").read_text())
    got = alerting.alert_entries(doc)
    assert [e["event"] for e in sorted(got, key=lambda e: e["event"])] == [
        "alert SparkNodeUnreachable",
        "alert SparkRestartLoop (suppressed)",
    ]
    unreachable = next(e for e in got if e["event"] == "alert SparkNodeUnreachable")
    assert unreachable["node"] == "spark-b" and unreachable["summary"] == "pair: spark-b does not answer Prometheus"
    assert unreachable["ts"] > 1.7e9 and [e["ts"] for e in got] == sorted(e["ts"] for e in got)
    assert alerting.alert_entries({"not": "a list"}) == []


def test_start_replaces_the_container_pulls_a_missing_image_and_writes_files_before_starting():
    import docker.errors

    calls = []

    class API:
        def remove_container(self, name, force=False):
            calls.append(("remove", name))
            raise docker.errors.NotFound("none")

        def inspect_image(self, image):
            raise docker.errors.ImageNotFound("absent")

        def pull(self, image):
            calls.append(("pull", image))

        def create_host_config(self, **kw):
            calls.append(("host_config", kw))
            return kw

        def create_container(self, image, **kw):
            calls.append(("create", image, kw))
            return {"Id": "c1"}

        def put_archive(self, cid, path, data):
            calls.append(("put", cid, sorted(_tar_members(data))))

        def start(self, cid):
            calls.append(("start", cid))

    i = inv()
    spec = next(s for s in stack.specs(i, "{}", "{}", {}) if s.component == stack.PROMETHEUS)
    assert stack.start(API(), i, spec) == "c1"
    assert [c[0] for c in calls] == ["remove", "pull", "host_config", "create", "put", "start"]
    hc, create = calls[2][1], calls[3][2]
    assert hc["network_mode"] == "host" and hc["restart_policy"] == {"Name": "unless-stopped"}
    assert hc["binds"] == {"sparkcluster-pair-prometheus-data": {"bind": "/prometheus", "mode": "rw"}}
    assert create["entrypoint"] == ["/bin/prometheus"] and create["user"] == "65534:65534"
    assert create["labels"] == {"org.sparkcluster.monitor": "pair", "org.sparkcluster.monitor.component": "prometheus"}
    assert "etc/prometheus/prometheus.yml" in calls[4][2] and "etc/prometheus/rules/sparkcluster.yml" in calls[4][2]


def test_the_gateways_scrape_carries_a_key_from_a_0600_file_that_its_metrics_take(tmp_path):
    """The gateway's /metrics takes a client key: Prometheus' job for it reads the first of
    GATEWAY_API_KEYS from a file of its own (0600, nobody's), never from prometheus.yml."""
    from starlette.testclient import TestClient

    from sparkcluster.cli.monitor_cmd import gateway_key
    from sparkcluster.config.secrets import split_keys
    from sparkcluster.gateway.app import Gateway

    keys = "scrape-key-0123456789abcdef,another-client-key-0123"
    env = tmp_path / ".env"
    env.write_text(f"GATEWAY_API_KEYS={keys}\n")
    env.chmod(0o600)
    i = inv()
    doc = scrape.prometheus_config(i, scrape.targets(i, served(), {"spark-a": 4000}))
    jobs = {j["job_name"]: j for j in doc["scrape_configs"]}
    assert jobs["gateway"]["authorization"] == {"type": "Bearer", "credentials_file": scrape.GATEWAY_KEY_FILE}
    assert all("authorization" not in j for name, j in jobs.items() if name != "gateway")
    key = gateway_key(env)
    prom_yml = scrape.render(doc)
    prom = next(s for s in stack.specs(i, prom_yml, "{}", {}, key) if s.component == stack.PROMETHEUS)
    member = _tar_members(stack.files_tar(prom.files, prom.user))[scrape.GATEWAY_KEY_FILE.lstrip("/")]
    assert (member.mode, member.uid, member.gid) == (0o600, 65534, 65534)
    shown = prom.files[scrape.GATEWAY_KEY_FILE][0]
    assert shown == key and key not in prom_yml and key not in prom.describe()
    # what a gateway made with the same keys answers Prometheus' scrape, and a scrape without it
    gw = Gateway({"keys": split_keys(keys), "deployments": []})
    page = TestClient(gw.app())
    assert page.get("/metrics", headers={"Authorization": f"Bearer {shown}"}).status_code == 200
    assert page.get("/metrics").status_code == 401
    # no key in the .env: the file is written empty (the gateway refuses it, monitor up says so)
    assert next(s for s in stack.specs(i, prom_yml, "{}", {}) if s.component == stack.PROMETHEUS).files[
        scrape.GATEWAY_KEY_FILE
    ] == ("", 0o600)
