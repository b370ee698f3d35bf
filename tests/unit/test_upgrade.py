"""`upgrade` and `rollback` (issue 39 item 5): the plan (every stage, the rollback included, printed
before anything moves), the decision (canary changed, probe failed, speed below the bound -> rolled
back with the reason), and pruning only once the new serve is good. Hosts are never touched: the steps'
actions that reach a host or the endpoint are replaced by recorders."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from conftest import make_inventory

from sparkcluster.cli import main as cli_main
from sparkcluster.cli.up_cmd import run_up
from sparkcluster.config import profile as profiles
from sparkcluster.deployment import known_good
from sparkcluster.errors import InputError, LockHeld
from sparkcluster.facts import HostFacts
from sparkcluster.monitor.planned import planned
from sparkcluster.node import canary
from sparkcluster.remote import lock
from sparkcluster.remote.fanout import ConnectedHosts
from sparkcluster.remote.result import CommandResult
from sparkcluster.steps.walk import StageProgress
from sparkcluster.up import bringup
from sparkcluster.up.plan import make_plan
from sparkcluster.upgrade import upgrade
from tests.testbed import PROFILES as TESTBED_PROFILES

HEAD, WORKER = "spark-head", "spark-worker"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
NEW_IMAGE = "sparkcluster-testbed/vllm-standin:0.22"
GOOD = [canary.Answer(p, "Paris is", (1, 2, 3)) for p in canary.PROMPTS]


@pytest.fixture
def inv():
    return make_inventory()


@pytest.fixture
def prof() -> profiles.Profile:
    return profiles.load_profile("testbed-standin")


def record(prof, *, at="2026-11-20T10:00:00Z", base=None, revision=COMMIT, answers=GOOD, tok_s=50.0):
    return known_good.GoodRecord(
        deployment=f"{prof.name}@{HEAD}+{WORKER}",
        at=at,
        profile=prof.name,
        profile_hash="h",
        image="img",
        vllm_version="0.21.0",
        model=prof.model,
        model_revision=revision,
        nodes={HEAD: known_good.NodeRecord(), WORKER: known_good.NodeRecord()},
        base_image=base or prof.image.ref,
        canary=known_good.answers_json(answers) if answers else [],
        canary_tok_s=tok_s if answers else 0.0,
    )


# ---- the cluster lock, taken for real on this machine -------------------------------------------------


class LocalProcess:
    """The lock command run here with bash: it holds its flock until its stdin closes, as over SSH."""

    def __init__(self, name: str, cmd: str):
        self.name, self.cmd = name, cmd
        self.p = subprocess.Popen(
            ["bash", "-c", cmd], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )

    def stderr_lines(self):
        for line in self.p.stderr:
            yield line.rstrip("\n")

    def close(self):
        if not self.p.stdin.closed:
            self.p.stdin.close()
        self.p.wait(10)

    def wait(self) -> CommandResult:
        self.close()
        return CommandResult(self.name, self.cmd, self.p.returncode, "", self.p.stderr.read(), 0.0)


class LockHost:
    """A node whose lock lives in its own folder here (each node of a pair has its own /tmp)."""

    def __init__(self, name: str):
        self.name = name

    def start(self, cmd: str, timeout: float = 0) -> LocalProcess:
        return LocalProcess(self.name, cmd.replace(lock.LOCK_DIR, f"{lock.LOCK_DIR}-{self.name}"))

    def close(self):
        pass


@pytest.fixture(autouse=True)
def local_locks(tmp_path, monkeypatch):
    """`ConnectedHosts.connect` gives nodes whose lock command runs here, in a folder of the test's."""
    if shutil.which("flock") is None:
        pytest.skip("flock (util-linux) not installed")
    monkeypatch.setattr(lock, "LOCK_DIR", str(tmp_path / "locks"))
    # no gateway in front (its hold is test_gateway_hold's subject)
    monkeypatch.setattr(upgrade, "gateway_for", lambda inv, deployment: None)
    monkeypatch.setattr(
        ConnectedHosts,
        "connect",
        classmethod(lambda cls, inv, nodes=None: cls(inv, {n.name: LockHost(n.name) for n in inv.nodes})),
    )


