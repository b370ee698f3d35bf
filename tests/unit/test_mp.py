"""Executor "mp" (issue 28) from the controller's side and the agents' decisions, fed fakes: the
profile setting, the per-node argv the plan and `--dry-run` carry, the image served as it is, the
version gate, the rendezvous check, the head's reading of the workers' ranks, and the worker's keeper."""

from __future__ import annotations

import json

import pytest
from conftest import make_inventory

from sparkcluster import checks
from sparkcluster.checks import rendezvous
from sparkcluster.checks.preflight import expectations
from sparkcluster.config import flags, lint
from sparkcluster.config import profile as profiles
from sparkcluster.config.images import image_ref
from sparkcluster.container.spec import agent_config, spec_for, uses_ray
from sparkcluster.errors import InputError
from sparkcluster.facts import HostFacts
from sparkcluster.node import ranks
from sparkcluster.up.plan import make_plan

HEAD, WORKER = "spark-head", "spark-worker"
IMAGE_ID = "sha256:" + "ab" * 32


@pytest.fixture(scope="module")
def prof() -> profiles.Profile:
    return profiles.load_profile("testbed-mp")


def facts(head_image=IMAGE_ID, worker_image=IMAGE_ID) -> dict[str, HostFacts]:
    return {
        HEAD: HostFacts(HEAD, hostname=HEAD, image_id=head_image),
        WORKER: HostFacts(WORKER, hostname=WORKER, image_id=worker_image),
    }


def test_the_profile_setting_picks_the_backend_and_ray_stays_the_default(prof):
    assert prof.executor == "mp" and prof.serve.distributed_executor_backend == "mp"
    assert profiles.load_profile("testbed").executor == "ray"
    text = (
        profiles.find("testbed-mp").read_text().replace("[serve]\n", '[serve]\ndistributed_executor_backend = "ray"\n')
    )
    with pytest.raises(InputError):
        profiles.parse(text, "x")


def test_no_ray_anywhere_in_what_the_containers_get(prof):
    inv = make_inventory()
    assert not uses_ray(inv, prof)
    for n in inv.nodes:
        spec = spec_for(inv, prof, n, image_ref(inv, prof))
        assert spec.command == [] and "RAY_memory_usage_threshold" not in spec.env
        cfg = agent_config(inv, n, False, "mp")
        assert cfg["ray_argv"] == [] and cfg["executor"] == "mp" and cfg["head"]["ip"] == str(inv.head.control_ip)
        assert cfg["rank"] == (0 if n.role == "head" else 1)
    assert "RAY_memory_usage_threshold" not in profiles.required_env_names(prof)


def test_the_plan_serves_the_base_image_as_it_is_with_a_rank_per_node(prof):
    inv = make_inventory()
    assert image_ref(inv, prof) == prof.image.ref
    plan = make_plan(inv, prof, facts(worker_image=None), serving=False, replace=False)
    assert plan.build is None and plan.send_to == [WORKER]
    assert not [s for s in plan.steps() if s.action == "ray-version" or s.stage == "ray"]
    master = ["--master-addr", str(inv.head.control_ip), "--master-port", str(inv.cluster.master_port)]
    head = plan.serve.argv
    assert head[head.index("--nnodes") :] == ["--nnodes", "2", "--node-rank", "0", *master]
    [(node, container, argv)] = plan.serve.ranks
    assert node == WORKER and container.endswith(WORKER)
    assert list(argv[argv.index("--nnodes") :]) == ["--nnodes", "2", "--node-rank", "1", *master, "--headless"]
    # --dry-run shows every node's command
    text = plan.render()
    assert "--node-rank 0" in text and "--node-rank 1" in text and "--headless" in text


def test_a_head_without_the_base_image_is_one_line_and_a_fix(prof):
    with pytest.raises(InputError) as e:
        make_plan(make_inventory(), prof, facts(head_image=None), serving=False, replace=False)
    assert "docker pull " + prof.image.ref in e.value.fix


def test_the_version_gate_follows_the_images_vllm(prof):
    old = prof.model_copy(update={"image": prof.image.model_copy(update={"vllm_version": "0.11.0"})})
    items = {r.item for r in flags.refusals(old)}
    assert {"--nnodes", "--node-rank", "--master-addr", "--headless"} <= items
    assert not flags.refusals(prof)
    assert not {r.item for r in flags.refusals(profiles.load_profile("testbed"))} & items


def test_lint_wants_the_backend_of_the_executor(prof):
    inv = make_inventory()
    assert not [p for p in lint.lint(prof, inv) if p.code == "executor-backend"]


def _ctx(prof, inv, facts_=None):
    expect = expectations(inv, prof)
    return checks.Context(inv, facts_ or {n.name: HostFacts(n.name, hostname=n.name) for n in inv.nodes}, {}, expect)


