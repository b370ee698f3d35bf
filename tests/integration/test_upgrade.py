"""`upgrade` rolls itself back (issue 39 item 5) on the testbed, with the test double (profile
testbed-standin): a new image that starts but answers wrongly (`garble_answers`) is refused by its
canary, one that answers not at all (`hang_completions`) already by the new `up`'s readiness check;
either way the cluster serves the old image again and nothing is left of the new one but the record of
why. An image that serves as the old one did is kept, and `rollback` returns to the old one on request.

The bad images are tagged copies of the double's image told to fail through its environment
(`ENV VLLM_STANDIN_KNOBS=...`, the double's own knob; sparkcluster never knows it), built on the head
as an owner would `docker pull` a new tag there. The module ends with the cluster down and those
images removed.
"""

from __future__ import annotations

import json

import pytest

from tests.integration.helpers import BASE, HEAD, HEAD_C, WORKER, answers, ours

# `make test` keeps the dry run and the garbled image's rollback (issue 57); the mute image (it waits out the
# new `up`'s readiness bound) and the kept image with `rollback` are `make test-long`'s (tests/README.md)
pytestmark = pytest.mark.testbed
PROFILE = "testbed-standin"
OLD = "sparkcluster-testbed/vllm-standin:0.21"
GARBLED = f"{OLD}-garbled"
MUTE = f"{OLD}-mute"
SAME = f"{OLD}-same"
KNOBS = {GARBLED: {"garble_answers": True}, MUTE: {"hang_completions": True}, SAME: {}}


def cluster_image(testbed, base: str) -> str:
    """The image sparkcluster builds FROM `base` (the profile's executor adds Ray) and runs on every node."""
    from sparkcluster.config import inventory
    from sparkcluster.config import profile as profiles
    from sparkcluster.config.images import image_ref
    from sparkcluster.upgrade.upgrade import with_image

    inv = inventory.load(testbed.inventory)
    return image_ref(inv, with_image(profiles.load_profile(PROFILE), base))


def serving_image(testbed) -> str:
    return testbed.docker(HEAD, f"inspect --format '{{{{.Config.Image}}}}' {HEAD_C}").stdout.strip()


def record(sc) -> dict:
    return json.loads((sc.state_dir / "sparkcluster" / "known-good-testbed.json").read_text())


def double_reads_its_knobs_from_the_environment(testbed) -> bool:
    """Whether the double's image on the head is one that takes `$VLLM_STANDIN_KNOBS` and knows
    `garble_answers` (a testbed brought up before they existed keeps an older double)."""
    code = "from vllm_standin import knobs; assert knobs.ENV and 'garble_answers' in knobs.DEFAULTS"
    got = testbed.docker(HEAD, f'run --rm --network none --entrypoint python3 {OLD} -c "{code}"', check=False)
    return got.returncode == 0


@pytest.fixture(scope="module")
def served(testbed, sc):
    if not double_reads_its_knobs_from_the_environment(testbed):
        testbed.refresh_vllm_standin()  # the double's current code, as a fresh testbed builds it
        assert double_reads_its_knobs_from_the_environment(testbed)
    for ref, knobs in KNOBS.items():
        env = f"ENV VLLM_STANDIN_KNOBS='{json.dumps(knobs)}'\n" if knobs else "LABEL upgrade.test=same\n"
        testbed.sh(HEAD, f"docker build -q -t {ref} -", input=f"FROM {OLD}\n{env}", timeout=300)
    res = sc("up", "--profile", PROFILE, "--replace", timeout=900)
    assert res.returncode == 0, f"{res.stdout}\n{res.stderr}"
    yield cluster_image(testbed, OLD)
    sc("down", timeout=300)
    for ref in KNOBS:
        for host in (HEAD, WORKER):
            testbed.docker(host, f"image rm -f {cluster_image(testbed, ref)}", check=False)
        testbed.docker(HEAD, f"image rm -f {ref}", check=False)
    assert ours(testbed, HEAD) == [] and ours(testbed, WORKER) == []


def test_the_dry_run_prints_the_whole_plan_and_moves_nothing(testbed, sc, served):
    res = sc("upgrade", "--profile", PROFILE, "--image", GARBLED, "--dry-run", timeout=300)
    assert res.returncode == 0, f"{res.stdout}\n{res.stderr}"
    for stage in ("[baseline]", "[up]", "[canary]", "[bench]", "[prune]", "[rollback]"):
        assert stage in res.stdout, res.stdout
    assert "[image]" in res.stdout  # the new up's own plan, nested: the image is built and sent
    assert serving_image(testbed) == served
    assert testbed.image_id(WORKER, cluster_image(testbed, GARBLED)) is None


# an image that answers nothing never gets through the new `up`'s own readiness (a one-token completion
# within the profile's ready_timeout_s): the upgrade's reason is that `up` failed, and it rolls back the same
@pytest.mark.parametrize(
    "bad, why", [(GARBLED, "canary answers changed"), pytest.param(MUTE, "up failed", marks=pytest.mark.long)]
)
def test_an_image_that_answers_wrongly_or_not_at_all_is_rolled_back(testbed, sc, served, bad, why):
    res = sc("upgrade", "--profile", PROFILE, "--image", bad, timeout=1800)
    assert res.returncode == 1, f"{res.stdout}\n{res.stderr}"
    assert "refused and rolled back" in res.stderr and why in res.stderr, res.stderr
    # the old image serves again
    assert serving_image(testbed) == served
    assert answers(BASE, "testbed-tiny")
    # nothing left of the new one on any node ...
    new = cluster_image(testbed, bad)
    assert testbed.image_id(HEAD, new) is None and testbed.image_id(WORKER, new) is None
    doc = record(sc)
    # (other modules of the session keep records of their own images: none may name the refused one)
    assert not [r for r in doc["records"] if r["base_image"] == bad], doc["records"]
    # ... but the record of why
    last = doc["upgrades"][-1]
    assert last["image"] == bad and last["outcome"] == "rolled back" and why in last["reason"], last


@pytest.mark.long  # `make test-long`: `make test` keeps this module's other cases (tests/README.md, issue 57)
def test_a_good_image_is_kept_the_old_pruned_and_rollback_returns_to_it(testbed, sc, served):
    res = sc("upgrade", "--profile", PROFILE, "--image", SAME, "--min-speed", "0.3", timeout=1800)
    assert res.returncode == 0, f"{res.stdout}\n{res.stderr}"
    new = cluster_image(testbed, SAME)
    assert serving_image(testbed) == new and answers(BASE, "testbed-tiny")
    assert testbed.image_id(WORKER, served) is None  # the old image pruned once the new one was good
    assert record(sc)["records"][-1]["base_image"] == SAME and record(sc)["records"][-1]["canary"]

    res = sc("rollback", "--profile", PROFILE, timeout=1800)
    assert res.returncode == 0, f"{res.stdout}\n{res.stderr}"
    assert serving_image(testbed) == served and answers(BASE, "testbed-tiny")
    assert record(sc)["upgrades"][-1]["outcome"] == "rollback"
