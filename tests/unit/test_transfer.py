"""The head-to-worker image transfer: quoting of the command strings, and the real RECEIVER and
SENDER snippets run locally over loopback, with `docker save`/`docker load` replaced by files."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from conftest import STREAM_KEY, StderrLines

from sparkcluster import programs
from sparkcluster.movement import transfer

HOSTILE_IMAGE = "repo/img:tag; touch /tmp/pwned $(id) `id` 'q' \"d\""
HOSTILE_IP = "1.2.3.4; rm -rf / $(id)"


# ---- command strings ----------------------------------------------------------------------------


def test_send_command_quotes_image_and_ips():
    cmd = transfer.send_command(HOSTILE_IMAGE, HOSTILE_IP, 40123, "5.6.7.8 && $(id)")
    words = shlex.split(cmd)
    i = words.index("save")
    assert words[i - 1 : i + 2] == ["docker", "save", HOSTILE_IMAGE]
    assert words[-4:-1] == [HOSTILE_IP, "40123", "5.6.7.8 && $(id)"]  # no layer to skip: then the bundle
    assert transfer.SENDER in words
    assert cmd.startswith("set -o pipefail; ")


def test_send_command_port_is_an_integer():
    with pytest.raises(ValueError):
        transfer.send_command("img", "1.2.3.4", "1; id", "5.6.7.8")  # type: ignore[arg-type]


def test_receive_command_quotes_ips():
    cmd = transfer.receive_command(HOSTILE_IP, "9.9.9.9 `id`")
    words = shlex.split(cmd)
    assert transfer.RECEIVER in words
    j = words.index(transfer.RECEIVER)
    assert words[j + 1 : j + 3] == [HOSTILE_IP, "9.9.9.9 `id`"]
    assert words[-3:-1] == [
        HOSTILE_IP,
        "9.9.9.9 `id`",
    ]  # then the program's bundle  # docker load runs inside the receiver


def test_bash_wraps_the_command():
    assert transfer.bash("echo hi") == ["bash", "-c", "echo hi"]


def test_describe_names_both_ends():
    d = transfer.describe("img:1", "spark-head", "198.19.2.1", "spark-worker", "198.19.2.2")
    assert "198.19.2.1 -> 198.19.2.2" in d and "spark-head" in d and "spark-worker" in d


def archive(entries: list[tuple[str, bytes]]) -> bytes:
    """A tar as docker save writes it: the entries, then the end-of-archive blocks."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as t:
        for name, data in entries:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


# ---- running the snippets locally ---------------------------------------------------------------

FAKE_DOCKER = r"""#!/bin/sh
# stands in for the docker CLI: `save IMAGE` prints a file, `load` stores stdin
printf '%s\n' "$@" > "$FAKE_DOCKER_DIR/argv.$1"
case "$1" in
  save) exec cat "$FAKE_DOCKER_DIR/image.tar" ;;
  load) exec cat > "$FAKE_DOCKER_DIR/loaded.tar" ;;
esac
exit 64
"""


@pytest.fixture
def fake_env(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    docker = bindir / "docker"
    docker.write_text(FAKE_DOCKER)
    docker.chmod(0o755)
    # python3 = this interpreter, first on PATH, so both snippets run where the tests run
    (bindir / "python3").symlink_to(sys.executable)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "FAKE_DOCKER_DIR": str(tmp_path)}
    return tmp_path, env


class Proc(StderrLines):
    """A local bash -c run of one of transfer's snippets."""

    def __init__(self, cmd: str, env: dict, key: str | None = STREAM_KEY):
        super().__init__(transfer.bash(cmd), env=env, stdout=subprocess.PIPE, key=key)


def start_receiver(env, bind: str, peer: str) -> tuple[Proc, int]:
    recv = Proc(transfer.receive_command(bind, peer), env)
    line = recv.wait_for("@@port ")
    port = int(line.split()[1])
    assert 0 < port < 65536
    return recv, port


