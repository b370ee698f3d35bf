"""The executor walks exactly the plan's steps: in order, the parallel ones at once, skips said
with their reason, a failure naming host, step, command and last lines; one `step` event each.
Also the plan's JSON form and the runner's loud failures (no host needed)."""

from __future__ import annotations

import json
import threading
import time

import docker.errors
import pytest
import requests
from conftest import make_inventory

from sparkcluster import redact
from sparkcluster.config import profile as profiles
from sparkcluster.deployment import endpoint, supervision
from sparkcluster.errors import CommandFailed, EngineUnreachable, StageError
from sparkcluster.facts import HostFacts, parsers
from sparkcluster.movement import hfcache
from sparkcluster.node import contract
from sparkcluster.remote import dockerapi
from sparkcluster.remote.fanout import run_each
from sparkcluster.remote.result import CommandResult
from sparkcluster.steps import walk
from sparkcluster.steps.base import Step
from sparkcluster.up import execute
from sparkcluster.up.plan import make_plan
from sparkcluster.up.stages import STAGES
from sparkcluster.up.stages.containers import Created

HEAD, WORKER = "spark-head", "spark-worker"


class Recorder(walk.StageProgress):
    def __init__(self):
        self.lines: list[str] = []

    def stage(self, name):
        self.lines.append(f"stage {name}")

    def done(self, name, seconds, note=""):
        self.lines.append(f"done {name}: {note}")


class FakePlan:
    def __init__(self, steps):
        self._s = steps

    def steps(self):
        return list(self._s)


@pytest.fixture(autouse=True)
def fabric_measured(monkeypatch):
    """The fabric stage's test itself runs on the testbed (test_fabric) and in test_fabric_measure;
    here the fake engines have no ranks to run, so it reports a healthy fabric."""
    from sparkcluster.checks import Result
    from sparkcluster.fabric import measure

    monkeypatch.setattr(measure, "run", lambda *a, **kw: [Result("fabric.bandwidth", "a+b", "ok", "1 GB/s")])


def fake_run(steps) -> execute.UpRun:
    return execute.UpRun(cluster=None, plan=FakePlan(steps), facts={}, secrets={}, progress=Recorder())


@pytest.fixture
def events(monkeypatch):
    seen: list[tuple[str, str]] = []
    monkeypatch.setattr(walk, "event", lambda step, outcome, seconds=None: seen.append((step.id, outcome)))
    return seen


def test_walk_runs_in_order_and_reports_each_step(events):
    ran = []
    steps = [
        Step("image", HEAD, "a", "a", run=lambda r: ran.append("a")),
        Step("image", WORKER, "b", "b", run=lambda r: ran.append("b"), when="x", skip=lambda r: "not needed"),
        Step("image", WORKER, "c", "c", run=lambda r: ran.append("c") or "note"),
    ]
    done = walk.walk(fake_run(steps), steps)
    assert ran == ["a", "c"]
    assert [(s.action, v) for s, v in done] == [("a", None), ("c", "note")]
    assert events == [
        ("image/spark-head/a", "done"),
        ("image/spark-worker/b", "skipped: not needed"),
        ("image/spark-worker/c", "done"),
    ]


def test_parallel_steps_run_at_once():
    barrier = threading.Barrier(2, timeout=5)
    steps = [
        Step("probe", h, "env", "env", run=lambda r: barrier.wait() is not None, parallel="probe")
        for h in (HEAD, WORKER)
    ]
    assert len(walk._batches(steps)) == 1
    done = walk.walk(fake_run(steps), steps)  # would time out on the barrier if run one by one
    assert [s.host for s, _ in done] == [HEAD, WORKER]


