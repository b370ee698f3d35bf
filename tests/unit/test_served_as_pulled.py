"""One node without Ray serves the profile's base image as pulled: no build, no PyPI, the head's own
image, vLLM's one-process executor ("uni") on the plan and the container's label; a head without it is
refused with the pull command, as executor "mp" is (config/images.served_as_pulled)."""

from __future__ import annotations

import pytest
from conftest import make_inventory

from sparkcluster.config import profile as profiles
from sparkcluster.config.images import executor_of, image_ref, served_as_pulled, uses_ray
from sparkcluster.container.spec import spec_for
from sparkcluster.errors import InputError
from sparkcluster.facts import HostFacts
from sparkcluster.labels import EXECUTOR_LABEL
from sparkcluster.up.plan import make_offline_plan, make_plan

IMAGE_ID = "sha256:" + "cd" * 32


@pytest.fixture
def single() -> profiles.Profile:
    return profiles.load_profile("qwen36-35b-nvfp4-mtp")


@pytest.fixture
def pair() -> profiles.Profile:
    return profiles.load_profile("nemotron")


def test_one_node_without_ray_serves_the_base_image_as_pulled(single, pair):
    one = make_inventory().only([make_inventory().head.name])
    assert not uses_ray(1, single) and executor_of(1, single) == "uni"
    assert served_as_pulled(1, single) == "one node without Ray"
    assert image_ref(one, single) == single.image.ref
    # the pair keeps Ray and its built image
    two = make_inventory()
    assert uses_ray(2, pair) and executor_of(2, pair) == "ray" and served_as_pulled(2, pair) == ""
    assert image_ref(two, pair) != pair.image.ref


def test_its_plan_builds_nothing_and_labels_vllms_own_executor(single):
    inv = make_inventory()
    one = inv.only([inv.head.name])
    plan = make_plan(one, single, {one.head.name: HostFacts(one.head.name, image_id=IMAGE_ID)}, False, False)
    assert plan.build is None
    assert not [s for s in plan.steps() if s.stage == "image"], [s.action for s in plan.steps()]
    spec = spec_for(one, single, one.head, single.image.ref, IMAGE_ID)
    assert spec.labels[EXECUTOR_LABEL] == "uni" and spec.command == []  # no `ray start`
    offline = make_offline_plan(one, single)
    assert offline.build is None and any("pulled by you on the head" in n for n in offline.notes)


def test_a_head_without_the_base_image_is_refused_with_the_pull_command(single):
    inv = make_inventory()
    one = inv.only([inv.head.name])
    with pytest.raises(InputError) as e:
        make_plan(one, single, {one.head.name: HostFacts(one.head.name, image_id=None)}, False, False)
    assert "one node without Ray serves the profile's base image as it is" in e.value.message
    assert f"docker pull {single.image.ref}" in e.value.fix
