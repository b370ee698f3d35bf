"""Every command that changes nodes prints the steps it runs: a step carries its run function (one
without is neither printed nor walked), and `down`, `gateway up|down`, `monitor up|down` and
`weights rm` walk exactly the steps their `--dry-run --json` printed, by id. No host is needed: the
connections are stand-ins that answer what each command reads, and the actions the steps perform
are recorded instead of done (the actions themselves are tested in test_teardown, test_gateway_hold,
test_monitor_config, test_weights_stage). A dry run never prints a secret."""

from __future__ import annotations

import contextlib
import json
from types import SimpleNamespace

import pytest
from conftest import make_inventory

from sparkcluster.cli import main as cli_main
from sparkcluster.config import profile as profiles
from sparkcluster.deployment import deployments, gateway_registry, teardown
from sparkcluster.deployment.deployments import Deployment
from sparkcluster.errors import EXIT_UNREACHABLE, ConnectError
from sparkcluster.remote.fanout import ConnectedHosts
from sparkcluster.steps import walk
from sparkcluster.steps.base import Step, render_steps

HEAD, WORKER = "spark-head", "spark-worker"
GATEWAY_KEY = "gw-client-key-0123456789abcdef"
WEBHOOK = "https://hooks.example.invalid/secret-path-0123456789"


class FakeHost:
    """A connected node: its name, address and a Docker API stand-in (nothing is asked of it that
    the stand-ins below do not answer)."""

    def __init__(self, name: str):
        self.name, self.address = name, name
        self.api = SimpleNamespace(name=name)

    def docker(self):
        return SimpleNamespace(api=self.api)

    def run(self, *a, **kw):
        return SimpleNamespace(stdout="1000:1000\n", ok=True)

    def close(self) -> None:
        pass


@pytest.fixture
def inv(monkeypatch):
    inv = make_inventory()
    monkeypatch.setattr(cli_main.Invocation, "inventory", lambda self: inv)
    return inv


@pytest.fixture
def walked(monkeypatch):
    """The ids of the steps walked to their end (done or skipped), in order."""
    seen: list[str] = []
    monkeypatch.setattr(walk, "event", lambda step, outcome, seconds=None: seen.append(step.id))
    return seen


def connected(inv, monkeypatch, module) -> None:
    """`module`'s connect_reachable answers with every node connected (stand-ins)."""
    hosts = {n.name: FakeHost(n.name) for n in inv.nodes}
    monkeypatch.setattr(module, "connect_reachable", lambda i, nodes=None: (ConnectedHosts(i, dict(hosts)), {}))