def test_a_failed_command_fails_the_stage_naming_host_step_command_and_tail(events):
    res = CommandResult(WORKER, "sync && echo 3 > /proc/sys/vm/drop_caches", 1, "", "Permission denied\n", 0.1)

    def boom(r):
        raise CommandFailed(res)

    steps = [Step("containers", WORKER, "drop-page-cache", "drop the page cache", run=boom)]
    with pytest.raises(StageError) as e:
        walk.walk(fake_run(steps), steps)
    f = e.value.failures[0]
    assert (e.value.stage, f.host, f.step, f.reason) == ("containers", WORKER, "drop the page cache", "exit 1")
    assert f.command == res.command and "Permission denied" in f.output_tail
    assert events == [("containers/spark-worker/drop-page-cache", "failed")]


def test_an_unreachable_engine_is_a_failure_naming_the_node(events):
    def boom(r):
        raise EngineUnreachable(HEAD, "inspect_image", ConnectionError("channel closed"))

    steps = [
        Step("image", HEAD, "receive", "receive the image from the head", run=boom, parallel="p"),
        Step("image", WORKER, "receive", "receive the image from the head", run=lambda r: None, parallel="p"),
    ]
    with pytest.raises(StageError) as e:
        walk.walk(fake_run(steps), steps)
    assert [f.host for f in e.value.failures] == [HEAD]
    assert "did not answer" in e.value.failures[0].reason


def test_a_bug_is_not_dressed_as_a_stage_failure(events):
    steps = [Step("serve", HEAD, "start", "start", run=lambda r: {}["missing"])]
    with pytest.raises(KeyError):
        walk.walk(fake_run(steps), steps)
    assert events == [("serve/spark-head/start", "failed")]


def test_execute_reports_each_stage_with_steps_and_always_the_image(events):
    steps = [Step("probe", HEAD, "env", "env", run=lambda r: 3), Step("probe", WORKER, "env", "env", run=lambda r: 4)]
    r = fake_run(steps)
    execute.execute(r)
    assert r.progress.lines == [
        "stage image",
        "done image: in place on every node",
        "stage probe",
        "done probe: 7 variables right on 2 nodes",
    ]


# ---- the plan as data ---------------------------------------------------------------------------


def bare_plan(monkeypatch, **kw):
    monkeypatch.setenv("HF_TOKEN", "hf_plan_secret_value_42")
    redact.register("hf_plan_secret_value_42")
    prof = profiles.load_profile("testbed")
    facts = {h: HostFacts(h, hostname=h) for h in (HEAD, WORKER)}
    return make_plan(make_inventory(), prof, facts, serving=False, replace=False, **kw)


def test_every_side_effect_is_a_step_with_a_stable_unique_id(monkeypatch):
    plan = bare_plan(monkeypatch, secret_names={"HF_TOKEN", "VLLM_API_KEY"})
    ids = [s.id for s in plan.steps()]
    assert len(ids) == len(set(ids))
    assert all(s.id == f"{s.stage}/{s.host}/{s.action}" for s in plan.steps())
    assert [s.stage for s in plan.steps()] == sorted((s.stage for s in plan.steps()), key=list(STAGES).index)
    for want in (
        "serve/spark-head/hf-token",
        "serve/spark-worker/hf-token",
        "containers/spark-head/ray-head",
        "ray/spark-head/membership",
        "serve/spark-head/warm-up",
        "image/spark-head/build",
    ):
        assert want in ids, ids
    assert all(s.run is not None for s in plan.steps() if s.stage != "preflight")
    # the same inputs make the same plan
    assert [s.id for s in bare_plan(monkeypatch, secret_names={"HF_TOKEN", "VLLM_API_KEY"}).steps()] == ids


def test_receive_after_a_build_says_what_it_checks(monkeypatch):
    plan = bare_plan(monkeypatch)
    (recv,) = [s for s in plan.steps() if s.action == "receive"]
    assert recv.when and recv.skip is not None
    assert "only if" in plan.render() and "only if" in recv.description


def test_no_token_step_without_a_token(monkeypatch):
    plan = bare_plan(monkeypatch, secret_names={"VLLM_API_KEY"})
    assert not any(s.action == "hf-token" for s in plan.steps())


