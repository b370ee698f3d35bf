"""The image stage's plan for three workers (issue 27): one docker save feeding a chain
spark-1 -> spark-2 -> spark-3 -> spark-4, the layers every worker holds left out; and which node a
failed chain names."""

from __future__ import annotations

import pytest
from test_image_send import CLASSIC
from test_topology import _four, _ring, _switch

from sparkcluster.config import profile as profiles
from sparkcluster.movement import stream, transfer
from sparkcluster.movement.layers import ImageLayers
from sparkcluster.up.plan import make_plan
from sparkcluster.up.stages import image_chain

HEAD_ID = "sha256:" + "ab" * 32
L = ["sha256:" + c * 64 for c in "123"]


def plan_for(kind, held):
    inv, found = _four(kind, _switch if kind == "switch" else _ring)
    for n in inv.nodes:
        inv.set_home(n.name, "/home/spark", "1000:1000")
    for f in found.values():
        f.docker = CLASSIC
    found["spark-1"].image_id = HEAD_ID
    found["spark-1"].image_layers = ImageLayers(HEAD_ID, tuple(L), (5_000_000_000, 300_000_000, 90_000_000))
    for n, k in held.items():
        found[n].layer_chains = [L[:k]]
    return make_plan(inv, profiles.load_profile("testbed"), found, serving=False, replace=False)


@pytest.mark.parametrize(
    "kind, addrs",
    [
        ("switch", [("198.19.1.1", "198.19.1.2"), ("198.19.1.2", "198.19.1.3"), ("198.19.1.3", "198.19.1.4")]),
        (
            "ring",
            [("198.19.112.1", "198.19.112.2"), ("198.19.123.2", "198.19.123.3"), ("198.19.134.3", "198.19.134.4")],
        ),
    ],
)
def test_three_workers_receive_along_one_chain(kind, addrs):
    plan = plan_for(kind, {"spark-2": 2, "spark-3": 1, "spark-4": 2})
    recv = [s for s in plan.steps() if s.stage == "image" and s.action == "receive"]
    assert [s.id for s in recv] == ["image/spark-2/receive", "image/spark-3/receive", "image/spark-4/receive"]
    assert [s.what for s in recv] == [f"receive the image from spark-{i} along the chain" for i in (1, 2, 3)]
    # one docker save, said once; the layers spark-3 lacks (it holds only the bottom one) go to all
    assert sum("docker save" in s.detail for s in recv) == 1
    assert "2 of 3 layers (390.0 MB) to each; they hold the bottom 1" in recv[0].detail
    for i, s in enumerate(recv):
        src, dst = addrs[i]
        assert f"from spark-{i + 1} over {src} -> {dst}" in s.detail
        assert f"spark-{i + 2}: docker load (one connection, spark-{i + 1}'s address only" in s.detail
    assert f"forwarding to spark-3 over {addrs[1][0]} -> {addrs[1][1]}" in recv[0].detail
    assert "the end of the chain" in recv[2].detail
    assert all(s.when == "" for s in recv)


def test_after_a_build_each_step_checks_the_new_id_first():
    plan = plan_for("switch", {})
    plan.facts["spark-1"].image_id = None
    plan = make_plan(plan.inventory, plan.profile, plan.facts, serving=False, replace=False)
    recv = [s for s in plan.steps() if s.action == "receive" and s.stage == "image"]
    assert len(recv) == 3 and all(s.when and s.skip for s in recv)
    assert "the layers the build adds" in recv[0].detail


def test_one_worker_is_sent_to_as_before():
    plan = plan_for("switch", {})
    plan.facts["spark-3"].image_id = plan.facts["spark-4"].image_id = HEAD_ID
    plan = make_plan(plan.inventory, plan.profile, plan.facts, serving=False, replace=False)
    recv = [s for s in plan.steps() if s.action == "receive" and s.stage == "image"]
    assert [s.what for s in recv] == ["receive the image from the head"]
    assert "drop the layer tars spark-2 holds" in recv[0].detail


