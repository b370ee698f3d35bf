"""The weights along the chain (issue 27), over loopback with the real receiver, relay and sender
scripts and real tar: the head on 127.0.0.1, three workers on 127.0.0.2-4, each with an HF cache of
its own; the check that adopts files is a fake that reports what arrived."""

from __future__ import annotations

import hashlib
import json
import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest
from chain_fakes import IPS, world3

from sparkcluster.movement import hfcache
from sparkcluster.programs.weights_receive import RECEIVED
from sparkcluster.up.stages import weights_chain

REPO = "org/model"
FILES = {hashlib.sha256(f"file {i}".encode() * 5000).hexdigest(): f"file {i}".encode() * 5000 for i in range(3)}


class FakeStaging:
    """What weights_chain needs of a Staging: the state of each node's check, the head's cache."""

    def __init__(self, caches: dict[str, Path], lacking: dict[str, list[str]]):
        self.repo, self.caches, self.moved = REPO, caches, {}
        self.cap_bytes_s = None  # the inventory's replication_max_mb_s, in bytes a second
        self.cache = str(caches["head"])
        self.progress = SimpleNamespace(bytes=lambda *a: None)
        self.state = {
            n: {"missing": list(b), "missing_bytes": sum(len(FILES[x]) for x in b)} for n, b in lacking.items()
        }
        self.single: list[str] = []

    def check(self, node: str) -> dict:
        got = Path(hfcache.incoming_dir(str(self.caches[node]), REPO))
        arrived = {p.name for p in got.glob("*")} if got.exists() else set()
        self.state[node]["missing"] = [b for b in self.state[node]["missing"] if b not in arrived]
        return self.state[node]

    def replicate(self, node: str) -> str:
        self.single.append(node)
        return f"sent to {node} alone"


def world(tmp_path, lacking):
    r, _, _ = world3(tmp_path)
    caches = {n: tmp_path / f"hf-{n}" for n in IPS}
    blobs = Path(hfcache.blobs_dir(str(caches["head"]), REPO))
    blobs.mkdir(parents=True)
    for name, data in FILES.items():
        (blobs / name).write_bytes(data)
    r.inv.hf_cache = lambda n: str(caches[n])
    return r, FakeStaging(caches, lacking), caches


def test_two_or_more_workers_lacking_get_one_stream_along_the_chain(tmp_path):
    names = list(FILES)
    r, st, caches = world(tmp_path, {"head": [], "w1": names, "w2": names[:1], "w3": names[1:]})
    notes = {n: weights_chain.replicate(r, st, 0, n) for n in ("w1", "w2", "w3")}
    assert st.single == []
    assert "received from head along the chain (127.0.0.1 -> 127.0.0.2)" in notes["w1"]
    assert "received from w2 along the chain (127.0.0.3 -> 127.0.0.4)" in notes["w3"]
    for n in ("w1", "w2", "w3"):
        got = Path(hfcache.incoming_dir(str(caches[n]), REPO))
        # every file any of them lacked reached each (the union), byte for byte
        assert {p.name: p.read_bytes() for p in got.iterdir() if p.name != RECEIVED} == FILES
        # each hashed as it was written: the record `check` adopts from without reading them again
        assert sorted(json.loads(x)[3] for x in (got / RECEIVED).read_text().splitlines()) == sorted(FILES)
        assert st.state[n]["missing"] == []
    # the head's one sender: a single command on the head
    assert len(r.cluster.head.started) == 1


def test_one_worker_lacking_is_sent_to_alone(tmp_path):
    r, st, _ = world(tmp_path, {"head": [], "w1": [], "w2": list(FILES), "w3": []})
    assert weights_chain.replicate(r, st, 0, "w2") == "sent to w2 alone"
    assert st.single == ["w2"]


def test_a_worker_the_chain_reached_reports_it_rather_than_being_skipped(tmp_path):
    names = list(FILES)
    r, st, _ = world(tmp_path, {"head": [], "w1": names, "w2": names, "w3": []})
    weights_chain.replicate(r, st, 0, "w1")
    assert st.state["w2"]["missing"] == [] and weights_chain.reached(r, 0, "w2")
    assert not weights_chain.reached(r, 0, "w3")


def test_the_inventorys_cap_reaches_the_heads_one_sender(tmp_path):
    """replication_max_mb_s (issue 40): the stream along the chain is paced by its one sender."""
    names = list(FILES)
    r, st, _ = world(tmp_path, {"head": [], "w1": names, "w2": names, "w3": []})
    st.cap_bytes_s = 5e6
    weights_chain.replicate(r, st, 0, "w1")
    [sender] = r.cluster.head.started
    assert shlex.split(sender)[-2] == "rate=5000000" and st.state["w2"]["missing"] == []


def test_weights_pull_sends_along_the_chain_too(tmp_path):
    """`weights pull` (Staging.replicate_all) moves the files as `up` does: one stream along the
    chain over the control links when two or more workers lack files."""
    from sparkcluster.up.stages.weights import Staging

    names = list(FILES)
    r, fake, caches = world(tmp_path, {"head": [], "w1": names, "w2": [], "w3": names[:1]})
    st = Staging(r.cluster, r.inv, "img:1", REPO, "main", {}, fake.progress)
    st.state = fake.state
    st.check = fake.check  # what arrived, as the fake reports it
    r.inv.cluster = SimpleNamespace(replication_max_mb_s=None)
    notes = st.replicate_all()
    assert [n.split(":")[0] for n in notes] == ["w1", "w3"]
    assert "received from w1 along the chain (127.0.0.2 -> 127.0.0.4)" in notes[1]
    assert fake.state["w3"]["missing"] == [] and len(r.cluster.head.started) == 1


def test_a_cap_is_read_from_the_inventory_in_bytes_a_second():
    from pydantic import ValidationError

    from sparkcluster.config.inventory import ClusterSettings
    from sparkcluster.up.stages.weights import Staging

    assert ClusterSettings(name="x", replication_max_mb_s=200).replication_max_mb_s == 200
    with pytest.raises(ValidationError):
        ClusterSettings(name="x", replication_max_mb_s=0)
    inv = SimpleNamespace(cluster=SimpleNamespace(replication_max_mb_s=200.0))
    assert Staging(None, inv, "", REPO, "main", {}, None).cap_bytes_s == 2e8
    inv.cluster.replication_max_mb_s = None
    assert Staging(None, inv, "", REPO, "main", {}, None).cap_bytes_s is None