def test_json_lists_the_steps_masked(monkeypatch):
    plan = bare_plan(monkeypatch, secret_names={"HF_TOKEN"})
    text = plan.as_json()
    doc = json.loads(text)
    assert [d["id"] for d in doc] == [s.id for s in plan.steps()]
    assert all(set(d) == {"id", "stage", "host", "description"} for d in doc)
    assert "hf_plan_secret_value_42" not in text


def test_removal_is_one_step_per_container_workers_first(monkeypatch):
    prof = profiles.load_profile("testbed")

    def c(name, role):
        return parsers.container_inspect(
            {
                "Id": name + "-id",
                "Name": "/" + name,
                "State": {"Running": True},
                "Config": {"Labels": {"org.sparkcluster.role": role, "org.sparkcluster.profile": "testbed"}},
            }
        )

    facts = {
        HEAD: HostFacts(HEAD, hostname=HEAD, ours=[c("h1", "head")]),
        WORKER: HostFacts(WORKER, hostname=WORKER, ours=[c("w1", "worker"), c("w2", "worker")]),
    }
    plan = make_plan(make_inventory(), prof, facts, serving=False, replace=False)
    removes = [s for s in plan.steps() if s.action.startswith("remove-")]
    assert [(s.host, s.what) for s in removes] == [(WORKER, "remove w1"), (WORKER, "remove w2"), (HEAD, "remove h1")]
    assert "stop vllm serve" in removes[-1].detail and "stop vllm serve" not in removes[0].detail


# ---- the runner and the engine fail loudly, narrowly ----------------------------------------------


def test_command_failed_carries_the_result_and_fanout_names_it():
    res = CommandResult(HEAD, "false", 3, "", "went wrong\n", 0.1)

    def fn(_):
        raise CommandFailed(res)

    with pytest.raises(StageError) as e:
        run_each([(HEAD, None)], fn).values_or_raise("serve")
    f = e.value.failures[0]
    assert (f.host, f.reason, f.command) == (HEAD, "exit 3", "false") and "went wrong" in f.output_tail
    timed = CommandFailed(CommandResult(HEAD, "sleep 9", -1, "", "", 5.0, timed_out=True))
    assert "timed out" in timed.message


class FlakyAPI:
    def inspect_image(self, ref):
        raise requests.exceptions.ConnectionError("dial-stdio channel closed")

    def inspect_container(self, name):
        raise docker.errors.NotFound("no such container")


def test_guarded_api_tells_unreachable_from_not_found():
    api = dockerapi.GuardedAPI(FlakyAPI(), HEAD)
    with pytest.raises(EngineUnreachable) as e:
        api.inspect_image("x")
    assert e.value.host == HEAD and HEAD in e.value.message
    with pytest.raises(docker.errors.NotFound):
        api.inspect_container("x")


def test_poll_based_waits_give_up_in_time():
    from sparkcluster.remote import retry

    t = time.monotonic()
    assert retry.poll(lambda: None, timeout=0.3, interval=0.05, what="x") is None
    assert time.monotonic() - t < 2


# ---- a whole `up` against fake hosts: what runs is what the plan listed ------------------------------

IMAGE_ID = "sha256:" + "ab" * 32


class FakeEngine:
    def __init__(self, node, env_of):
        self.node, self.env_of, self.calls = node, env_of, []

    def build(self, **kw):
        self.calls.append("build")
        return iter([{"stream": "Successfully built\n"}])

    def inspect_image(self, ref):
        return {"Id": IMAGE_ID, "Size": 1000, "RootFS": {"Layers": ["l1"]}}

    def create_host_config(self, **kw):
        return kw

    def create_container(self, host_config=None, **kw):
        self.calls.append("create " + kw["name"])
        return {"Id": kw["name"] + "-id"}

    def put_archive(self, *a):
        return True

    def start(self, cid):
        self.calls.append("start " + cid)

    def inspect_container(self, name):  # as the Engine API answers (tests/captured/gb10-docker-inspect-head.json)
        env = [f"{k}={v}" for k, v in self.env_of(self.node).items()]
        return {"State": {"Running": True, "StartedAt": "2026-11-24T23:26:20.123456789Z"}, "Config": {"Env": env}}

    def logs(self, name, tail="all", **kw):  # the agent's first line, then what `ray start --head` prints
        return (
            b"sparkcluster agent: _CUDA_COMPAT_STATUS=\n"
            b"2026-11-24 23:26:26,774\tSUCC scripts.py:1085 -- \x1b[32mRay runtime started.\x1b[39m\n"
        )

    def exec_create(self, container, cmd, environment=None, **kw):
        self.calls.append("exec " + " ".join(cmd[:2]))
        return {"Id": "env" if cmd == ["env"] else "serve"}

    def exec_start(self, exec_id, detach=False):
        return "\n".join(f"{k}={v}" for k, v in self.env_of(self.node).items()).encode()

    def exec_inspect(self, exec_id):
        return {"Pid": 77, "Running": True, "ExitCode": 0}


