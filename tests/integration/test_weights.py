"""Issue 15 on the testbed: the weights stage fetches the model once from the testbed hub, copies it
head->worker, verifies it, and the containers serve it offline; the faults.

Needs the lead's wiring: the Testbed starts `tests.testbed.hub.start_hub()` (stops it with
`stop_hub(pid)`), writes `hf_endpoint = "http://198.18.0.1:3142"` into the inventory, and no longer
pre-places the tiny model (`place_model`)."""

from __future__ import annotations

import hashlib
import re
import time
from pathlib import Path

import pytest

from sparkcluster.movement import hfcache
from tests.integration.helpers import account, hf_cache
from tests.testbed import PROFILES as TESTBED_PROFILES
from tests.testbed import artifacts
from tests.testbed.hub import GATED, GRANTED_TOKEN, HUB_IP, HUB_PORT, TINY, knobs, stats

pytestmark = pytest.mark.testbed
HEAD, WORKER = "spark-head", "spark-worker"
HUB = f"http://{HUB_IP}:{HUB_PORT}"


def cache() -> str:
    return hf_cache()  # the SSH user's, from the testbed's facts file


def repo_dir() -> str:
    return f"{cache()}/hub/{hfcache.repo_folder(TINY)}"


def model_size() -> int:
    return stats(HUB)["repos"][TINY]["size"]


def config_size(testbed) -> int:
    """The tiny model's config.json as the hub serves it."""
    from tests.testbed import artifacts

    return (artifacts.model_dir() / "config.json").stat().st_size


def wipe(testbed, *hosts: str) -> None:
    for h in hosts or (HEAD, WORKER):
        testbed.sh(h, f"rm -rf {cache()}/hub")


def snapshot_ok(testbed, host: str) -> bool:
    """Every file of the tiny model linked in the host's snapshot, with the model's bytes."""
    sha = stats(HUB)["repos"][TINY]["sha"]
    for f in sorted(artifacts.model_dir().iterdir()):
        if f.name.startswith("."):
            continue
        got = testbed.sh(host, f"sha256sum {repo_dir()}/snapshots/{sha}/{f.name}", check=False).stdout.split()
        if not got or got[0] != hashlib.sha256(f.read_bytes()).hexdigest():
            return False
    return True


@pytest.fixture
def hub_reset():
    knobs(HUB, reset=True)
    yield
    knobs(HUB, reset=True)


def not_the_users(testbed) -> dict[str, list[str]]:
    """Per host, the files in the SSH user's HF cache it does not own (the user's own `hf` could
    not update them): sparkcluster leaves none, whoever wrote them."""
    uid, out = account()["uid"], {}
    for h in (HEAD, WORKER):
        got = testbed.sh(h, f"find {cache()} ! -uid {int(uid)} -printf '%u %p\\n' 2>/dev/null | head -5").stdout.split(
            "\n"
        )
        if any(got):
            out[h] = [x for x in got if x]
    return out


@pytest.fixture
def down_first(sc):
    sc("down")