CUT, RELAY = transfer.STREAM_CUT, transfer.RELAY_FAILED


@pytest.mark.parametrize(
    "sender_ok, codes, named",
    [
        (True, [0, 0, 0], None),
        (False, [CUT, CUT, CUT], "spark-1"),  # docker save died: the head
        (True, [0, 1, CUT], "spark-3"),  # spark-3's docker load failed; spark-4 was cut under it
        (True, [RELAY, -1, CUT], "spark-3"),  # spark-3 lost: its own failure before spark-2's relay
        (True, [0, RELAY, CUT], "spark-3"),  # spark-3 could not reach spark-4
        (True, [0, 0, CUT], "spark-4"),
    ],
)
def test_a_failed_chain_names_the_first_node_at_fault(sender_ok, codes, named):
    got = stream.culprit(sender_ok, list(zip(["spark-2", "spark-3", "spark-4"], codes)), "spark-1")
    assert got == named


def test_the_plan_says_where_the_head_reads_the_layers():
    # every worker holds the bottom layer: the delta is read from the head's layer store
    recv = [s for s in plan_for("switch", {"spark-2": 2, "spark-3": 1, "spark-4": 2}).steps() if s.action == "receive"]
    assert "from the head's layer store (a throwaway container, the docker root read-only), else docker save" in (
        recv[0].detail
    )
    # one worker holds nothing: nothing is left out, the whole image goes by docker save
    recv = [s for s in plan_for("switch", {"spark-2": 2, "spark-3": 0, "spark-4": 2}).steps() if s.action == "receive"]
    assert "layer store" not in recv[0].detail and "docker save" in recv[0].detail


# ---- the chain run on this machine: the real snippets over loopback, a fake docker per node ----


def test_distribute_moves_one_stream_through_three_workers(tmp_path):
    from chain_fakes import world3

    r, dirs, head = world3(tmp_path)
    notes = {w: image_chain.receive(r, w) for w in ("w1", "w2", "w3")}  # the first step moves it to all
    assert notes["w2"].startswith("received from w1 along the chain (127.0.0.2 -> 127.0.0.3)")
    loaded = [(d / "loaded.0").read_bytes() for d in dirs]
    assert loaded[0] == loaded[1] == loaded[2] and len(loaded[0]) > 0
    assert len(head.started) == 1  # one docker save


def test_distribute_reads_the_delta_from_the_heads_layer_store_once_for_the_chain(tmp_path):
    # every worker holds the base: the head's layer store gives the Ray layer once, each worker loads it
    import hashlib
    import tarfile
    from io import BytesIO

    from chain_fakes import world3
    from test_image_send import BASE_ID, BASE_TAR, CONFIG, FAKE_RUN, RAY_ID, RAY_TAR, layer_store

    r, dirs, head = world3(tmp_path)
    image_id = "sha256:" + hashlib.sha256(CONFIG).hexdigest()
    (tmp_path / "head" / "fake_run.py").write_text(FAKE_RUN)
    layer_store(tmp_path / "head" / "root", image_id, CONFIG, [BASE_TAR, RAY_TAR])
    r.facts["head"].image_id = image_id
    r.facts["head"].image_layers = ImageLayers(image_id, (BASE_ID, RAY_ID), (300_000, 100_000))
    for w in ("w1", "w2", "w3"):
        r.facts[w].layer_chains = [[BASE_ID]]
    info = {"Id": image_id, "Size": 400_000, "RootFS": {"Layers": [BASE_ID, RAY_ID]}}
    r.find = lambda kind: image_chain.image.HeadImage(info) if kind is image_chain.image.HeadImage else None
    notes = image_chain.distribute(r)
    assert all("read from the head's layer store" in n for n in notes.values()), notes
    assert len(head.started) == 1 and "docker run -i --rm" in head.started[0]
    for d in dirs:
        with tarfile.open(fileobj=BytesIO((d / "loaded.0").read_bytes())) as t:
            assert t.getnames() == [image_id[7:] + ".json", RAY_ID[7:] + "/layer.tar", "manifest.json"]
