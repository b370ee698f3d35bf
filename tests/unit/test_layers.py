"""Which of the head's layers a worker lacks, and what the plan says about it (from facts alone)."""

from __future__ import annotations

import json

import pytest
from conftest import make_inventory

from sparkcluster.config import profile as profiles
from sparkcluster.facts import HostFacts, parsers
from sparkcluster.movement import layers
from sparkcluster.movement.layers import ImageLayers
from sparkcluster.up.plan import make_plan

HEAD, WORKER = "spark-head", "spark-worker"
B1, B2, RAY, OTHER = ("sha256:" + c * 64 for c in "1234")
BASE = ImageLayers("sha256:" + "b" * 64, (B1, B2), (2_000_000_000, 700_000_000))
IMAGE = ImageLayers("sha256:" + "e" * 64, (B1, B2, RAY), (2_000_000_000, 700_000_000, 50_000_000))
CLASSIC = parsers.DockerInfo("20.10.24+dfsg1", "/var/lib/docker", ("runc",), "runc", (("Backing Filesystem", "extfs"),))
CONTAINERD = parsers.DockerInfo(
    "29.0.0", "/var/lib/docker", ("runc",), "runc", (("driver-type", "io.containerd.snapshotter.v1"),)
)


def test_base_present_moves_only_the_ray_layer():
    d = layers.delta(IMAGE, [list(BASE.layers), ["sha256:" + "9" * 64]])
    assert (d.total, d.held, d.moving, d.move_bytes, d.skip) == (3, 2, 1, 50_000_000, (B1, B2))
    assert layers.describe(d, WORKER) == "1 of 3 layers (50.0 MB) to spark-worker; it holds the bottom 2"


def test_base_absent_moves_everything():
    d = layers.delta(IMAGE, [])
    assert (d.held, d.moving, d.move_bytes, d.skip) == (0, 3, 2_750_000_000, ())
    assert "3 of 3 layers (2.75 GB)" in layers.describe(d, WORKER) and "holds none" in layers.describe(d, WORKER)


def test_base_different_shares_nothing_above_the_first_difference():
    # the same tag pulled on another day: its second layer differs, so only the first is held
    d = layers.delta(IMAGE, [[B1, OTHER]])
    assert (d.held, d.moving, d.skip) == (1, 2, (B1,))


def test_layers_count_from_the_bottom_only():
    assert layers.held_prefix(IMAGE.layers, [[B2, RAY]]) == 0


def test_a_diff_id_that_recurs_above_the_held_prefix_is_not_skipped():
    img = ImageLayers("sha256:" + "e" * 64, (B1, B2, B1), None)
    d = layers.delta(img, [[B1, B2]])
    assert d.skip == (B2,) and d.move_bytes is None
    assert "size unknown" in layers.describe(d, WORKER)


def test_identical_image_moves_no_layer_data():
    d = layers.delta(IMAGE, [list(IMAGE.layers)])
    assert d.moving == 0 and d.move_bytes == 0
    assert "no layer data" in layers.describe(d, WORKER)


def test_a_store_that_cannot_elide_gets_everything():
    d = layers.delta(IMAGE, [list(BASE.layers)], elide=False)
    assert (d.held, d.moving, d.skip, d.move_bytes) == (0, 3, (), 2_750_000_000)
    assert "cannot skip" in layers.describe(d, WORKER)


def test_sizes_from_history_only_when_one_entry_per_layer():
    assert layers.sizes_from_history([5, 0, 0, 7], 2) == (5, 7)
    assert layers.sizes_from_history([5, 0, 7], 3) is None


# ---- the plan (what --dry-run prints) -----------------------------------------------------------


@pytest.fixture(scope="module")
def prof() -> profiles.Profile:
    return profiles.load_profile("testbed")


def _facts(head_image, worker_image, worker_chains, worker_docker=CLASSIC) -> dict[str, HostFacts]:
    return {
        HEAD: HostFacts(
            HEAD,
            docker=CLASSIC,
            image_id=head_image.id if head_image else None,
            image_layers=head_image,
            base=BASE,
            layer_chains=[list(BASE.layers)],
        ),
        WORKER: HostFacts(WORKER, docker=worker_docker, image_id=worker_image, layer_chains=worker_chains),
    }


def _receive(plan):
    (step,) = [s for s in plan.steps() if s.action == "receive"]
    return step


def test_dry_run_names_the_layers_that_move(prof):
    plan = make_plan(make_inventory(), prof, _facts(IMAGE, None, [list(BASE.layers)]), serving=False, replace=False)
    assert "1 of 3 layers (50.0 MB) to spark-worker" in " ".join(plan.render().split())  # wrapped
    entry = [e for e in json.loads(plan.as_json()) if e["id"] == "image/spark-worker/receive"][0]
    assert "1 of 3 layers (50.0 MB) to spark-worker" in entry["description"]


def test_dry_run_with_the_base_absent_on_the_worker(prof):
    plan = make_plan(make_inventory(), prof, _facts(IMAGE, None, []), serving=False, replace=False)
    assert "3 of 3 layers (2.75 GB) to spark-worker" in _receive(plan).description


def test_dry_run_before_a_build_counts_the_base_layers(prof):
    plan = make_plan(make_inventory(), prof, _facts(None, None, [list(BASE.layers)]), serving=False, replace=False)
    d = _receive(plan).description
    assert "the layers the build adds, plus 0 of the base's 2 layers (0.0 MB) to spark-worker" in d


def test_dry_run_says_when_the_worker_store_gets_everything(prof):
    plan = make_plan(
        make_inventory(), prof, _facts(IMAGE, None, [list(BASE.layers)], CONTAINERD), serving=False, replace=False
    )
    assert "all 3 layers (2.75 GB) to spark-worker: its image store cannot skip" in _receive(plan).description


def test_identical_ids_plan_no_receive(prof):
    plan = make_plan(
        make_inventory(), prof, _facts(IMAGE, IMAGE.id, [list(IMAGE.layers)]), serving=False, replace=False
    )
    assert not [s for s in plan.steps() if s.action == "receive"]
