"""Issue 24 on the testbed, with the REAL vLLM engine: every repository a profile needs is staged on
every node before any container starts, and served offline with the hub stopped; and the RoCE GID
index differing between the nodes and moving between two `up`s (issue 35): still serving, with no
NCCL_IB_GID_INDEX pinned in any rank's environment (NCCL finds each HCA's GID at every start).

The cases run against a hub of their own (the testbed's hub code, in this process, on the
controller's LAN address and another port), so stopping it leaves the testbed's hub alone. Its repos
include a separate tokenizer repository and a draft model (tests/testbed/hub).

The tiny Llama cannot act as its own speculative-decoding draft through sparkcluster: the only
method that runs a plain model as the drafter is "draft_model", which `profile lint` refuses (seed
004: an MTP drafter belongs under "mtp"), and "mtp"/"eagle" need draft heads the tiny Llama lacks.
So the draft is staged and verified (dry-run, `weights pull`, `weights status`), and the profile
that serves has the separate tokenizer repository only.
"""

from __future__ import annotations

import json
import re

import openai
import pytest

from sparkcluster.movement import hfcache
from tests.integration.helpers import API_KEY, hf_cache, inventory_variant, reached
from tests.testbed import PROFILES as TESTBED_PROFILES
from tests.testbed import artifacts
from tests.testbed.hub import DRAFT, HUB_IP, TINY, TOKENIZER, build_hub
from tests.testbed.hub.server import make_server, serve_forever_in_thread

# `make test-long`, by hand: it passes, but CI's 50 minutes cannot also hold it (6.7 min on CI's two cores,
# 2026-11-27; tests/README.md)
pytestmark = [pytest.mark.testbed, pytest.mark.long]
HEAD, WORKER = "spark-head", "spark-worker"
SPEC = f'{{ method = "mtp", model = "{DRAFT}", num_speculative_tokens = 1 }}'


def _profiles(tmp_path, testbed_text: str) -> dict:
    d = tmp_path / "profiles"
    d.mkdir()
    tok = testbed_text.replace("\n[serve]\n", f'\n[serve]\ntokenizer = "{TOKENIZER}"\n', 1)
    (d / "testbed-tokenizer.toml").write_text(tok)
    (d / "testbed-repos.toml").write_text(tok.replace("\n[serve]\n", f"\n[serve]\nspeculative_config = {SPEC}\n", 1))
    return {"SPARKCLUSTER_PROFILES": str(d)}


def _wipe_extra(testbed) -> None:
    for h in (HEAD, WORKER):
        cache = hf_cache()  # the SSH user's, from the testbed's facts file
        testbed.sh(h, f"rm -rf {cache}/hub/{hfcache.repo_folder(TOKENIZER)} {cache}/hub/{hfcache.repo_folder(DRAFT)}")


def _files(testbed, host: str, repo: str) -> list[str]:
    got = testbed.sh(host, f"ls {hf_cache()}/hub/{hfcache.repo_folder(repo)}/snapshots/*/", check=False).stdout.split()
    return sorted(got)


def endpoint(out: str) -> str:
    m = re.search(r"endpoint: (\S+)", out)
    assert m, out
    return reached(m.group(1))  # it listens on the cluster's side: the tests' door to it


def ask(base_url: str) -> None:
    client = openai.OpenAI(base_url=base_url, api_key=API_KEY, timeout=60)
    r = client.chat.completions.create(
        model="testbed-tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0
    )
    assert r.usage.completion_tokens == 4