def another_up(inv, prof) -> str:
    """What a concurrent `up` of the deployment meets when it takes the nodes' locks: "" when it gets them."""
    target = upgrade.deployments.target(inv, prof, ())
    try:
        with ConnectedHosts.connect(target) as cluster, lock.NodeLocks(cluster, target, f"up --profile {prof.name}"):
            return ""
    except LockHeld as e:
        return e.message


# ---- the plan ---------------------------------------------------------------------------------------


def test_the_dry_run_lists_every_stage_the_rollback_included(inv, prof):
    known_good.append(inv.cluster.name, record(prof))
    plan, new, old, good = upgrade.plan_upgrade(inv, prof, NEW_IMAGE)
    stages = list(dict.fromkeys(s.stage for s in plan.steps()))
    assert stages == ["hold", "baseline", "up", "canary", "bench", "prune", "rollback", "release"]
    assert new.image.ref == NEW_IMAGE and old.image.ref == prof.image.ref
    ids = [s.id for s in plan.steps()]
    assert f"up/{HEAD}/new" in ids and f"canary/{HEAD}/probe" in ids and f"canary/{HEAD}/answers" in ids
    assert f"bench/{HEAD}/speed" in ids and f"rollback/{HEAD}/up-good" in ids
    # the old image is pruned from both nodes only once good; the new one removed only on a rollback
    old_ref = upgrade.image_ref(inv, old)
    new_ref = upgrade.image_ref(inv, new)
    prune = {s.id: s for s in plan.steps() if s.stage == "prune"}
    assert {f"prune/{n}/rmi-{old_ref}" for n in (HEAD, WORKER)} <= set(prune)
    assert all(s.when == "the canary and the bench passed" for s in prune.values())
    gone = [s for s in plan.steps() if s.stage == "rollback" and s.action == f"rmi-{new_ref}"]
    assert {s.host for s in gone} == {HEAD, WORKER} and all("failed" in s.when for s in gone)
    text = plan.render()
    assert "[rollback]" in text and "only if any step of the new serve failed" in text
    assert "only if a gateway fronts the deployment" in text
    assert [x["id"] for x in plan.as_json()] == ids


def test_a_revision_upgrade_prunes_the_old_revisions_files_once_good(inv, prof):
    known_good.append(inv.cluster.name, record(prof))
    other = "f" * 40
    plan, new, old, _ = upgrade.plan_upgrade(inv, prof, revision=other)
    assert new.revision == other and new.image.ref == old.image.ref
    rm = [s for s in plan.steps() if s.stage == "prune" and s.action == f"rm-{COMMIT[:12]}"]
    assert {s.host for s in rm} == {HEAD, WORKER}
    assert not [s for s in plan.steps() if s.stage == "prune" and s.action.startswith("rmi-")]


def test_an_upgrade_needs_a_good_serve_to_return_to(inv, prof):
    with pytest.raises(InputError, match="no good serve"):
        upgrade.plan_upgrade(inv, prof, NEW_IMAGE)
    known_good.append(inv.cluster.name, record(prof))
    with pytest.raises(InputError, match="already has image"):
        upgrade.plan_upgrade(inv, prof, prof.image.ref)
    with pytest.raises(InputError, match="names no tag"):
        upgrade.plan_upgrade(inv, prof, "sparkcluster-testbed/vllm-standin")


# ---- the decision (pure) ----------------------------------------------------------------------------


def test_the_decision_names_why():
    stored = canary.CanaryRecord("d", "p", "t", True, GOOD)
    changed = canary.compare(stored, [canary.Answer(a.prompt, "Lyon", (9,)) for a in GOOD])
    same = canary.compare(stored, GOOD)
    assert upgrade.judge() == ""
    assert upgrade.judge(verdict=same, tok_s=45.0, good_tok_s=50.0) == ""
    assert upgrade.judge(up_failed="stage 'serve' failed").startswith("up failed")
    assert upgrade.judge(probe="/health answers 503") == "the probe failed: /health answers 503"
    assert "canary answers changed" in upgrade.judge(verdict=changed)
    assert "below 80%" in upgrade.judge(verdict=same, tok_s=30.0, good_tok_s=50.0)
    assert upgrade.judge(tok_s=30.0, good_tok_s=0.0) == ""  # nothing to compare with: not a reason
    nondet = canary.compare(canary.CanaryRecord("d", "p", "t", False, GOOD), [canary.Answer(GOOD[0].prompt, "x")])
    assert upgrade.judge(verdict=nondet) == ""  # a model that does not repeat itself: told, never refused


