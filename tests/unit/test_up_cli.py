"""`up --dry-run --json` prints the plan's steps as JSON, masked; a real run's step events reach
stderr with --log-format json without -v (no host needed: the plan comes from fake facts)."""

from __future__ import annotations

import json

import pytest
from conftest import make_inventory

from sparkcluster import log, redact
from sparkcluster.cli import main as cli_main
from sparkcluster.facts import HostFacts
from sparkcluster.monitor.planned import planned
from sparkcluster.steps import walk
from sparkcluster.steps.base import Step
from sparkcluster.up import bringup
from sparkcluster.up.plan import make_plan
from tests.testbed import PROFILES as TESTBED_PROFILES

SECRET = "hf_upCLIsecret1122334455"


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("SPARKCLUSTER_PROFILES", str(TESTBED_PROFILES))  # the testbed's, nothing of yours
    envf = tmp_path / ".env"
    envf.write_text(f"HF_TOKEN={SECRET}\nVLLM_API_KEY=sk-upcli-99\n")
    envf.chmod(0o600)
    monkeypatch.setenv("SPARKCLUSTER_ENV_FILE", str(envf))
    inv = make_inventory()

    def fake_run(
        inventory,
        prof,
        secrets,
        progress,
        *,
        monitoring,
        dry_run=False,
        offline=False,
        replace=False,
        beside=False,
        command="up",
        node=None,
    ):
        assert dry_run and monitoring is planned  # the CLI composes monitoring's silence around `up`
        facts = {n.name: HostFacts(n.name, hostname=n.name) for n in inv.nodes}
        return make_plan(inv, prof, facts, serving=False, replace=replace, secret_names=secrets)

    monkeypatch.setattr(bringup, "run", fake_run)
    monkeypatch.setattr(cli_main.Invocation, "inventory", lambda self: inv)
    yield
    with redact._lock:
        redact._values.discard(SECRET)


def test_dry_run_json_lists_the_steps(env, capsys):
    rc = cli_main.main(["up", "--profile", "testbed", "--dry-run", "--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    steps = json.loads(out.out)
    assert steps[0] == {
        "id": "preflight/spark-head/facts",
        "stage": "preflight",
        "host": "spark-head",
        "description": "facts and checks: one read-only probe script, then path-MTU pings",
    }
    assert any(s["id"] == "serve/spark-worker/hf-token" for s in steps)
    assert SECRET not in out.out + out.err


def test_json_without_dry_run_is_a_usage_error(env, capsys):
    assert cli_main.main(["up", "--profile", "testbed", "--json"]) == 2


def test_step_events_reach_stderr_in_json_without_verbose(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    log.configure(level="warning", fmt="json")
    walk.event(Step("serve", "spark-head", "start", "start vllm serve"), "done", 1.5)
    log.get("sparkcluster.other").info("not at this level")
    lines = [json.loads(x) for x in capsys.readouterr().err.splitlines() if x.startswith("{")]
    assert [(d["event"], d["id"], d["outcome"]) for d in lines] == [("step", "serve/spark-head/start", "done")]
    log.configure(level="warning", fmt="text")
