"""One judgement of "the container has the right variables" (checks/runtime.env_verdict), and the
three places that apply it agreeing on one broken container: doctor's checks (from `docker
inspect`), the probe stage (from `docker exec env`) and the plan (keep the running containers or
recreate them)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
from conftest import make_inventory
from test_up_plan import WORKER, running_facts

from sparkcluster import checks
from sparkcluster.checks.runtime import env_verdict
from sparkcluster.config import profile as profiles
from sparkcluster.errors import StageError
from sparkcluster.up.plan import make_plan
from sparkcluster.up.stages import probe


def test_the_verdict_names_what_is_missing_different_and_wrong_per_host():
    env = {"A": "1", "B": "2", "VLLM_HOST_IP": "10.0.0.9"}
    assert env_verdict(env, {"A": "1"}, {"VLLM_HOST_IP": "10.0.0.9"}).ok
    v = env_verdict(env, {"A": "1", "B": "3", "C": "4"}, {"VLLM_HOST_IP": "10.0.0.2", "NCCL_IB_HCA": "x"})
    assert (v.missing, v.different) == (("C",), ("B",))
    assert v.per_host == ("VLLM_HOST_IP=10.0.0.9 (want 10.0.0.2)", "NCCL_IB_HCA=(unset) (want x)")
    assert v.reason() == ("missing C; different B; VLLM_HOST_IP=10.0.0.9 (want 10.0.0.2); NCCL_IB_HCA=(unset) (want x)")


@pytest.mark.parametrize("broken", ["forwarded", "per_host"])
def test_checks_probe_and_plan_judge_one_broken_worker_alike(monkeypatch, broken):
    inv, prof = make_inventory(), profiles.load_profile("testbed")
    facts = running_facts(inv, prof)
    assert make_plan(inv, prof, facts, serving=True, replace=False).unchanged  # as made: kept
    c = facts[WORKER].ours[0]
    key = next(iter(prof.forwarded_env())) if broken == "forwarded" else "NCCL_SOCKET_IFNAME"
    env = {**c.env, key: "not-what-was-asked"}
    facts[WORKER].ours[0] = dataclasses.replace(c, env=env)

    # the plan: the worker's container no longer fits, both are recreated
    plan = make_plan(inv, prof, facts, serving=True, replace=False)
    assert not plan.unchanged and [s.node for s in plan.containers] == [inv.head.name, WORKER]

    # doctor's checks: the one check of that kind fails, on the worker only
    expect = checks.Expect(
        forwarded_env=prof.forwarded_env(),
        per_host_env={n.name: profiles.per_host_env(prof, inv, n) for n in inv.nodes},
    )
    got = {(r.id, r.node): r for r in checks.run_checks(checks.Context(inv, facts, {}, expect))}
    cid = "containers.forwarded_env" if broken == "forwarded" else "containers.per_host_env"
    assert got[(cid, WORKER)].status == "fail" and got[(cid, inv.head.name)].status == "ok"
    assert key in got[(cid, WORKER)].detail

    # the probe stage, reading the same environment through `docker exec env`
    monkeypatch.setattr(probe, "env_in_container", lambda r, node, name: env)
    r = SimpleNamespace(plan=SimpleNamespace(profile=prof), inv=inv)
    with pytest.raises(StageError) as e:
        probe.check_env(r, WORKER, c.name)
    assert e.value.failures[0].host == WORKER and key in e.value.failures[0].reason