class FakeHost:
    def __init__(self, node, inv, env_of):
        self.node, self.name, self.address, self.lost = node, node.name, str(node.control_ip), ""
        self.inv, self.engine, self.ran = inv, FakeEngine(node.name, env_of), []

    def docker(self):
        return type("Client", (), {"api": self.engine})()

    def run(self, cmd, timeout=30.0, stdin=None, warn=False):
        self.ran.append(cmd)
        out = "ray, version 2.60.0"
        if "8265" in cmd:  # Ray's state API: both nodes alive at their control IPs with their GPUs
            out = json.dumps(
                {
                    "data": {
                        "result": {
                            "result": [
                                {"node_ip": str(n.control_ip), "state": "ALIVE", "resources_total": {"GPU": n.gpus}}
                                for n in self.inv.nodes
                            ]
                        }
                    }
                }
            )
        elif "python3 -c" in cmd and " prepare " in cmd:  # the compile cache made ready, nothing evicted
            out = json.dumps({"key": "0" * 16, "evicted": [], "bytes": 0, "errors": []})
        elif hfcache.RESOLVE in cmd:  # the weights stage's resolver: a one-file snapshot
            out = json.dumps(
                {"sha": "c" * 40, "files": [{"path": "model.safetensors", "size": 10, "blob": "a" * 64, "lfs": True}]}
            )
        elif "models--" in str(stdin or b"")[:200] or ("python3 -c" in cmd and " check " in cmd):
            # the weights stage's node check: every node already holds the snapshot
            out = json.dumps(
                {
                    "missing": [],
                    "missing_bytes": 0,
                    "present_bytes": 10,
                    "partial_bytes": 0,
                    "corrupt": [],
                    "adopted": 0,
                    "free": 10**12,
                    "free_path": "/",
                }
            )
        return CommandResult(self.name, cmd, 0, out, "", 0.01)