def test_rollback_returns_to_the_newest_other_serve(prof):
    a = record(prof, at="2026-11-18T00:00:00Z", base="repo/x:1")
    b = record(prof, at="2026-11-19T00:00:00Z", base="repo/x:2")
    b2 = record(prof, at="2026-11-20T00:00:00Z", base="repo/x:2")
    assert upgrade.rollback_target([a, b, b2], a.deployment) == a
    assert upgrade.rollback_target([b2], a.deployment) is None
    back = upgrade.profile_at(prof, a)
    assert back.image.ref == "repo/x:1" and back.revision == COMMIT
    assert upgrade.profile_at(prof, a, pin=False).revision == prof.revision  # an image upgrade keeps the profile's


# ---- the walk ---------------------------------------------------------------------------------------


class Calls:
    def __init__(self, monkeypatch, *, probe="", answers=GOOD, tok_s=48.0, up_fails=""):
        self.ups, self.removed, self.others = [], [], []

        def bring_up(r, p, command):
            self.ups.append(p.image.ref)
            self.others.append(another_up(r.inv, p))  # a concurrent `up` while this one runs
            if up_fails and p.image.ref == NEW_IMAGE:
                raise upgrade.SparkError(up_fails)
            known_good.append(r.inv.cluster.name, record(p, at=known_good.now_utc(), base=p.image.ref, answers=()))
            return f"serving {p.image.ref}"

        def probe_http(r):
            if probe:
                raise upgrade.SparkError(probe)
            return "answers"

        monkeypatch.setattr(upgrade, "bring_up", bring_up)
        monkeypatch.setattr(upgrade, "_address", lambda r, p: ("198.18.0.2", 8000))
        monkeypatch.setattr(upgrade, "ask_probe", probe_http)
        monkeypatch.setattr(upgrade.endpoint, "ask_canary", lambda *a, **k: list(answers))
        monkeypatch.setattr(upgrade.endpoint, "ask_speed", lambda *a, **k: tok_s)
        monkeypatch.setattr(
            upgrade, "remove_image", lambda r, n, ref: self.removed.append((n, ref)) or f"removed {ref}"
        )


def _upgrade(inv, prof):
    return upgrade.upgrade(inv, prof, {}, StageProgress(), up=run_up, image=NEW_IMAGE)


@pytest.mark.parametrize(
    "fault, why",
    [
        (dict(answers=[canary.Answer(a.prompt, "garbled", (7, 7)) for a in GOOD]), "canary answers changed"),
        (dict(probe="/health answers nothing"), "the probe failed: /health answers nothing"),
        (dict(tok_s=10.0), "below 80%"),
        (dict(up_fails="stage 'serve' failed on spark-head"), "up failed: stage 'serve' failed"),
    ],
)
def test_a_bad_new_serve_is_rolled_back_with_the_reason(inv, prof, monkeypatch, fault, why):
    known_good.append(inv.cluster.name, record(prof))
    calls = Calls(monkeypatch, **fault)
    with pytest.raises(upgrade.UpgradeRefused, match="refused and rolled back") as e:
        _upgrade(inv, prof)
    assert why in e.value.message
    assert calls.ups == [NEW_IMAGE, prof.image.ref]  # the new serve, then the last good one again
    new_ref = upgrade.image_ref(inv, upgrade.with_image(prof, NEW_IMAGE))
    assert sorted(calls.removed) == [(HEAD, new_ref), (WORKER, new_ref)]  # the new image only; the old kept
    history = known_good.load(inv.cluster.name)
    assert all(r.base_image == prof.image.ref for r in history)  # nothing left of the new serve ...
    (outcome,) = known_good.load_outcomes(inv.cluster.name)  # ... but the record of why
    assert outcome.outcome == "rolled back" and why in outcome.reason and outcome.image == NEW_IMAGE