def test_image_bytes_arrive_byte_for_byte(fake_env):
    tmp, env = fake_env
    payload = archive([("big", os.urandom(3 * (1 << 20) + 7))])  # crosses the 1 MiB chunk boundaries
    (tmp / "image.tar").write_bytes(payload)
    recv, port = start_receiver(env, "127.0.0.1", "127.0.0.1")
    try:
        send = Proc(transfer.send_command(HOSTILE_IMAGE, "127.0.0.1", port, "127.0.0.1"), env)
        assert send.wait() == 0, send.lines
        assert recv.wait() == 0, recv.lines
    finally:
        recv.kill()
    assert (tmp / "loaded.tar").read_bytes() == payload
    sent = [line for line in send.lines if line.startswith("@@sent ")]
    assert sent and sent[-1] == f"@@sent {len(payload)}"
    assert [int(s.split()[1]) for s in sent] == sorted(int(s.split()[1]) for s in sent)
    # the hostile image name reached `docker save` as one argument, uninterpreted
    assert (tmp / "argv.save").read_text() == f"save\n{HOSTILE_IMAGE}\n"
    assert (tmp / "argv.load").read_text() == "load\n"
    assert not (tmp / "pwned").exists()


def test_empty_image_stream_is_not_an_archive(fake_env):
    tmp, env = fake_env
    (tmp / "image.tar").write_bytes(b"")
    recv, port = start_receiver(env, "127.0.0.1", "127.0.0.1")
    try:
        send = Proc(transfer.send_command("img:1", "127.0.0.1", port, "127.0.0.1"), env)
        assert send.wait() != 0
        assert recv.wait() == 75, recv.lines
    finally:
        recv.kill()


def test_failed_save_fails_the_sender(fake_env):
    tmp, env = fake_env  # no image.tar: the fake `docker save` fails
    recv, port = start_receiver(env, "127.0.0.1", "127.0.0.1")
    try:
        send = Proc(transfer.send_command("img:1", "127.0.0.1", port, "127.0.0.1"), env)
        assert send.wait() != 0  # pipefail: the save's failure is the pipeline's
    finally:
        recv.kill()


def test_connection_from_another_address_is_refused(fake_env):
    tmp, env = fake_env
    payload = archive([("f", b"image bytes " * 1000)])
    (tmp / "image.tar").write_bytes(payload)
    recv, port = start_receiver(env, "127.0.0.1", "127.0.0.2")
    try:
        # from 127.0.0.3: accepted by the kernel, closed by the receiver, nothing written
        stranger = Proc(transfer.send_command("img:1", "127.0.0.1", port, "127.0.0.3"), env)
        stranger.wait()
        time.sleep(0.3)
        assert recv.p.poll() is None, "the receiver must keep waiting for the head"
        assert not (tmp / "loaded.tar").exists() or (tmp / "loaded.tar").read_bytes() == b""
        # from the allowed peer: the bytes arrive
        send = Proc(transfer.send_command("img:1", "127.0.0.1", port, "127.0.0.2"), env)
        assert send.wait() == 0, send.lines
        assert recv.wait() == 0, recv.lines
    finally:
        recv.kill()
    assert (tmp / "loaded.tar").read_bytes() == payload
    assert f"@@sent {len(payload)}" in send.lines


# ---- disk needed on the receiving node ----------------------------------------------------------

GB = 2**30
LAYERS = ["sha256:base1", "sha256:base2", "sha256:ray"]


def test_disk_needed_on_a_bare_node_is_twice_the_image():
    assert transfer.disk_needed(10 * GB, LAYERS, []) == 20 * GB


def test_disk_needed_with_the_base_present_is_the_image_plus_the_new_layer():
    present = [(LAYERS[:2], 8 * GB), (["sha256:other"], 5 * GB)]
    assert transfer.disk_needed(10 * GB, LAYERS, present) == 12 * GB


def test_disk_needed_takes_the_largest_image_our_layers_begin_with():
    present = [(LAYERS[:1], 3 * GB), (LAYERS[:2], 8 * GB), (LAYERS + ["sha256:label"], 10 * GB)]
    assert transfer.disk_needed(10 * GB, LAYERS, present) == 10 * GB


def test_disk_needed_ignores_images_that_only_share_a_later_layer():
    # layers only count from the bottom: an image with our second layer but not our first shares nothing
    present = [(LAYERS[1:], 7 * GB), ([], 1 * GB)]
    assert transfer.disk_needed(10 * GB, LAYERS, present) == 20 * GB


def test_disk_needed_with_the_previous_build_present_credits_the_shared_layers():
    # upgrading: the worker holds the old cluster image (same base layers, another top layer)
    old_build = (LAYERS[:2] + ["sha256:old-ray"], 9 * GB)
    sizes = [5 * GB, 3 * GB, 2 * GB]
    assert transfer.disk_needed(10 * GB, LAYERS, [old_build], sizes) == 12 * GB
    # without the history only a base image counts: none here
    assert transfer.disk_needed(10 * GB, LAYERS, [old_build]) == 20 * GB