def test_a_whole_up_runs_exactly_the_planned_steps(monkeypatch, events):
    from sparkcluster.config.images import image_ref
    from sparkcluster.container.spec import spec_for
    from sparkcluster.deployment import server
    from sparkcluster.remote.fanout import ConnectedHosts

    inv, prof = make_inventory(), profiles.load_profile("testbed")
    specs = {n.name: spec_for(inv, prof, n, image_ref(inv, prof)) for n in inv.nodes}
    hosts = {n.name: FakeHost(n, inv, lambda node: specs[node].env) for n in inv.nodes}
    # the head lacks the image (a build); the worker already holds what the build makes
    facts = {HEAD: HostFacts(HEAD, hostname=HEAD), WORKER: HostFacts(WORKER, hostname=WORKER, image_id=IMAGE_ID)}
    secrets = {"HF_TOKEN": "hf_x", "VLLM_API_KEY": "k"}
    plan = make_plan(inv, prof, facts, serving=False, replace=False, secret_names=secrets)
    monkeypatch.setattr(server, "wait_ready", lambda *a, **kw: 1.0)
    # the supervisor in the head container starts the server (tested in test_agent / test_serve_start)
    monkeypatch.setattr(server, "start", lambda *a, **kw: server.Record(77, "", "testbed", "testbed-tiny", 8000, 0.0))
    monkeypatch.setattr(server, "read_wake_token", lambda *a: None)  # the token a gateway gets (test_on_demand)
    monkeypatch.setattr(supervision, "state", lambda *a: contract.Supervised.of({"state": "serving", "generation": ""}))
    monkeypatch.setattr(endpoint, "warm_up", lambda *a, **kw: 0.5)
    r = execute.UpRun(ConnectedHosts(inv, hosts), plan, facts, secrets, Recorder())
    execute.execute(r)
    planned = [s.id for s in plan.steps() if s.stage != "preflight"]
    assert "fabric/spark-head/test" in planned
    # in the plan's order, but for steps of one parallel group (one per node at once: their events come
    # in the order they finish, e.g. containers/*/compile-cache)
    groups = {s.id: s.parallel or s.id for s in plan.steps() if s.stage != "preflight"}
    ran = [i for i, _ in events]
    assert sorted(ran) == sorted(planned)
    first = {g: min(k for k, i in enumerate(planned) if groups[i] == g) for g in groups.values()}
    assert [first[groups[i]] for i in ran] == sorted(first[groups[i]] for i in ran)
    assert dict(events)["image/spark-worker/receive"] == "skipped: it already holds the head's image"
    assert all(o == "done" for i, o in events if i != "image/spark-worker/receive" and not o.startswith("skipped: "))
    # the snapshot is in place on both nodes: the weights stage moves nothing
    assert {i for i, o in events if o.startswith("skipped")} == {
        "image/spark-worker/receive",
        "weights/spark-head/disk",
        "weights/spark-head/hf-token",
        "weights/spark-head/download",
        "weights/spark-worker/replicate",
    }
    assert r.get(Created).containers == {HEAD: {specs[HEAD].name + "-id"}, WORKER: {specs[WORKER].name + "-id"}}
    assert r.get(server.Record).pid == 77
    assert hosts[HEAD].engine.calls[0] == "build"
    assert "done serve: ready after 1.5s" in r.progress.lines
    assert "done containers: 2 created" in r.progress.lines


# ---- the readiness wait (retry.poll) ----------------------------------------------------------------


def test_wait_ready_outcomes(monkeypatch):
    from sparkcluster.deployment import server

    spec = server.ServeSpec("c", ["vllm"], [], "m", 8000, None)
    rec = server.Record(1, "e", "p", "m", 8000, 0.0)
    monkeypatch.setattr(server, "log_tail", lambda api, c: "last lines")
    monkeypatch.setattr(server, "running", lambda api, r: True)
    answers = iter([None, 503, 200])
    monkeypatch.setattr(server, "health", lambda client, base: next(answers))
    monkeypatch.setattr(server, "one_token", lambda *a, **kw: (True, "ok"))
    waits = []
    assert server.wait_ready(None, rec, spec, "http://x", {}, 10, on_wait=lambda why, s: waits.append(why)) >= 0
    assert waits == ["the server has not opened its port yet", "/health answers HTTP 503"]
    monkeypatch.setattr(server, "health", lambda client, base: 503)
    with pytest.raises(server.NotReady) as e:
        server.wait_ready(None, rec, spec, "http://x", {}, 0.3)
    assert e.value.reason == "not ready after 0.3s: /health answers HTTP 503" and e.value.tail == "last lines"
    monkeypatch.setattr(server, "running", lambda api, r: False)
    with pytest.raises(server.NotReady, match="vllm serve exited"):
        server.wait_ready(None, rec, spec, "http://x", {}, 10)
    monkeypatch.setattr(server, "running", lambda api, r: True)
    monkeypatch.setattr(server, "health", lambda client, base: 200)
    monkeypatch.setattr(server, "one_token", lambda *a, **kw: (False, "completion answered HTTP 401: no"))
    with pytest.raises(server.NotReady, match="does not match"):
        server.wait_ready(None, rec, spec, "http://x", {}, 10)


# ---- up's order, rollback and summary, over fake hosts -------------------------------------------------