def test_the_rendezvous_check_refuses_loopback_and_wrong_interfaces(prof):
    assert (
        rendezvous.master_problem("127.0.0.1")
        and rendezvous.master_problem("0.0.0.0")
        and not rendezvous.master_problem("198.19.2.1")
    )
    inv = make_inventory()
    ok = [r for r in checks.run_checks(_ctx(prof, inv), {"net.rendezvous"})]
    assert ok and all(r.status == "ok" for r in ok)
    bad = prof.model_copy(update={"env": prof.env.model_copy(update={"forward": {}})})
    ctx = _ctx(bad, inv)
    ctx = checks.Context(
        inv,
        ctx.facts,
        {},
        checks.Expect(
            **{
                **ctx.expect.__dict__,
                "per_host_env": {
                    n.name: {**ctx.expect.per_host_env[n.name], "GLOO_SOCKET_IFNAME": "lo"} for n in inv.nodes
                },
            }
        ),
    )
    got = checks.run_checks(ctx, {"net.rendezvous"})
    assert all(r.status == "fail" and "GLOO_SOCKET_IFNAME is lo" in r.detail for r in got)
    # Ray's checks give way: no Ray in the image to look for, no Ray rows for a ray profile's rendezvous
    assert all(r.status == "skip" for r in checks.run_checks(_ctx(prof, inv), {"image.ray"}))
    ray = checks.run_checks(_ctx(profiles.load_profile("testbed"), inv), {"net.rendezvous"})
    assert all(r.status == "ok" and "--master-addr" not in r.detail for r in ray)


CFG = {
    "rank": 1,
    "report_port": 8297,
    "head": {"name": HEAD, "ip": "198.19.2.1"},
    "peers": [{"name": WORKER, "ip": "198.19.2.2"}],
}


def test_the_head_waits_for_every_worker_agent_then_judges_its_rank():
    gen = "g1"
    assert "does not answer" in ranks.ranks_waiting(CFG, {WORKER: None}, gen)
    assert "not been handed" in ranks.ranks_waiting(CFG, {WORKER: {"rank": {"generation": "old"}}}, gen)
    assert "earlier set" in ranks.ranks_waiting(CFG, {WORKER: {"rank": {"generation": gen, "alive": True}}}, gen)
    assert ranks.ranks_waiting(CFG, {WORKER: {"rank": {"generation": gen, "alive": False}}}, gen) is None
    alive = {WORKER: {"rank": {"rank": 1, "epoch": "e1", "alive": True}}}
    assert ranks.rank_problem(CFG, alive, "e1", 0, 100) == ""
    gone = {WORKER: {"rank": {"rank": 1, "epoch": "e1", "alive": False, "exit": "the container restarted"}}}
    assert "rank 1 on spark-worker exited (the container restarted)" in ranks.rank_problem(CFG, gone, "e1", 0, 100)
    late = {WORKER: {"rank": {"rank": 1, "epoch": "e0", "alive": False}}}
    assert ranks.rank_problem(CFG, late, "e1", 0, 10) == ""  # its agent follows within a look or two
    assert "did not start" in ranks.rank_problem(CFG, late, "e1", 0, ranks.RANK_START_S + 1)
    assert ranks.rank_problem(CFG, {WORKER: None}, "e1", 0, 1000) == ""  # unanswered: memory says unknown


class FakeProc:
    def __init__(self, argv, **kw):
        self.argv, self.pid, self.returncode = argv, 4242, None

    def poll(self):
        return self.returncode

    def wait(self, timeout=None):
        self.returncode = -15
        return self.returncode


def test_the_worker_keeper_runs_its_rank_for_the_heads_set_only(tmp_path, monkeypatch):
    desired, rank_path = tmp_path / "desired.json", tmp_path / "rank.json"
    monkeypatch.setattr(ranks, "DESIRED_PATH", str(desired))
    monkeypatch.setattr(ranks, "RANK_PATH", str(rank_path))
    monkeypatch.setattr(ranks, "SERVE_LOG", str(tmp_path / "log" / "serve.log"))
    monkeypatch.setattr(ranks.subprocess, "Popen", FakeProc)
    monkeypatch.setattr(ranks.os, "killpg", lambda pid, sig: None)
    published = {"generation": "g1", "epoch": "e1", "run": True}
    monkeypatch.setattr(ranks, "head_set", lambda ip, port: published)
    written = []

    class J:
        def write(self, event, **kw):
            written.append(event)

    keeper = ranks.RankKeeper(CFG, J())
    keeper.tick()
    assert keeper.proc is None  # nothing handed yet
    desired.write_text(json.dumps({"generation": "g1", "argv": ["vllm", "serve", "--headless"]}))
    keeper.tick()
    assert keeper.proc.argv[-1] == "--headless" and keeper.report()["epoch"] == "e1" and keeper.report()["alive"]
    keeper.proc.returncode = 1  # the rank dies: never restarted alone
    keeper.tick()
    assert keeper.proc is None and keeper.report() | {"alive": False} == keeper.report() and keeper.exit == 1
    published.update(epoch="e2")  # the head started a new set
    keeper.tick()
    assert keeper.proc is not None and keeper.epoch == "e2"
    published.update(run=False)  # the head stopped its server: the rank goes too
    keeper.tick()
    assert keeper.proc is None and "rank stopped" in written
    # a container restart: that epoch's rank is gone, and said so
    published.update(run=True, epoch="e3")
    keeper.tick()
    again = ranks.RankKeeper(CFG, J())
    assert again.epoch == "e3" and again.exit == "the container restarted"