def test_disk_needed_credits_only_entries_surely_inside_the_prefix():
    # 3 layers but 2 non-empty history entries: one layer is empty and could be anywhere, so a
    # shared prefix of 2 layers is only sure to hold the first entry
    old_build = (LAYERS[:2] + ["sha256:old-ray"], 9 * GB)
    assert transfer.disk_needed(10 * GB, LAYERS, [old_build], [8 * GB, 2 * GB]) == 12 * GB
    assert transfer.disk_needed(10 * GB, LAYERS, [(LAYERS[:1], 8 * GB)], [8 * GB, 2 * GB]) == 12 * GB
    assert transfer.disk_needed(10 * GB, LAYERS, [(["sha256:x"], 1 * GB)], [8 * GB, 2 * GB]) == 20 * GB


def test_disk_needed_for_an_image_without_layers_is_the_safe_bound():
    assert transfer.disk_needed(10, [], [(["sha256:a"], 3)]) == 20


# ---- leaving out the layers the worker holds ----------------------------------------------------


def _layer(seed: bytes, n: int = 5000) -> tuple[bytes, str]:
    data = archive([("f", seed * n)])  # a layer tar; its sha256 is its diff ID
    return data, hashlib.sha256(data).hexdigest()


def _run(
    fake_env, image: bytes, skip: list[str], keep: list[str] = (), order: list[str] = ()
) -> tuple[Proc, Proc, bytes | None]:
    tmp, env = fake_env
    (tmp / "image.tar").write_bytes(image)
    recv, port = start_receiver(env, "127.0.0.1", "127.0.0.1")
    try:
        send = Proc(transfer.send_command("img:1", "127.0.0.1", port, "127.0.0.1", skip, keep, order), env)
        send.wait()
        recv.wait()
    finally:
        recv.kill()
    out = tmp / "loaded.tar"
    return send, recv, out.read_bytes() if out.exists() else None