class TrackingEngine(FakeEngine):
    """Also lists and removes what it created, as `teardown` asks by label and ID."""

    def __init__(self, node, env_of, labels_of):
        super().__init__(node, env_of)
        self.labels_of, self.live, self.removed = labels_of, {}, []

    def create_container(self, host_config=None, **kw):
        c = super().create_container(host_config, **kw)
        self.live[c["Id"]] = kw["name"]
        return c

    def containers(self, all=True, filters=None):
        return [{"Id": i, "Names": ["/" + n], "Labels": self.labels_of(n)} for i, n in self.live.items()]

    def remove_container(self, cid, force=False):
        self.removed.append(self.live.pop(cid))

    def get_archive(self, container, path):
        raise docker.errors.NotFound("no record")


def fake_cluster(inv, prof, env_of):
    from sparkcluster.config.images import image_ref
    from sparkcluster.container.spec import spec_for
    from sparkcluster.remote.fanout import ConnectedHosts

    specs = {n.name: spec_for(inv, prof, n, image_ref(inv, prof)) for n in inv.nodes}
    labels = {s.name: s.labels for s in specs.values()}
    hosts = {}
    for n in inv.nodes:
        h = FakeHost(n, inv, lambda node: env_of(specs[node]))
        h.engine = TrackingEngine(n.name, h.engine.env_of, labels.get)
        hosts[n.name] = h
    return ConnectedHosts(inv, hosts), specs


def up_over(monkeypatch, env_of):
    from types import SimpleNamespace

    from sparkcluster.deployment import server
    from sparkcluster.up import bringup
    from sparkcluster.up.stages import gate

    inv, prof = make_inventory(), profiles.load_profile("testbed")
    cluster, specs = fake_cluster(inv, prof, env_of)
    facts = {n.name: HostFacts(n.name, hostname=n.name, image_id=IMAGE_ID, image_ray="2.60.0") for n in inv.nodes}
    monkeypatch.setattr(gate, "check", lambda c, i, p: SimpleNamespace(facts=facts, results=[1, 2]))
    monkeypatch.setattr(server, "wait_ready", lambda *a, **kw: 1.0)
    # the supervisor in the head container starts the server (tested in test_agent / test_serve_start)
    monkeypatch.setattr(server, "start", lambda *a, **kw: server.Record(77, "", "testbed", "testbed-tiny", 8000, 0.0))
    monkeypatch.setattr(supervision, "state", lambda *a: contract.Supervised.of({"state": "serving", "generation": ""}))
    monkeypatch.setattr(endpoint, "warm_up", lambda *a, **kw: 0.5)
    progress = Recorder()
    progress.info = lambda text: progress.lines.append("info " + text)
    return cluster, lambda: bringup._run_locked(cluster, inv, prof, {"VLLM_API_KEY": "k"}, progress, False, False, 0.0)


def test_up_runs_the_plan_and_sums_it_up(monkeypatch, events):
    cluster, go = up_over(monkeypatch, lambda spec: spec.env)
    out = go()
    assert not out.unchanged and out.pid == 77 and out.model == "testbed-tiny"
    assert set(out.seconds) == {"image", "weights", "containers", "ray", "fabric", "probe", "serve"}
    assert events[:2] == [("preflight/spark-head/facts", "done"), ("preflight/spark-worker/facts", "done")]


def test_a_failed_stage_rolls_back_what_this_run_created(monkeypatch, events):
    # the worker's container lacks a forwarded variable: the probe fails after both were created
    cluster, go = up_over(
        monkeypatch,
        lambda spec: {k: v for k, v in spec.env.items() if k != "VLLM_HOST_IP"} if spec.role == "worker" else spec.env,
    )
    with pytest.raises(StageError) as e:
        go()
    assert e.value.stage == "probe" and e.value.failures[0].host == WORKER
    assert ("probe/spark-worker/env", "failed") in events
    assert not any(i.startswith("serve/") for i, _ in events)
    for h in cluster.hosts.values():
        assert h.engine.live == {} and len(h.engine.removed) == 1