def test_one_lock_is_held_across_the_upgrade_and_its_rollback(inv, prof, monkeypatch):
    # the canary fails: the new `up`, the judgement and the rollback's `up` run under one lock, which
    # refuses a concurrent `up` at each of them, naming the upgrade; it is released at the end
    known_good.append(inv.cluster.name, record(prof))
    calls = Calls(monkeypatch, answers=[canary.Answer(a.prompt, "garbled", (7, 7)) for a in GOOD])
    between = []
    answers = upgrade.endpoint.ask_canary
    monkeypatch.setattr(
        upgrade.endpoint, "ask_canary", lambda *a, **k: between.append(another_up(inv, prof)) or answers()
    )
    with pytest.raises(upgrade.UpgradeRefused):
        _upgrade(inv, prof)
    assert calls.ups == [NEW_IMAGE, prof.image.ref]
    assert len(calls.others) == 2 and between
    for said in calls.others + between:
        assert "is locked by" in said and f"(upgrade --profile {prof.name})" in said, said
    assert another_up(inv, prof) == ""  # released with the upgrade


def test_an_upgrade_does_not_start_while_another_run_holds_the_nodes(inv, prof, monkeypatch):
    known_good.append(inv.cluster.name, record(prof))
    calls = Calls(monkeypatch)
    target = upgrade.deployments.target(inv, prof, ())
    with ConnectedHosts.connect(target) as cluster, lock.NodeLocks(cluster, target, "up --profile other"):
        with pytest.raises(LockHeld, match=r"\(up --profile other\)"):
            _upgrade(inv, prof)
        known_good.append(inv.cluster.name, record(prof, at="2026-11-21T10:00:00Z", base=NEW_IMAGE))
        with pytest.raises(LockHeld, match=r"\(up --profile other\)"):
            upgrade.rollback(inv, prof, {}, StageProgress(), up=run_up)
    assert calls.ups == []  # nothing moved


def test_the_ups_inside_an_upgrade_take_no_lock_of_their_own(inv, prof, monkeypatch):
    seen = []
    r = upgrade.UpgradeRun(inv, (), prof, prof, record(prof), {}, StageProgress(), lambda *a, **k: seen.append(k))
    upgrade.bring_up(r, prof, "upgrade --profile x")
    assert seen[0]["locked"] is True and seen[0]["command"] == "upgrade --profile x"


def test_a_good_new_serve_is_kept_and_only_then_the_old_image_pruned(inv, prof, monkeypatch):
    known_good.append(inv.cluster.name, record(prof))
    calls = Calls(monkeypatch, tok_s=47.0)
    said = _upgrade(inv, prof)
    assert "now serves" in said and calls.ups == [NEW_IMAGE]
    # the cluster image sparkcluster built and sent; the base the owner pulled onto the head stays
    assert sorted(calls.removed) == [(HEAD, upgrade.image_ref(inv, prof)), (WORKER, upgrade.image_ref(inv, prof))]
    newest = known_good.load(inv.cluster.name)[-1]
    assert newest.base_image == NEW_IMAGE and newest.canary_tok_s == 47.0 and newest.canary
    assert known_good.load_outcomes(inv.cluster.name)[-1].outcome == "kept"


def test_the_baseline_is_measured_on_the_serving_deployment_when_the_record_has_none(inv, prof, monkeypatch):
    known_good.append(inv.cluster.name, record(prof, answers=()))
    Calls(monkeypatch, tok_s=40.0)
    _upgrade(inv, prof)
    first = [r for r in known_good.load(inv.cluster.name) if r.base_image == prof.image.ref][-1]
    assert first.canary and first.canary_tok_s == 40.0 and first.canary_deterministic


def test_rollback_on_request_returns_to_the_last_other_good_serve(inv, prof, monkeypatch):
    known_good.append(inv.cluster.name, record(prof, at="2026-11-19T00:00:00Z"))
    known_good.append(inv.cluster.name, record(prof, at="2026-11-20T00:00:00Z", base=NEW_IMAGE))
    calls = Calls(monkeypatch)
    plan = upgrade.rollback(inv, prof, {}, StageProgress(), up=run_up, dry_run=True)
    assert [s.stage for s in plan.steps()] == ["hold", "rollback", "rollback", "release"]
    assert calls.ups == []  # a dry run moves nothing
    said = upgrade.rollback(inv, prof, {}, StageProgress(), up=run_up)
    assert calls.ups == [prof.image.ref] and "again" in said
    assert known_good.load_outcomes(inv.cluster.name)[-1].outcome == "rollback"


