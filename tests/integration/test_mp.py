"""Executor "mp" (issue 28): vLLM's own multi-node launch, without Ray, on the real engine (vLLM 0.32.0
CPU build), TP=2 across both testbed hosts (`testbed-mp`). One `up` from bare, shared by the read-only
cases (answers, no Ray anywhere, the base image as it is, status), then, in order:

- rank 1 stopped on the worker (SIGSTOP): the head's supervisor catches the wedge and restarts the
  whole set (a new epoch), the worker's agent runs a fresh rank 1, serving again;
- a reboot of the worker (the testbed's knob): its rank cannot rejoin the running set alone, so the
  head restarts the set, serving again with no controller command;
- `doctor --fabric` refused while the set serves, the set untouched;
- `down`: nothing of ours left on either node.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.integration import helpers
from tests.integration.helpers import BASE, CONTAINERS, HEAD, WORKER, journal, ours, sup_state
from tests.integration.helpers import answers as answers_at

# `make test` keeps the bring-up from bare, status and `down` (issue 57); the supervisor's restarts of the set
# are `make test-long`'s (tests/README.md)
pytestmark = pytest.mark.testbed
WORKER_C = CONTAINERS[WORKER]
BASE_IMAGE = "nvcr.io/nvidia/vllm:26.05.post1-py3"
BACK_WITHIN_S = 240  # stop, backoff (5 s), the worker's agent follows within a look, ~40 s load on two cores
RANK1 = "VLLM::Worker_TP1"  # the rank's process title (setproctitle) in the worker container


def answers() -> bool:
    return answers_at(BASE, "testbed-tiny")


def serving_again(testbed, since: float, timeout: float = BACK_WITHIN_S) -> float:
    return helpers.serving_again(
        testbed,
        since,
        timeout,
        tail=lambda: "\n".join(json.dumps(e) for e in journal(testbed)[-12:] + journal(testbed, WORKER)[-6:]),
    )


def rank1_pids(testbed) -> list[str]:
    out = testbed.sh(WORKER, f"pgrep -f '{RANK1}' || true").stdout.split()
    assert out, testbed.sh(WORKER, "ps -eo pid,args").stdout
    return out


@pytest.fixture(scope="module")
def mp_up(testbed, sc):
    sc("down")
    t = time.monotonic()
    res = sc("up", "--profile", "testbed-mp", timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr
    print(f"up --profile testbed-mp from down: {time.monotonic() - t:.1f}s")
    yield
    sc("down")


def test_it_serves_tp2_across_both_hosts_with_no_ray_anywhere(testbed, mp_up):
    assert answers()
    for host, c in CONTAINERS.items():
        procs = testbed.sh(host, f"docker exec {c} ps -eo args").stdout
        assert "vllm serve" in procs, procs
        assert not any(w in procs for w in ("ray start", "raylet", "gcs_server", "RayWorkerProc")), procs
        # the profile's base image as it is: no Ray layer was built
        image = testbed.sh(host, f"docker inspect --format '{{{{.Config.Image}}}}' {c}").stdout.strip()
        assert image == BASE_IMAGE
    worker = testbed.sh(WORKER, f"docker exec {WORKER_C} ps -eo args").stdout
    assert "--headless" in worker and "--node-rank 1" in worker and "--master-addr 198.19.2.1" in worker, worker


def test_status_shows_each_rank_and_no_ray(sc, mp_up):
    res = sc("status", "--json")
    st = json.loads(res.stdout)
    assert res.returncode == 0 and st["state"] == "healthy", st["problems"]
    assert st["ray_nodes"] is None
    assert [n["rank"] for n in st["nodes"]] == ["rank 0 alive", "rank 1 alive"]
    assert "rank 1 alive" in sc("status").stdout


@pytest.mark.long  # `make test-long`: `make test` keeps this module's other cases (tests/README.md, issue 57)
def test_a_stopped_rank_restarts_the_whole_set(testbed, sc, mp_up):
    before = sup_state(testbed)
    pids = rank1_pids(testbed)
    t = time.time()
    try:
        testbed.sh(WORKER, "kill -STOP " + " ".join(pids))
        took = serving_again(testbed, t)
    finally:
        testbed.sh(WORKER, "kill -CONT " + " ".join(pids) + " 2>/dev/null || true", check=False)
    wedges = [e for e in journal(testbed) if (e["event"], e.get("kind")) == ("verdict", "wedged") and e["ts"] > t]
    assert wedges, journal(testbed)[-10:]
    after = sup_state(testbed)
    assert len(after["restarts"]) == 1 and after["epoch"] != before["epoch"]
    assert set(rank1_pids(testbed)).isdisjoint(pids)  # the worker's agent ran a fresh rank for the new set
    assert any(e["event"] == "rank started" and e["ts"] > t for e in journal(testbed, WORKER))
    print(f"mp: wedge to serving again: {took:.0f}s")


@pytest.mark.long  # `make test-long`: `make test` keeps this module's other cases (tests/README.md, issue 57)
def test_a_worker_reboot_brings_its_rank_back_through_a_new_set(testbed, sc, mp_up):
    t = time.time()
    testbed.reboot(WORKER)
    took = serving_again(testbed, t)
    assert ours(testbed, WORKER) == [WORKER_C]
    # the head's own server dies with its peer's connection, or its rank is seen gone: either way the set
    causes = [
        e for e in journal(testbed) if e["event"] == "verdict" and e.get("kind") in ("dead", "wedged") and e["ts"] > t
    ]
    assert causes, journal(testbed)[-10:]
    assert any(e["event"] == "rank started" and e["ts"] > t for e in journal(testbed, WORKER))
    res = sc("status", "--json")
    assert res.returncode == 0, res.stdout
    print(f"mp: worker reboot to serving again: {took:.0f}s")


def test_the_fabric_test_is_refused_while_it_serves(testbed, sc, mp_up):
    """`doctor --fabric` while this set serves (test_fabric's other cases run with nothing serving: the
    refusal is checked here, on a cluster that serves anyway, rather than after an `up` of its own)."""
    from tests.integration.test_fabric import fabric, nothing_left

    got = fabric(sc, "testbed-mp")
    run = got[("fabric.run", f"{HEAD}+{WORKER}")]
    assert run["status"] == "fail" and "vllm serve" in run["detail"], got
    assert "sparkcluster down" in run["fix"]
    assert answers()  # still serving
    nothing_left(testbed)


def test_down_leaves_nothing(testbed, sc, mp_up):
    res = sc("down")
    assert res.returncode == 0, res.stdout + res.stderr
    assert ours(testbed, HEAD) == [] and ours(testbed, WORKER) == []