def test_pull_fetches_once_replicates_and_then_moves_nothing(testbed, sc, hub_reset, down_first):
    wipe(testbed)
    res = sc("weights", "pull", "--profile", "testbed", timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert stats(HUB)["bytes_served"] == model_size()  # once, not once per node
    assert "sent to spark-worker" in res.stdout
    assert snapshot_ok(testbed, HEAD) and snapshot_ok(testbed, WORKER)
    assert not_the_users(testbed) == {}  # the download container and the receiver wrote as the SSH user
    knobs(HUB, bytes_served=0)
    t = time.monotonic()
    res = sc("weights", "pull", "--profile", "testbed")
    assert res.returncode == 0 and "complete and verified on every node" in res.stdout
    assert stats(HUB)["bytes_served"] == 0
    st = sc("weights", "status")
    assert st.stdout.count("complete, verified") == 2, st.stdout
    assert time.monotonic() - t < 30


def test_up_from_empty_caches_serves_offline(testbed, sc, hub_reset, down_first):
    wipe(testbed)
    res = sc("up", "--profile", "testbed", timeout=900)
    try:
        assert res.returncode == 0, res.stdout + res.stderr
        # the weights once, plus config.json, which preflight reads from the hub while no cache holds it
        # (issue 52: the model's minimum KV cache is computed from it before anything is pulled)
        assert stats(HUB)["bytes_served"] == model_size() + config_size(testbed)
        assert re.search(r"weights.*sent to spark-worker", res.stderr + res.stdout, re.S)
        for h in (HEAD, WORKER):
            name = testbed.sh(h, "docker ps --format '{{.Names}}'").stdout.split()[0]
            assert testbed.sh(h, f"docker exec {name} printenv HF_HUB_OFFLINE").stdout.strip() == "1"
        assert not_the_users(testbed) == {}  # nor did the serving containers leave root's files there
    finally:
        sc("down")


def test_a_corrupted_file_on_the_worker_is_replaced(testbed, sc, hub_reset, down_first):
    assert sc("weights", "pull", "--profile", "testbed").returncode == 0
    blob = testbed.sh(WORKER, f"ls -S {repo_dir()}/blobs | head -1").stdout.strip()
    testbed.sh(WORKER, f"printf 'X' | dd of={repo_dir()}/blobs/{blob} bs=1 seek=100 conv=notrunc status=none")
    knobs(HUB, bytes_served=0)
    res = sc("weights", "pull", "--profile", "testbed")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "sent to spark-worker" in res.stdout and stats(HUB)["bytes_served"] == 0
    assert snapshot_ok(testbed, WORKER)


def test_the_hub_failing_mid_file_then_resuming(testbed, sc, hub_reset, down_first):
    wipe(testbed)
    knobs(HUB, fail_after=1 << 16, fail_times=1000)  # every attempt cut: the client's retries give up
    res = sc("weights", "pull", "--profile", "testbed", timeout=600)
    assert res.returncode != 0
    assert "download" in res.stderr and "next run resumes" in res.stderr
    assert not snapshot_ok(testbed, HEAD)  # nothing half-downloaded is linked into the snapshot
    knobs(HUB, fail_times=0, bytes_served=0)
    res = sc("weights", "pull", "--profile", "testbed", timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert stats(HUB)["bytes_served"] <= model_size()  # resumed, not started over
    assert snapshot_ok(testbed, HEAD) and snapshot_ok(testbed, WORKER)


def _profile(tmp_path: Path, **changes: str) -> Path:
    text = (TESTBED_PROFILES / "testbed.toml").read_text()
    for k, v in changes.items():
        text = (
            re.sub(rf"(?m)^{k} = .*$", f'{k} = "{v}"', text)
            if re.search(rf"(?m)^{k} = ", text)
            else text.replace("served_name =", f'{k} = "{v}"\nserved_name =', 1)
        )
    d = tmp_path / "profiles"
    d.mkdir(exist_ok=True)
    (d / "tb-weights.toml").write_text(text)
    return d


@pytest.mark.parametrize(
    "changes,words",
    [
        ({"model": "sparkcluster/no-such-model"}, "does not exist"),
        ({"revision": "no-such-branch"}, "revision 'no-such-branch' does not exist"),
        ({"model": GATED}, "has no access"),  # the suite's HF_TOKEN is not granted
    ],
)
def test_bad_input_is_one_line_before_anything_moves(testbed, sc, tmp_path, hub_reset, changes, words):
    env = {"SPARKCLUSTER_PROFILES": str(_profile(tmp_path, **changes))}
    res = sc("weights", "pull", "--profile", "tb-weights", env=env)
    assert res.returncode != 0 and words in res.stderr, res.stderr
    assert "fix:" in res.stderr and stats(HUB)["bytes_served"] == 0
    if changes.get("model") == GATED:
        assert f"{HUB}/{GATED}" in res.stderr


def test_gated_with_a_granted_token(testbed, sc, tmp_path, hub_reset):
    env_file = tmp_path / ".env"
    env_file.write_text(f"HF_TOKEN={GRANTED_TOKEN}\n")
    env_file.chmod(0o600)
    env = {"SPARKCLUSTER_PROFILES": str(_profile(tmp_path, model=GATED)), "SPARKCLUSTER_ENV_FILE": str(env_file)}
    res = sc("weights", "pull", "--profile", "tb-weights", env=env, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert GRANTED_TOKEN not in res.stdout + res.stderr


def test_rm_removes_from_every_node_and_down_never_does(testbed, sc, hub_reset):
    assert sc("weights", "pull", "--profile", "testbed").returncode == 0
    sc("down")
    assert testbed.sh(WORKER, f"test -d {repo_dir()}", check=False).returncode == 0
    res = sc("weights", "rm", TINY, "--yes")
    assert res.returncode == 0 and res.stdout.count("freed") == 2, res.stdout + res.stderr
    for h in (HEAD, WORKER):
        assert testbed.sh(h, f"test -d {repo_dir()}", check=False).returncode != 0