def _names(tar_bytes: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as t:
        return t.getnames()


def test_v1_layout_leaves_out_the_held_layer_tars_by_their_hash(fake_env):
    # Docker 20.10-24: `<v1 id>/layer.tar`, a name that says nothing about the diff ID
    (base, base_id), (ray, _) = _layer(b"base"), _layer(b"ray")
    image = archive(
        [
            ("aaaa/VERSION", b"1.0"),
            ("aaaa/json", b"{}"),
            ("aaaa/layer.tar", ray),
            ("bbbb/VERSION", b"1.0"),
            ("bbbb/json", b"{}"),
            ("bbbb/layer.tar", base),
            ("cfg.json", b"{}"),
            ("manifest.json", b"[]"),
            ("repositories", b"{}"),
        ]
    )
    send, recv, got = _run(fake_env, image, ["sha256:" + base_id])
    assert send.p.returncode == 0 and recv.p.returncode == 0, (send.lines, recv.lines)
    assert _names(got) == [
        "aaaa/VERSION",
        "aaaa/json",
        "aaaa/layer.tar",
        "bbbb/VERSION",
        "bbbb/json",
        "cfg.json",
        "manifest.json",
        "repositories",
    ]
    with tarfile.open(fileobj=io.BytesIO(got)) as t:
        assert t.extractfile("aaaa/layer.tar").read() == ray
    assert f"@@dropped 1 {len(base)}" in send.lines
    assert len(got) < len(image) - len(base) + 1024


SAVED = Path(__file__).parents[1] / "captured" / "docker-save-20.10"


def _saved_v1_image(tars: dict[str, bytes]) -> tuple[bytes, list[str], list[str]]:
    """A docker save archive of Docker 20.10 with the real metadata of a testbed image (its
    `<v1 id>/json` files, config, manifest), `tars[v1 id]` standing in for each layer.tar. Returns
    it, the image's diff IDs bottom up, and its v1 directories in the same order."""
    man = json.loads((SAVED / "manifest.json").read_bytes())[0]
    diffs = json.loads((SAVED / man["Config"]).read_bytes())["rootfs"]["diff_ids"]
    dirs = [x.split("/")[0] for x in man["Layers"]]
    entries = [(man["Config"], (SAVED / man["Config"]).read_bytes())]
    for d in sorted(dirs):  # docker save tars its export directory in name order
        entries += [(f"{d}/VERSION", b"1.0"), (f"{d}/json", (SAVED / f"{d}_json").read_bytes())]
        entries.append((f"{d}/layer.tar", tars.get(d, b"")))
    entries += [(n, (SAVED / n).read_bytes()) for n in ("manifest.json", "repositories")]
    return archive(entries), diffs, dirs


@pytest.mark.parametrize("held", [1, 4, 5])
def test_v1_layout_names_each_layer_tar_by_its_json_without_reading_it(fake_env, held):
    # Docker 20.10-24: the v1 ID is the digest of the directory's json with the layer's chain ID in
    # it, so the sender learns each tar's diff ID before the tar arrives: nothing is hashed or
    # spooled, and the stand-in tars (whose bytes hash to no diff ID) are judged by name alone
    man = json.loads((SAVED / "manifest.json").read_bytes())[0]
    tars = {x.split("/")[0]: os.urandom(3000 + 17 * i) for i, x in enumerate(man["Layers"])}
    image, diffs, dirs = _saved_v1_image(tars)
    send, recv, got = _run(fake_env, image, diffs[:held], diffs[held:], diffs)
    assert send.p.returncode == 0 and recv.p.returncode == 0, (send.lines, recv.lines)
    gone = {f"{d}/layer.tar" for d in dirs[:held]}
    assert _names(got) == [n for n in _names(image) if n not in gone]
    with tarfile.open(fileobj=io.BytesIO(got)) as t:
        for d in dirs[held:]:
            assert t.extractfile(f"{d}/layer.tar").read() == tars[d]
    assert "@@hashed 0 0" in send.lines
    assert f"@@dropped {held} {sum(len(tars[d]) for d in dirs[:held])}" in send.lines


def test_v1_layout_without_the_diff_ids_in_order_falls_back_to_hashing(fake_env):
    # an older controller's command (no "=" arguments): each tar is hashed on the way, as before
    man = json.loads((SAVED / "manifest.json").read_bytes())[0]
    tars = {x.split("/")[0]: os.urandom(2000 + i) for i, x in enumerate(man["Layers"])}
    image, diffs, dirs = _saved_v1_image(tars)
    send, recv, got = _run(fake_env, image, diffs[:1], diffs[1:])
    assert send.p.returncode == 0 and recv.p.returncode == 0, (send.lines, recv.lines)
    assert f"@@hashed {len(dirs)} {sum(len(t) for t in tars.values())}" in send.lines
    # the stand-in tars hash to no diff ID: all are sent
    assert _names(got) == _names(image)


def test_a_json_naming_another_chain_is_not_trusted(fake_env):
    # the bottom layer's json put under the second layer's directory: its digest is not that name,
    # so that tar is hashed, not judged by a name it does not prove
    man = json.loads((SAVED / "manifest.json").read_bytes())[0]
    dirs = [x.split("/")[0] for x in man["Layers"]]
    base, base_id = _layer(b"base")
    other = dirs[1]
    image = archive(
        [
            (f"{other}/json", (SAVED / f"{dirs[0]}_json").read_bytes()),
            (f"{other}/layer.tar", base),
            ("manifest.json", b"[]"),
        ]
    )
    diffs = json.loads((SAVED / man["Config"]).read_bytes())["rootfs"]["diff_ids"]
    send, recv, got = _run(fake_env, image, ["sha256:" + base_id], diffs, ["sha256:" + base_id, *diffs[1:]])
    assert send.p.returncode == 0 and recv.p.returncode == 0, (send.lines, recv.lines)
    assert f"@@hashed 1 {len(base)}" in send.lines
    assert _names(got) == [f"{other}/json", "manifest.json"]  # dropped by its hash, which is held


def test_oci_layout_leaves_out_held_blobs_by_name(fake_env):
    # Docker 25 and later: `blobs/sha256/<diff id>` for an uncompressed layer
    (base, base_id), (ray, ray_id) = _layer(b"base"), _layer(b"ray")
    image = archive(
        [
            (f"blobs/sha256/{base_id}", base),
            (f"blobs/sha256/{ray_id}", ray),
            ("blobs/sha256/" + "c" * 64, b"{}"),
            ("index.json", b"{}"),
            ("manifest.json", b"[]"),
        ]
    )
    send, recv, got = _run(fake_env, image, ["sha256:" + base_id], ["sha256:" + ray_id])
    assert send.p.returncode == 0 and recv.p.returncode == 0, (send.lines, recv.lines)
    assert _names(got) == [f"blobs/sha256/{ray_id}", "blobs/sha256/" + "c" * 64, "index.json", "manifest.json"]


def test_a_large_blob_not_named_by_a_diff_id_is_judged_by_its_hash(fake_env):
    # should an engine name layer blobs by another digest, the held one still stays behind
    (base, base_id), (ray, ray_id) = _layer(b"base", 400_000), _layer(b"ray", 400_000)
    image = archive([("blobs/sha256/" + "1" * 64, base), ("blobs/sha256/" + "2" * 64, ray), ("manifest.json", b"[]")])
    send, recv, got = _run(fake_env, image, ["sha256:" + base_id], ["sha256:" + ray_id])
    assert send.p.returncode == 0 and recv.p.returncode == 0, (send.lines, recv.lines)
    assert _names(got) == ["blobs/sha256/" + "2" * 64, "manifest.json"]


def test_long_names_in_pax_headers_are_judged_by_their_real_name(fake_env):
    base, base_id = _layer(b"base")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for name, data in [("d" * 120 + "/layer.tar", base), ("manifest.json", b"[]")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    send, recv, got = _run(fake_env, buf.getvalue(), ["sha256:" + base_id])
    assert send.p.returncode == 0 and recv.p.returncode == 0, (send.lines, recv.lines)
    assert _names(got) == ["manifest.json"]  # the pax header went with its entry


@pytest.mark.parametrize("skip", [False, True])
def test_a_cut_stream_loads_nothing(fake_env, skip):
    # docker save dying mid-way looks like a finished pipe: the receiver must not end docker load's
    # input cleanly, or a tar cut at an entry boundary would load as a short archive
    (base, base_id), (ray, _) = _layer(b"base"), _layer(b"ray")
    whole = archive([("aaaa/layer.tar", ray), ("bbbb/layer.tar", base), ("manifest.json", b"[]")])
    cut = whole[: 512 + len(ray) + (-len(ray)) % 512]  # exactly after the first entry
    send, recv, got = _run(fake_env, cut, ["sha256:" + base_id] if skip else [])
    assert send.p.returncode != 0
    assert recv.p.returncode == 75
    assert any("nothing loaded" in line for line in recv.lines)


def test_send_command_refuses_a_skip_that_is_not_a_digest():
    with pytest.raises(ValueError):
        transfer.send_command("img", "1.2.3.4", 1, "5.6.7.8", ["sha256:$(id)"])
    with pytest.raises(ValueError):
        transfer.send_command("img", "1.2.3.4", 1, "5.6.7.8", ["sha256:" + "a" * 64], ["sha256:; id"])
    cmd = transfer.send_command("img", "1.2.3.4", 1, "5.6.7.8", ["sha256:" + "a" * 64], ["sha256:" + "b" * 64])
    assert shlex.split(cmd)[-3:-1] == ["-" + "a" * 64, "+" + "b" * 64]  # then the bundle
    # nothing to leave out: the image's diff IDs are not needed either
    assert (
        shlex.split(transfer.send_command("img", "1.2.3.4", 1, "5.6.7.8", [], ["sha256:" + "b" * 64]))[-2] == "5.6.7.8"
    )


def test_containerd_image_store_gets_the_whole_image():
    assert transfer.elides([["Backing Filesystem", "extfs"], ["Supports d_type", "true"]])
    assert not transfer.elides([["driver-type", "io.containerd.snapshotter.v1"]])
    assert transfer.elides([])


def test_both_senders_share_one_framing_and_are_found_by_name():
    # one framed-send module; each sender's name and arguments within the first 4 KB of its command
    # line, which `pgrep -f` reads (tests/integration/test_image_layers.py finds the image sender by it)
    assert "sparkcluster.programs.framing" in programs.modules(transfer.SENDER)
    assert "sparkcluster.programs.framing" in programs.modules(transfer.STREAM_SENDER)
    cmd = transfer.send_command("img", "10.0.0.2", 4711, "10.0.0.1")
    line = cmd[cmd.index("python3 -c ") :]
    assert re.search(r"^python3 -c .* sparkcluster[.]programs[.]image_sender 10.0.0.2 4711 ", line[:4096], re.S)
