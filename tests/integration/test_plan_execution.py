"""Issue 13: the plan is the program. The step ids `up --dry-run --json` prints are exactly the
step events a real `up` then logs (--log-format json), in the same order on each host, from a bare
cluster, on a serving cluster, and when only the server is replaced (a changed API key)."""

from __future__ import annotations

import json

import pytest

from tests.integration.helpers import API_KEY, HF_TOKEN, ours
from tests.testbed import PROFILES as TESTBED_PROFILES

pytestmark = pytest.mark.testbed


def planned(sc, env: dict | None = None) -> list[dict]:
    res = sc("up", "--profile", "testbed-standin", "--dry-run", "--json", timeout=120, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    steps = json.loads(res.stdout)
    assert steps and all(set(s) == {"id", "stage", "host", "description"} for s in steps), steps
    assert all(s["id"] == f"{s['stage']}/{s['host']}/{s['id'].split('/', 2)[2]}" for s in steps)
    assert len({s["id"] for s in steps}) == len(steps), "step ids are unique"
    return steps


def executed(sc, env: dict | None = None) -> list[dict]:
    res = sc("--log-format", "json", "up", "--profile", "testbed-standin", timeout=900, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    events = []
    for line in res.stderr.splitlines():
        # a progress bar may share the line's start with a log line: read from the first brace
        if '"event": "step"' in line:
            events.append(json.loads(line[line.index("{") :]))
    assert API_KEY not in res.stderr and HF_TOKEN not in res.stderr
    return events


def per_host(ids: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for i in ids:
        out.setdefault(i.split("/")[1], []).append(i)
    return out


def assert_same(plan: list[dict], events: list[dict]) -> None:
    assert sorted(e["id"] for e in events) == sorted(s["id"] for s in plan), (plan, events)
    assert per_host([e["id"] for e in events]) == per_host([s["id"] for s in plan])
    # stages run in the printed order
    stages = [e["stage"] for e in events]
    assert stages == sorted(stages, key=[s["stage"] for s in plan].index)
    assert all(e["outcome"] == "done" or e["outcome"].startswith("skipped: ") for e in events), events


@pytest.fixture(scope="module")
def bare(testbed, sc):
    assert sc("down", "--purge-gcs").returncode in (0, 1)
    yield
    sc("down")


def test_bare_cluster_runs_what_the_dry_run_printed(bare, sc):
    plan = planned(sc)
    assert {s["stage"] for s in plan} >= {"preflight", "containers", "ray", "probe", "serve"}
    assert any(s["id"].endswith("/hf-token") for s in plan), "the token file is a step"
    assert any(s["id"].endswith("/ray-head") for s in plan), "the Ray head wait is a step"
    assert_same(plan, executed(sc))


def test_serving_cluster_runs_only_preflight(bare, sc):
    plan = planned(sc)
    assert {s["stage"] for s in plan} == {"preflight"}, plan
    assert_same(plan, executed(sc))


def test_changed_key_stops_the_old_server_as_a_step(bare, sc, tmp_path):
    env_file = tmp_path / ".env"
    env_file.write_text(f"VLLM_API_KEY=sk-rotated-9a8b7c6d5e\nHF_TOKEN={HF_TOKEN}\n")
    env_file.chmod(0o600)
    env = {"SPARKCLUSTER_ENV_FILE": str(env_file)}
    plan = planned(sc, env)
    assert any(s["id"].endswith("/stop-old") for s in plan), plan
    assert not any(s["stage"] == "containers" for s in plan), plan
    assert_same(plan, executed(sc, env))


def test_a_profiles_security_opt_reaches_its_containers(bare, sc, testbed, tmp_path):
    """Issue 51: NVIDIA's Spark recipes run the engine with `--security-opt seccomp=unconfined`; a profile
    that says so gets it in every container, planned and then created (the testbed's engines filter
    with seccomp; they have no AppArmor, tests/testbed/README.md)."""
    folder = tmp_path / "profiles"
    folder.mkdir()
    text = (TESTBED_PROFILES / "testbed-standin.toml").read_text()
    assert "\n[image]" in text
    (folder / "testbed-standin.toml").write_text(
        text.replace("\n[image]", '\nsecurity_opt = ["seccomp=unconfined"]\n\n[image]', 1)
    )
    env = {"SPARKCLUSTER_PROFILES": str(folder)}
    dry = sc("up", "--profile", "testbed-standin", "--dry-run", timeout=120, env=env)
    assert dry.returncode == 0 and "--security-opt=seccomp=unconfined" in dry.stdout, dry.stdout + dry.stderr
    try:
        res = sc("up", "--profile", "testbed-standin", timeout=900, env=env)
        assert res.returncode == 0, res.stdout + res.stderr
        for host in ("spark-head", "spark-worker"):
            (name,) = ours(testbed, host)
            opts = json.loads(
                testbed.docker(host, f"inspect --format '{{{{json .HostConfig.SecurityOpt}}}}' {name}").stdout
            )
            # dockerd adds label=disable itself beside the host's IPC namespace (no SELinux label to share)
            assert "seccomp=unconfined" in opts, (host, opts)
            seccomp = testbed.docker(host, f"exec {name} grep ^Seccomp: /proc/1/status").stdout.split()
            assert seccomp == ["Seccomp:", "0"], (host, seccomp)  # no filter, where Docker's default sets mode 2
    finally:
        sc("down")


def test_down_runs_what_its_dry_run_printed(bare, sc):
    """`down` is steps too: the ids its `--dry-run --json` prints, read from what runs, are the step
    events it then logs, in order, and its dry run changes nothing."""
    if sc("status", "--json", timeout=60).returncode == 3:  # nothing runs: bring one up to take down
        assert sc("up", "--profile", "testbed-standin", timeout=900).returncode == 0
    res = sc("down", "--dry-run", "--json", timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    plan = json.loads(res.stdout)
    assert plan and all(set(s) == {"id", "stage", "host", "description"} for s in plan), plan
    assert any(s["id"].split("/")[2].startswith("deployment:testbed-standin@") for s in plan), plan
    assert sc("status", "--json", timeout=60).returncode != 3, "the dry run took nothing down"
    res = sc("--log-format", "json", "down", timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    events = [json.loads(x[x.index("{") :]) for x in res.stderr.splitlines() if '"event": "step"' in x]
    assert [e["id"] for e in events] == [s["id"] for s in plan], (plan, events)
    assert all(e["outcome"] == "done" for e in events), events