# ---- the commands -----------------------------------------------------------------------------------


@pytest.fixture
def cli_env(tmp_path, monkeypatch, inv):
    envf = tmp_path / ".env"
    envf.write_text("HF_TOKEN=hf_upgradeCLIsecret99887766\nVLLM_API_KEY=sk-upgrade-cli-42\n")
    envf.chmod(0o600)
    monkeypatch.setenv("SPARKCLUSTER_ENV_FILE", str(envf))
    monkeypatch.setenv("SPARKCLUSTER_PROFILES", str(TESTBED_PROFILES))  # the testbed's, nothing of yours

    def dry_up(inventory, prof, secrets, progress, *, monitoring, dry_run=False, node=None, **kw):
        assert dry_run  # a dry run of the upgrade is a dry run of its up, nothing more
        assert monitoring is planned  # the ups inside an upgrade are silenced as `up` is
        facts = {n.name: HostFacts(n.name, hostname=n.name) for n in inv.nodes}
        return make_plan(inv, prof, facts, serving=False, replace=False, secret_names=secrets)

    monkeypatch.setattr(bringup, "run", dry_up)
    monkeypatch.setattr(cli_main.Invocation, "inventory", lambda self: inv)
    return cli_main


def test_upgrade_dry_run_prints_the_new_ups_own_plan_nested(cli_env, inv, prof, capsys):
    known_good.append(inv.cluster.name, record(prof))
    assert cli_env.main(["upgrade", "--profile", prof.name, "--image", NEW_IMAGE, "--dry-run"]) == 0
    out = capsys.readouterr().out
    for stage in ("[hold]", "[baseline]", "[up]", "[canary]", "[bench]", "[prune]", "[rollback]", "[release]"):
        assert stage in out, out
    assert "      [image]" in out and "      [serve]" in out  # the new up's distribution and serve, nested
    assert "hf_upgradeCLIsecret" not in out and "sk-upgrade-cli" not in out
    assert cli_env.main(["upgrade", "--profile", prof.name, "--image", NEW_IMAGE, "--dry-run", "--json"]) == 0
    steps = json.loads(capsys.readouterr().out)
    nested = [s for s in steps if s.get("within") == f"up/{HEAD}/new"]
    assert nested and {s["stage"] for s in nested} >= {"image", "serve"}


def test_upgrade_without_a_good_serve_is_a_usage_error_with_the_fix(cli_env, prof, capsys):
    assert cli_env.main(["upgrade", "--profile", prof.name, "--image", NEW_IMAGE]) == 2
    err = capsys.readouterr().err
    assert "no good serve" in err and f"fix: sparkcluster up --profile {prof.name}" in err


def test_rollback_history_lists_the_serves_and_the_upgrades(cli_env, inv, prof, capsys):
    known_good.append(inv.cluster.name, record(prof))
    known_good.note_outcome(
        inv.cluster.name,
        known_good.UpgradeOutcome("d", "2026-11-21T00:00:00Z", NEW_IMAGE, COMMIT, "rolled back", "the probe failed"),
    )
    assert cli_env.main(["rollback", "--history"]) == 0
    out = capsys.readouterr().out
    assert f"good  2026-11-20T10:00:00Z {prof.name}@" in out and "canary 50.0 tok/s" in out
    assert f"{NEW_IMAGE}@{COMMIT[:12]} rolled back: the probe failed" in out


def test_an_on_demand_profile_is_refused_before_anything_moves(prof):
    from sparkcluster.errors import InputError

    standby = prof.model_copy(update={"on_demand": prof.on_demand.model_copy(update={"enabled": True})})
    with pytest.raises(InputError, match="runs on demand") as got:
        upgrade.refuse_on_demand(standby)
    assert "enabled = false" in got.value.fix
    upgrade.refuse_on_demand(prof)  # served as usual: nothing refused
