"""The controller's memory of image IDs Ray has run in, and the probe script that uses it."""

from __future__ import annotations

import subprocess

import pytest
from conftest import make_inventory

from sparkcluster import facts
from sparkcluster.facts import ray_seen

ID_A = "sha256:" + "a" * 64
ID_B = "sha256:" + "b" * 64


@pytest.fixture(autouse=True)
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    return tmp_path


def test_remember_then_load_keeps_only_the_version_line():
    ray_seen.remember({ID_A: "ray, version 2.60.0 (running in 1234abcd)"})
    assert ray_seen.load() == {ID_A: "ray, version 2.60.0"}


def test_only_real_ids_and_real_ray_lines_are_remembered():
    ray_seen.remember(
        {"sha256:short": "ray, version 1", ID_A: "bash: ray: command not found", ID_B: "ray, version 2.60.0"}
    )
    assert ray_seen.load() == {ID_B: "ray, version 2.60.0"}
    # a running container on an image without the version label prints an empty version
    ray_seen.remember({ID_A: "ray, version  (running in 1234abcd)"})
    assert ray_seen.load() == {ID_B: "ray, version 2.60.0"}


def test_an_id_seen_again_becomes_the_most_recent():
    ray_seen.remember({ID_A: "ray, version 2.60.0"})
    for i in range(ray_seen.KEEP - 1):
        ray_seen.remember({f"sha256:{i:064x}": "ray, version 2.60.0"})
    ray_seen.remember({ID_A: "ray, version 2.60.0 (ran in this image ID before)"})
    ray_seen.remember({ID_B: "ray, version 2.60.0"})
    assert ID_A in ray_seen.load() and f"sha256:{0:064x}" not in ray_seen.load()


def test_keeps_the_most_recent():
    for i in range(ray_seen.KEEP + 5):
        ray_seen.remember({f"sha256:{i:064x}": f"ray, version 2.{i}.0"})
    got = ray_seen.load()
    assert len(got) == ray_seen.KEEP and f"sha256:{ray_seen.KEEP + 4:064x}" in got and f"sha256:{0:064x}" not in got


def test_unreadable_or_foreign_file_is_empty(state):
    (state / "sparkcluster").mkdir()
    ray_seen.path().write_text("[1, 2")
    assert ray_seen.load() == {}
    ray_seen.path().write_text(f'{{"not an id": "ray, version 1", "{ID_A}": 5}}')
    assert ray_seen.load() == {}


def test_probe_script_skips_the_container_for_a_seen_id_only(tmp_path):
    """The image_ray section run by bash with a fake `docker`: a seen ID answers from memory, another
    ID starts the container."""
    inv = make_inventory()
    node = inv.head
    script = facts.probe_script(inv, node, "repo/img:tag", {ID_A: "ray, version 2.60.0"})
    section = [p for p in script.split("\n") if "image_ray" in p and "docker image inspect" in p][0]
    fake = tmp_path / "docker"
    fake.write_text(
        '#!/bin/sh\nif [ "$1" = image ]; then echo "$FAKE_ID"; exit 0; fi\n'
        'if [ "$1" = ps ]; then exit 0; fi\nif [ "$1" = run ]; then echo "ray, version from a container"; exit 0; fi\n'
    )
    fake.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    for fid, want in (
        (ID_A, "ray, version 2.60.0 (ran in this image ID before)"),
        (ID_B, "ray, version from a container"),
    ):
        out = subprocess.run(["bash", "-c", section], capture_output=True, text=True, env=env | {"FAKE_ID": fid}).stdout
        assert want in out, out


def test_probe_script_without_memory_has_no_case():
    inv = make_inventory()
    assert "case " not in facts.probe_script(inv, inv.head, "repo/img:tag", {})
    assert "case " not in facts.probe_script(inv, inv.head, "repo/img:tag")