def sparkcluster(capsys, *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    rc = cli_main.main(list(argv))
    return rc, capsys.readouterr().out


def printed_ids(capsys, *argv: str) -> list[str]:
    rc, out = sparkcluster(capsys, *argv, "--dry-run", "--json")
    assert rc == 0, out
    steps = json.loads(out)
    assert all(set(s) == {"id", "stage", "host", "description"} for s in steps), steps
    return [s["id"] for s in steps]


# ---------------------------------------------------------------------------------- the step engine


def test_a_step_without_a_run_is_neither_printed_nor_walked(walked):
    ran = []
    steps = [Step("x", HEAD, "first", "runs", run=lambda r: ran.append(1)), Step("x", HEAD, "bare", "has no run")]
    with pytest.raises(TypeError, match="x/spark-head/bare has no run function"):
        walk.walk(walk.CommandRun(), steps)
    assert ran == [] and walked == []  # refused before any step ran
    with pytest.raises(TypeError):
        render_steps(steps)
    with pytest.raises(TypeError):
        steps[1].public()


def test_every_step_of_every_plan_has_a_run(inv):
    """up's plan (offline: every stage), upgrade's, the gateway's, weights pull's: no step without its run."""
    from sparkcluster.gateway import rollout
    from sparkcluster.up import weights_only
    from sparkcluster.up.plan import make_offline_plan

    prof = profiles.load_profile("testbed")
    plans = {
        "up": make_offline_plan(inv, prof).steps(),
        "gateway": rollout.make(inv, HEAD, [], {}, {}, [GATEWAY_KEY], "img:1", None).steps(),
        "gateway replace": rollout.make(
            inv, HEAD, [], {}, {}, [GATEWAY_KEY], "img:1", {"Id": "c1", "State": "running", "Labels": {}}
        ).steps(),
        "weights pull": weights_only.pull_plan(inv, prof, ["HF_TOKEN"], False).steps(),
    }
    for name, steps in plans.items():
        assert steps, name
        assert [s.id for s in steps if s.run is None] == [], name


# ---------------------------------------------------------------------------------- down


@pytest.fixture
def down_fakes(inv, monkeypatch):
    from sparkcluster.cli import down_cmd
    from sparkcluster.down import down_plan, down_run

    connected(inv, monkeypatch, down_plan)
    pair = Deployment("testbed", (HEAD, WORKER), {HEAD: ["h"], WORKER: ["w"]}, ids={HEAD: {"h1"}, WORKER: {"w1"}})
    monkeypatch.setattr(deployments, "on", lambda cluster, full: ([pair], {}))
    monkeypatch.setattr(down_run, "NodeLocks", lambda *a: contextlib.nullcontext())
    monkeypatch.setattr(down_cmd, "planned", lambda *a: contextlib.nullcontext())
    monkeypatch.setattr(
        teardown,
        "down",
        lambda cluster, **kw: {n: teardown.NodeTeardown(n, removed=[f"{n}-c"]) for n in cluster.hosts},
    )
    monkeypatch.setattr(teardown, "purge_caches", lambda cluster: {n: ([], []) for n in cluster.hosts})
    monkeypatch.setattr(down_plan, "learn_homes", lambda cluster: None)


@pytest.mark.parametrize(
    "args", [(), ("--purge-gcs", "--purge-caches"), ("--node", WORKER), ("--profile", "testbed")], ids=str
)
def test_down_walks_exactly_the_steps_its_dry_run_prints(capsys, walked, down_fakes, args):
    ids = printed_ids(capsys, "down", *args)
    assert walked == []  # the dry run ran nothing
    assert ids[0] == f"down/{HEAD}/deployment:testbed@{HEAD}+{WORKER}"
    if "--purge-caches" in args:
        assert ids[-2:] == [f"down/{HEAD}/compile-caches", f"down/{WORKER}/compile-caches"]
    rc, out = sparkcluster(capsys, "down", *args)
    assert rc == 0, out
    assert walked == ids
    rc, text = sparkcluster(capsys, "down", *args, "--dry-run")
    assert rc == 0 and "[down]" in text and "stop vllm serve of 'testbed'" in text, text


# ---------------------------------------------------------------------------------- gateway


@pytest.fixture
def gateway_fakes(inv, monkeypatch):
    from sparkcluster.gateway import deploy, gateway_steps, store

    connected(inv, monkeypatch, gateway_steps)
    monkeypatch.setattr(store, "folder", lambda host, cluster: f"/home/spark/gateway/{cluster}")
    monkeypatch.setenv("GATEWAY_API_KEYS", GATEWAY_KEY)
    monkeypatch.setattr(deployments, "on", lambda cluster, full: ([Deployment("testbed", (HEAD, WORKER))], {}))
    running = {"now": None}
    monkeypatch.setattr(gateway_registry, "find", lambda api, cluster: running["now"])
    monkeypatch.setattr(gateway_registry, "holds", lambda api, c: {})
    monkeypatch.setattr(gateway_registry, "write_doc", lambda api, c, doc: None)
    monkeypatch.setattr(deploy, "deployment_image", lambda api, cluster: "img:1")
    monkeypatch.setattr(deploy, "wake_tokens", lambda *a: {})
    monkeypatch.setattr(gateway_steps, "NodeLocks", lambda *a: contextlib.nullcontext())
    did: list[str] = []
    monkeypatch.setattr(store, "prepare", lambda host, path: did.append("data"))
    monkeypatch.setattr(store, "purge", lambda host, path: did.append("purge"))
    monkeypatch.setattr(deploy, "port_holder", lambda host, port: did.append("port") or "")
    monkeypatch.setattr(deploy, "create", lambda api, plan: did.append("create"))
    monkeypatch.setattr(deploy, "halt", lambda api, cid: did.append("halt"))
    monkeypatch.setattr(deploy, "remove", lambda api, cid: did.append("remove"))
    monkeypatch.setattr(deploy, "wait_ready", lambda api, c, address, plan: did.append("ready") or {"routes": []})
    return SimpleNamespace(running=running, did=did)


def test_gateway_up_walks_exactly_the_steps_its_dry_run_prints(capsys, walked, gateway_fakes):
    for running in (None, {"Id": "old", "State": "running", "Labels": {}, "Names": ["/gw"]}):
        gateway_fakes.running["now"] = running
        walked.clear()
        gateway_fakes.did.clear()
        ids = printed_ids(capsys, "gateway", "up")
        assert walked == [] and gateway_fakes.did == []
        rc, out = sparkcluster(capsys, "gateway", "up")
        assert rc == 0, out
        assert walked == ids and gateway_fakes.did, (walked, ids)
    assert [i.rsplit("/", 1)[1] for i in ids] == ["data", "replace", "port", "create", "ready"]
    rc, text = sparkcluster(capsys, "gateway", "up", "--dry-run")
    assert rc == 0 and GATEWAY_KEY not in text and "******" in text, text


def test_gateway_down_walks_exactly_the_steps_its_dry_run_prints(capsys, walked, gateway_fakes):
    gateway_fakes.running["now"] = {"Id": "gw1", "Names": ["/sparkcluster-pair-gateway"], "Labels": {}}
    ids = printed_ids(capsys, "gateway", "down", "--purge-usage")
    stops = [f"gateway/{HEAD}/stop", f"gateway/{WORKER}/stop"]
    assert ids == [*stops, f"gateway/{HEAD}/purge-usage", f"gateway/{WORKER}/purge-usage"] and walked == []
    rc, out = sparkcluster(capsys, "gateway", "down", "--purge-usage", "--json")
    assert rc == 0 and json.loads(out)["ok"] is True, out
    assert walked == ids and gateway_fakes.did == ["halt", "remove", "halt", "remove", "purge", "purge"]


# ---------------------------------------------------------------------------------- monitor


@pytest.fixture
def monitor_fakes(inv, monkeypatch):
    from sparkcluster.monitor import monitor_steps, stack

    connected(inv, monkeypatch, monitor_steps)
    monkeypatch.setenv("ALERT_WEBHOOK_URL", WEBHOOK)
    monkeypatch.setenv("GATEWAY_API_KEYS", GATEWAY_KEY)
    monkeypatch.setattr(deployments, "on", lambda cluster, full: ([Deployment("testbed", (HEAD, WORKER))], {}))
    monkeypatch.setattr(gateway_registry, "ports", lambda hosts, cluster: {HEAD: 4000})
    started: list[str] = []
    monkeypatch.setattr(stack, "start", lambda api, inv, spec: started.append(spec.name) or "cid")
    monkeypatch.setattr(stack, "ours", lambda api, inv: [{"Names": [f"/mon-{api.name}"]}])
    monkeypatch.setattr(stack, "down", lambda api, inv, purge: [f"mon-{api.name}"])
    return started


def test_monitor_up_walks_exactly_the_steps_its_dry_run_prints(capsys, walked, monitor_fakes):
    ids = printed_ids(capsys, "monitor", "up")
    assert walked == [] and monitor_fakes == []
    assert {i.split("/")[1] for i in ids} == {HEAD, WORKER}
    rc, out = sparkcluster(capsys, "monitor", "up", "--json")
    body = json.loads(out)
    assert rc == 0 and body["ok"] is True and all(c["started"] for c in body["containers"]), out
    assert sorted(walked) == sorted(ids) and len(monitor_fakes) == len(ids)
    rc, text = sparkcluster(capsys, "monitor", "up", "--dry-run")
    assert rc == 0 and "[monitor]" in text, text
    for secret in (WEBHOOK, GATEWAY_KEY):
        assert secret not in text
        assert secret not in json.dumps(printed_ids(capsys, "monitor", "up"))


def test_monitor_down_walks_exactly_the_steps_its_dry_run_prints(capsys, walked, monitor_fakes):
    ids = printed_ids(capsys, "monitor", "down", "--purge-data")
    assert ids == [f"monitor/{HEAD}/remove", f"monitor/{WORKER}/remove"] and walked == []
    rc, out = sparkcluster(capsys, "monitor", "down", "--purge-data", "--json")
    assert rc == 0 and [r["state"] for r in json.loads(out)["nodes"]] == ["removed", "removed"], out
    assert walked == ids


# ---------------------------------------------------------------------------------- one failure shape

SHAPE = {"ok", "error", "fix", "problems", "exit_code", "details"}  # docs/reference/cli.md


def test_a_failure_of_a_command_with_a_report_keeps_the_one_shape(capsys, inv, monkeypatch):
    """`down` and `monitor down` with a node out of reach: the failure's fields, each node's problem
    with its own fix, and the command's rows beside them."""
    from sparkcluster.cli import down_cmd
    from sparkcluster.down import down_plan, down_run
    from sparkcluster.monitor import monitor_steps, stack

    gone = ConnectError(WORKER, "connection refused", f"check that {WORKER} answers: ssh {WORKER}")

    def head_only(i, nodes=None):
        return ConnectedHosts(i, {HEAD: FakeHost(HEAD)}), {WORKER: gone}

    for module in (down_plan, monitor_steps):
        monkeypatch.setattr(module, "connect_reachable", head_only)
    monkeypatch.setattr(deployments, "on", lambda cluster, full: ([], {}))
    monkeypatch.setattr(down_run, "NodeLocks", lambda *a: contextlib.nullcontext())
    monkeypatch.setattr(down_cmd, "planned", lambda *a: contextlib.nullcontext())
    monkeypatch.setattr(teardown, "down", lambda cluster, **kw: {n: teardown.NodeTeardown(n) for n in cluster.hosts})
    monkeypatch.setattr(stack, "ours", lambda api, inv: [])
    for argv, report in ((["down", "--json"], "nodes"), (["monitor", "down", "--json"], "nodes")):
        rc, out = sparkcluster(capsys, *argv)
        body = json.loads(out)
        assert rc == EXIT_UNREACHABLE == body["exit_code"] and SHAPE <= set(body) and report in body, out
        assert body["ok"] is False and body["error"] and body["fix"], body
        assert body["problems"] == [{"node": WORKER, "error": f"{WORKER}: connection refused", "fix": gone.fix}], body


# ---------------------------------------------------------------------------------- doctor --fabric


def test_doctor_fabric_walks_its_test_as_the_step_its_dry_run_prints(inv, walked, monkeypatch):
    from sparkcluster.checks import Result
    from sparkcluster.fabric import measure
    from sparkcluster.steps.base import dry_run

    ran = []
    ok = Result("fabric.bandwidth", f"{HEAD}+{WORKER}", "ok", "1 GB/s")
    monkeypatch.setattr(measure, "run", lambda *a: ran.append(a) or [ok])
    prof = profiles.load_profile("testbed")
    steps = measure.test_steps(None, inv, prof, "img:1", {})
    ids = [s["id"] for s in json.loads(dry_run(steps, True))]
    assert ids == [f"fabric/{HEAD}/test"] and "throwaway container of img:1" in dry_run(steps, False)
    assert ran == [] and walked == []
    assert measure.walk_test(steps) == [ok] and walked == ids and len(ran) == 1
