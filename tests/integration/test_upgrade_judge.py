"""`upgrade` judges what an upgrade promises (issue 58 item 1) on the testbed, with the test double and
a profile that enables tool calls (testbed-standin with `--enable-auto-tool-choice --tool-call-parser
hermes`, written into this module's own profiles folder):

- a new image that changes numerics only (the double's `diverge_from`: each canary answer keeps its
  first 12 of 16 words, then splits) is kept: across an image change the canary asks agreement over
  the first IMAGE_CHANGE_AGREEMENT of each answer, not the same token IDs;
- a new image whose chat requests with `tools` answer HTTP 500 (the double's `tools_error`, NGC
  26.07's failure: docs/field-notes.md) while its completions answer as before is rolled back, with
  the reason.

The images are tagged copies of the double's told to misbehave through its environment (`ENV
VLLM_STANDIN_KNOBS=...`), built on the head as test_upgrade builds its own. The module ends with the
cluster down and those images removed.
"""

from __future__ import annotations

import json

import pytest

from tests.integration.helpers import BASE, HEAD, HEAD_C, WORKER, answers, ours
from tests.testbed import PROFILES as TESTBED_PROFILES

# not in `make test`: `make test-long` runs it (two upgrades of the double, one rolled back)
pytestmark = [pytest.mark.testbed, pytest.mark.long]
PROFILE = "testbed-standin-tools"
OLD = "sparkcluster-testbed/vllm-standin:0.21"
NUMERIC = f"{OLD}-numerics"
NO_TOOLS = f"{OLD}-tools500"
# NGC 26.07's answer to every request with `tools` (docs/field-notes.md)
TOOLS_ERROR = "cannot import name 'normalize_tool_choice'"
KNOBS = {NUMERIC: {"diverge_from": 12}, NO_TOOLS: {"tools_error": TOOLS_ERROR}}


def write_profile(folder) -> None:
    """testbed-standin with tool calls enabled, in a folder that shadows nothing of the testbed's."""
    text = (TESTBED_PROFILES / "testbed-standin.toml").read_text()
    assert "\n[serve]\n" in text
    text = text.replace("\n[serve]\n", '\n[serve]\nenable_auto_tool_choice = true\ntool_call_parser = "hermes"\n')
    (folder / f"{PROFILE}.toml").write_text(text)


def cluster_image(testbed, base: str, folder) -> str:
    """The image sparkcluster builds FROM `base` (the profile's executor adds Ray) and runs on every node."""
    from sparkcluster.config import inventory
    from sparkcluster.config import profile as profiles
    from sparkcluster.config.images import image_ref
    from sparkcluster.upgrade.upgrade import with_image

    prof = profiles.load_profile(str(folder / f"{PROFILE}.toml"))  # by its path
    return image_ref(inventory.load(testbed.inventory), with_image(prof, base))


def serving_image(testbed) -> str:
    return testbed.docker(HEAD, f"inspect --format '{{{{.Config.Image}}}}' {HEAD_C}").stdout.strip()


def record(sc) -> dict:
    return json.loads((sc.state_dir / "sparkcluster" / "known-good-testbed.json").read_text())


def double_knows_the_judges_knobs(testbed) -> bool:
    code = "from vllm_standin import knobs; assert 'diverge_from' in knobs.DEFAULTS and 'tools_error' in knobs.DEFAULTS"
    got = testbed.docker(HEAD, f'run --rm --network none --entrypoint python3 {OLD} -c "{code}"', check=False)
    return got.returncode == 0


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("profiles")
    write_profile(d)
    return d


@pytest.fixture(scope="module")
def served(testbed, sc, folder):
    if not double_knows_the_judges_knobs(testbed):
        testbed.refresh_vllm_standin()  # the double's current code, as a fresh testbed builds it
        assert double_knows_the_judges_knobs(testbed)
    for ref, knobs in KNOBS.items():
        testbed.sh(
            HEAD,
            f"docker build -q -t {ref} -",
            # a double-quoted word (the JSON's quotes escaped): TOOLS_ERROR's own single quotes kept
            input=f"FROM {OLD}\nENV VLLM_STANDIN_KNOBS={json.dumps(json.dumps(knobs))}\n",
            timeout=300,
        )
    env = {"SPARKCLUSTER_PROFILES": str(folder)}
    res = sc("up", "--profile", PROFILE, "--replace", timeout=900, env=env)
    assert res.returncode == 0, f"{res.stdout}\n{res.stderr}"
    yield cluster_image(testbed, OLD, folder)
    sc("down", timeout=300, env=env)
    for ref in KNOBS:
        for host in (HEAD, WORKER):
            testbed.docker(host, f"image rm -f {cluster_image(testbed, ref, folder)}", check=False)
        testbed.docker(HEAD, f"image rm -f {ref}", check=False)
    assert ours(testbed, HEAD) == [] and ours(testbed, WORKER) == []


def test_an_image_whose_tool_requests_fail_is_rolled_back(testbed, sc, folder, served):
    env = {"SPARKCLUSTER_PROFILES": str(folder)}
    dry = sc("upgrade", "--profile", PROFILE, "--image", NO_TOOLS, "--dry-run", timeout=300, env=env)
    flat = " ".join(dry.stdout.split())  # the plan's lines wrap at ~100 columns
    assert dry.returncode == 0 and "one chat request of each kind the profile enables (tools)" in flat, dry.stdout
    res = sc("upgrade", "--profile", PROFILE, "--image", NO_TOOLS, timeout=1800, env=env)
    assert res.returncode == 1, f"{res.stdout}\n{res.stderr}"
    assert "refused and rolled back" in res.stderr, res.stderr
    assert "the tools chat request answered HTTP 500" in res.stderr and TOOLS_ERROR in res.stderr, res.stderr
    assert serving_image(testbed) == served and answers(BASE, "testbed-tiny")
    new = cluster_image(testbed, NO_TOOLS, folder)
    assert testbed.image_id(HEAD, new) is None and testbed.image_id(WORKER, new) is None
    last = record(sc)["upgrades"][-1]
    assert last["image"] == NO_TOOLS and last["outcome"] == "rolled back" and "HTTP 500" in last["reason"], last


def test_an_image_that_changes_numerics_only_is_kept(testbed, sc, folder, served):
    env = {"SPARKCLUSTER_PROFILES": str(folder)}
    res = sc("upgrade", "--profile", PROFILE, "--image", NUMERIC, "--min-speed", "0.3", timeout=1800, env=env)
    assert res.returncode == 0, f"{res.stdout}\n{res.stderr}"
    assert serving_image(testbed) == cluster_image(testbed, NUMERIC, folder) and answers(BASE, "testbed-tiny")
    doc = record(sc)
    assert doc["records"][-1]["base_image"] == NUMERIC and doc["upgrades"][-1]["outcome"] == "kept", doc["upgrades"]