@pytest.fixture(scope="module")
def own_hub(testbed, sc, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("repos")
    srv = make_server(
        build_hub(artifacts.model_dir(), tmp / "hub-state", synthetic_mb=0, tiny_sha=artifacts.TINY_REVISION), HUB_IP, 0
    )
    serve_forever_in_thread(srv)
    ep = f"http://{HUB_IP}:{srv.server_address[1]}"
    testbed_text = (TESTBED_PROFILES / "testbed.toml").read_text()
    env = _profiles(tmp, testbed_text)

    # the worker's RoCE v2 IPv4 GIDs at index 5 (shifted below), the head's at 3; the inventory names
    # neither (issue 35: nothing is pinned)
    def edit(text: str) -> str:
        return re.sub(r'(?m)^hf_endpoint = ".*"$', f'hf_endpoint = "{ep}"', text)

    inv = inventory_variant(testbed, tmp, edit)
    sc("down", "--purge-gcs", timeout=300)
    _wipe_extra(testbed)
    testbed.shift_gids(WORKER)
    state = {"server": srv, "inv": inv, "env": env, "ep": ep, "stopped": False}
    try:
        yield state
    finally:
        sc("down", inventory=inv, env=env, timeout=300)
        if not state["stopped"]:
            srv.shutdown()
        srv.server_close()
        testbed.reset()
        _wipe_extra(testbed)


def test_every_repository_staged_and_served_offline_with_the_hub_stopped(testbed, sc, own_hub):
    inv, env = own_hub["inv"], own_hub["env"]
    # the plan lists each repository; the draft's and the tokenizer's steps come before any container
    res = sc("up", "--profile", "testbed-repos", "--dry-run", inventory=inv, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout + res.stderr
    for repo in (TINY, TOKENIZER, DRAFT):
        assert f"{own_hub['ep']}/api/models/{repo}/revision/main" in out, out
    assert f"tokenizer {TOKENIZER}@main (without weight files)" in out
    assert f"draft model {DRAFT}@main" in out

    # up stages the tokenizer repository on both nodes (neither had it), then serves offline
    res = sc("up", "--profile", "testbed-tokenizer", inventory=inv, env=env, timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr
    base = endpoint(res.stdout)
    for h in (HEAD, WORKER):
        files = _files(testbed, h, TOKENIZER)
        assert "tokenizer.json" in files and "model.safetensors" not in files, (h, files)
    # the draft: staged and verified by `weights pull`, listed by `weights status`
    res = sc("weights", "pull", "--profile", "testbed-repos", inventory=inv, env=env, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"{DRAFT}@" in res.stdout and "(draft model) staged on every node" in res.stdout
    for h in (HEAD, WORKER):
        assert "model.safetensors" in _files(testbed, h, DRAFT)
    res = sc("weights", "status", "--profile", "testbed-repos", inventory=inv, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    for line in (
        f"model: {TINY}@main",
        f"tokenizer: {TOKENIZER}@main (without weight files)",
        f"draft model: {DRAFT}@main",
    ):
        assert line in res.stdout, res.stdout
    assert "not cached" not in res.stdout and "partial" not in res.stdout

    # the hub stopped: the server answers, and a fresh start (containers and engine anew) still serves,
    # staging from the listings the head kept when it verified each snapshot
    own_hub["server"].shutdown()
    own_hub["stopped"] = True
    ask(base)
    assert sc("down", inventory=inv, env=env, timeout=300).returncode == 0
    res = sc("up", "--profile", "testbed-tokenizer", inventory=inv, env=env, timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "the head verified before" in res.stdout + res.stderr
    ask(endpoint(res.stdout))


def _no_pinned_gid(testbed, sc, inv, env, head_index: str, worker_index: str) -> None:
    res = sc("doctor", "--json", "--profile", "testbed-tokenizer", inventory=inv, env=env, timeout=120)
    rows = {(c["id"], c["node"]): c for c in json.loads(res.stdout)["checks"]}
    for h, want in ((HEAD, head_index), (WORKER, worker_index)):
        assert rows[("rdma.gid", h)]["status"] == "ok", rows[("rdma.gid", h)]
        assert rows[("rdma.gid", h)]["detail"].startswith(f"index {want} on "), rows[("rdma.gid", h)]
        name = testbed.sh(h, "docker ps --format '{{.Names}}'").stdout.split()[0]
        # gloo ignores the variable, so the environment is what is read, not NCCL
        got = testbed.sh(h, f"docker exec {name} printenv NCCL_IB_GID_INDEX", check=False)
        assert got.returncode != 0 and got.stdout.strip() == "", (h, got.stdout)


def test_gid_index_differs_and_moves_between_two_ups_and_still_serves(testbed, sc, own_hub):
    """Head at 3, worker at 5 (issue 24); then the head's table shifts too (a reboot or a link event:
    tonyd2wild DeepSeek-v4-Flash-Vision-Exp #38) between two `up`s. Both `up`s serve, doctor's rdma.gid
    passes with the index it now finds, and no container is told an index (issue 35)."""
    inv, env = own_hub["inv"], own_hub["env"]
    # serving already after the case above (then `up` changes nothing), or brought up here
    res = sc("up", "--profile", "testbed-tokenizer", inventory=inv, env=env, timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr
    ask(endpoint(res.stdout))
    _no_pinned_gid(testbed, sc, inv, env, "3", "5")
    assert sc("down", inventory=inv, env=env, timeout=300).returncode == 0
    testbed.shift_gids(HEAD)
    res = sc("up", "--profile", "testbed-tokenizer", inventory=inv, env=env, timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr
    ask(endpoint(res.stdout))
    _no_pinned_gid(testbed, sc, inv, env, "5", "5")
    hname = testbed.sh(HEAD, "docker ps --format '{{.Names}}'").stdout.split()[0]
    # the name stays in the file that keeps vLLM from copying a driver's value into the ranks
    nco = testbed.docker(HEAD, f"exec {hname} cat /etc/sparkcluster/vllm/ray_non_carry_over_env_vars.json").stdout
    assert "NCCL_IB_GID_INDEX" in json.loads(nco)