# ---- the page cache, dropped without sudo ------------------------------------------------------


class _Host:
    def __init__(self, res):
        self.res, self.cmds = res, []

    def run(self, cmd, timeout=30.0, stdin=None, warn=False):
        self.cmds.append(cmd)
        return self.res


def test_page_cache_is_dropped_through_docker_or_refused_in_one_line():
    """A Spark's SSH user is an ordinary member of `docker`: the drop goes through a privileged
    throwaway container of the cluster image, and a refusal fails the stage naming the node and
    a fix, never skipped quietly."""
    from types import SimpleNamespace

    from sparkcluster.up.stages import containers

    prof = profiles.load_profile("testbed").model_copy(update={"drop_page_cache": True})
    facts = {h: HostFacts(h, hostname=h) for h in (HEAD, WORKER)}
    plan = make_plan(make_inventory(), prof, facts, serving=False, replace=False)
    drops = [s for s in plan.steps() if s.action == "drop-page-cache"]
    assert [s.host for s in drops] == [HEAD, WORKER]
    assert drops[0].detail.startswith("docker run --rm --network none -v /proc/sys/vm/drop_caches:/run/drop_caches ")
    assert " || docker run --rm --privileged " in drops[0].detail
    assert plan.image in drops[0].detail and "sudo" not in drops[0].detail
    ok = _Host(CommandResult(WORKER, "x", 0, "", "", 0.1))
    r = SimpleNamespace(plan=plan, cluster=SimpleNamespace(hosts={WORKER: ok}))
    containers.drop_page_cache(r, WORKER)
    assert ok.cmds == [containers.drop_caches_command(plan.image)]
    denied = (
        "docker: permission denied while trying to connect to the Docker daemon socket at unix:///var/run/docker.sock"
    )
    bad = _Host(CommandResult(WORKER, "x", 126, "", denied + "\n", 0.1))
    r.cluster.hosts = {WORKER: bad}
    with pytest.raises(StageError) as e:
        containers.drop_page_cache(r, WORKER)
    f = e.value.failures[0]
    assert f.host == WORKER and "could not drop the page cache" in f.reason and "permission denied" in f.reason
    assert "\n" not in f.reason and "drop_page_cache = false" in f.fix


def test_ctrl_c_while_the_engine_creates_a_container_still_removes_it(monkeypatch):
    """A Ctrl-C that lands while the Engine API creates a container: the engine makes it whatever
    the client does, so the rollback must still hear its ID and remove it. The fake engine makes
    the head's container, then the Ctrl-C arrives, and it answers only once the rollback has begun:
    before, the interrupt ended the call itself, its ID was lost, and the container stayed."""
    import _thread
    import threading

    from sparkcluster.up import bringup

    rolling_back = threading.Event()
    real_rollback = bringup.rollback

    def rollback(r):
        rolling_back.set()
        real_rollback(r)

    monkeypatch.setattr(bringup, "rollback", rollback)
    cluster, go = up_over(monkeypatch, lambda spec: spec.env)
    head = cluster.hosts[HEAD].engine
    made = head.create_container

    def create_then_interrupted(host_config=None, **kw):
        c = made(host_config, **kw)  # the engine has made it
        _thread.interrupt_main()  # Ctrl-C
        assert rolling_back.wait(10), "the rollback never began"
        return c

    head.create_container = create_then_interrupted
    with pytest.raises(KeyboardInterrupt):
        go()
    assert head.live == {} and len(head.removed) == 1
    assert cluster.hosts[WORKER].engine.live == {}


def test_no_create_starts_once_the_rollback_has_begun():
    from sparkcluster.errors import SparkError
    from sparkcluster.up.stages.containers import Created

    created = Created()
    assert created.creating("n", lambda heard: (heard("a"), "a")[1]) == "a"
    assert created.settle(within=1) is True
    with pytest.raises(SparkError, match="rolling back"):
        created.creating("n", lambda heard: "b")
    assert created.containers == {"n": {"a"}}
