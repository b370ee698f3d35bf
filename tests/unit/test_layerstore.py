"""Reading the layers a worker lacks from the head's layer store (movement/layerstore): the real
READER snippet run locally on a captured piece of a Docker 20.10 overlay2 root (one layer's
tar-split and files, the image config), and the command that runs it in a container."""

from __future__ import annotations

import hashlib
import io
import json
import shlex
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import key_line

from sparkcluster import programs
from sparkcluster.movement import layerstore

ROOT = Path(__file__).parents[1] / "captured" / "docker-root-20.10"
IMAGE_ID = "0ed2398eda2120ae0d97b0671210eb865162839b84492df7c4c9c982ba52ce6f"
CONFIG = json.loads((ROOT / "image/overlay2/imagedb/content/sha256" / IMAGE_ID).read_bytes())
DIFFS = [d[7:] for d in CONFIG["rootfs"]["diff_ids"]]  # bottom up; the captured store holds the top one


def read(root: Path, skip: list[str], image_id: str = IMAGE_ID) -> subprocess.CompletedProcess:
    args = [str(root), image_id, "img:1", *("=" + d for d in DIFFS), *("-" + d for d in skip)]
    return subprocess.run(
        programs.argv(layerstore.READER, *args, python=sys.executable), capture_output=True, timeout=60
    )


def members(archive: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(archive)) as t:
        return {m.name: t.extractfile(m).read() for m in t}


def test_the_top_layer_is_rebuilt_byte_for_byte_from_its_tar_split():
    # the layer of a RUN that removed a directory (a whiteout), made a hard link and a symlink: its
    # tar comes back with the digest the engine registered, from 2 bytes of file data and the headers
    res = read(ROOT, DIFFS[:-1])
    assert res.returncode == 0, res.stderr
    got = members(res.stdout)
    assert list(got) == [IMAGE_ID + ".json", DIFFS[-1] + "/layer.tar", "manifest.json"]
    assert hashlib.sha256(got[DIFFS[-1] + "/layer.tar"]).hexdigest() == DIFFS[-1]
    with tarfile.open(fileobj=io.BytesIO(got[DIFFS[-1] + "/layer.tar"])) as layer:
        names = layer.getnames()
    assert "usr/share/doc/.wh.apt" in names and "opt/d/hard" in names and "opt/sym" in names
    assert hashlib.sha256(got[IMAGE_ID + ".json"]).hexdigest() == IMAGE_ID
    # every layer is named, so docker load finds the held ones by chain ID
    assert json.loads(got["manifest.json"]) == [
        {"Config": IMAGE_ID + ".json", "RepoTags": ["img:1"], "Layers": [d + "/layer.tar" for d in DIFFS]}
    ]


def test_a_layer_the_store_lacks_ends_the_reader_with_one_line(tmp_path):
    # the third layer is not held, and the captured store has no chain for it (as on a store that lost it)
    res = read(ROOT, DIFFS[:2])
    assert res.returncode == 3
    assert res.stderr.decode().strip().startswith(f"layer store: layer {DIFFS[2][:12]}")


def test_a_file_shorter_than_its_entry_fails_rather_than_pad(tmp_path):
    root = tmp_path / "root"
    shutil.copytree(ROOT, root)
    f = next((root / "overlay2").glob("*/diff/opt/d/f"))
    f.write_bytes(b"x")
    res = read(root, DIFFS[:-1])
    assert res.returncode == 3 and b"is shorter than its tar entry" in res.stderr


def test_a_changed_file_fails_on_the_layers_digest(tmp_path):
    root = tmp_path / "root"
    shutil.copytree(ROOT, root)
    next((root / "overlay2").glob("*/diff/opt/d/f")).write_bytes(b"y\n")
    res = read(root, DIFFS[:-1])
    assert res.returncode == 3 and f"layer {DIFFS[-1]} rebuilt to sha256:".encode() in res.stderr


def test_another_store_has_no_config_here():
    # the containerd image store (or another image ID) keeps no imagedb content under image/overlay2
    res = read(ROOT, DIFFS[:-1], image_id="f" * 64)
    assert res.returncode == 3 and b"the image config" in res.stderr


def test_read_command_runs_a_throwaway_container_with_the_root_read_only():
    cmd = layerstore.read_command(
        "repo/img:tag",
        "sha256:" + IMAGE_ID,
        "/var/lib/docker",
        tuple("sha256:" + d for d in DIFFS),
        ("sha256:" + DIFFS[0],),
    )
    argv = shlex.split(cmd)
    assert argv[:2] == ["docker", "run"]
    for flag in (["--rm"], ["--network", "none"], ["--log-driver", "none"], ["--user", "0:0"]):
        assert any(argv[i : i + len(flag)] == flag for i in range(len(argv))), flag
    assert f"type=bind,source=/var/lib/docker,target={layerstore.MOUNT},readonly" in argv
    i = argv.index("-c")
    assert argv[i + 2] == layerstore.READER  # after the boot; its bundle last
    assert argv[i + 3 : -1] == [layerstore.MOUNT, IMAGE_ID, "repo/img:tag", *("=" + d for d in DIFFS), "-" + DIFFS[0]]


@pytest.mark.parametrize("bad", ["sha256:$(id)", "abc", "sha256:" + "G" * 64])
def test_read_command_refuses_what_is_not_a_digest(bad):
    with pytest.raises(ValueError):
        layerstore.read_command("img", bad, "/var/lib/docker", (), ())
    with pytest.raises(ValueError):
        layerstore.read_command("img", "sha256:" + IMAGE_ID, "/var/lib/docker", (bad,), ())


@pytest.mark.parametrize("root", ["relative/docker", "/var/lib/docker,readonly=false", "/a\nb"])
def test_read_command_refuses_a_root_that_would_change_the_mount(root):
    with pytest.raises(ValueError):
        layerstore.read_command("img", "sha256:" + IMAGE_ID, root, (), ())


def _receive_while(send_argv) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    """The real receiver (stdout sink) on loopback, and the sender `send_argv(port)` runs against it."""
    from sparkcluster.movement import transfer

    recv = subprocess.Popen(
        programs.argv(transfer.RECEIVER, "127.0.0.1", "127.0.0.1", "stdout", python=sys.executable),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    recv.stdin.write(key_line())
    recv.stdin.flush()
    port = next(int(x.split()[1]) for x in iter(recv.stderr.readline, b"") if x.startswith(b"@@port "))
    snd = subprocess.run(send_argv(port), input=key_line(), capture_output=True, timeout=60)
    out, err = recv.communicate(timeout=60)
    return snd, subprocess.CompletedProcess(recv.args, recv.returncode, out, err)


def test_the_sending_reader_gives_the_receiver_the_same_archive_as_stdout():
    # issue 40 item 7: the reader frames the archive onto the worker's connection itself (no pipe
    # through dockerd's attach and a sender): the receiver's sink gets the bytes the stdout reader writes
    args = [str(ROOT), IMAGE_ID, "img:1", *("=" + d for d in DIFFS), *("-" + d for d in DIFFS[:-1])]
    snd, got = _receive_while(
        lambda port: programs.argv(
            layerstore.SENDING_READER, "127.0.0.1", str(port), "127.0.0.1", *args, python=sys.executable
        )
    )
    assert snd.returncode == 0 and got.returncode == 0, (snd.stderr, got.stderr)
    assert got.stdout == read(ROOT, DIFFS[:-1]).stdout
    assert b"@@sent %d" % len(got.stdout) in snd.stderr


def test_a_sending_reader_that_fails_leaves_the_receiver_a_cut_stream(tmp_path):
    # the receiver then stops its docker load (transfer.STREAM_CUT) rather than load a short archive
    from sparkcluster.movement import transfer

    root = tmp_path / "root"
    shutil.copytree(ROOT, root)
    next((root / "overlay2").glob("*/diff/opt/d/f")).write_bytes(b"y\n")
    args = [str(root), IMAGE_ID, "img:1", *("=" + d for d in DIFFS), *("-" + d for d in DIFFS[:-1])]
    snd, got = _receive_while(
        lambda port: programs.argv(
            layerstore.SENDING_READER, "127.0.0.1", str(port), "127.0.0.1", *args, python=sys.executable
        )
    )
    assert snd.returncode == 3 and b"rebuilt to sha256:" in snd.stderr
    assert got.returncode == transfer.STREAM_CUT


def test_send_command_runs_the_reader_on_the_hosts_network_sending_from_the_heads_address():
    argv = shlex.split(
        layerstore.send_command(
            "repo/img:tag",
            "sha256:" + IMAGE_ID,
            "/var/lib/docker",
            tuple("sha256:" + d for d in DIFFS),
            ("sha256:" + DIFFS[0],),
            "10.0.0.2",
            4711,
            "10.0.0.1",
        )
    )
    assert argv[:2] == ["docker", "run"] and "|" not in argv
    for flag in (["--rm"], ["--network", "host"], ["--log-driver", "none"], ["--user", "0:0"]):
        assert any(argv[i : i + len(flag)] == flag for i in range(len(argv))), flag
    assert f"type=bind,source=/var/lib/docker,target={layerstore.MOUNT},readonly" in argv
    i = argv.index("-c")
    assert argv[i + 2] == layerstore.SENDING_READER
    assert argv[i + 3 : -1] == [
        "10.0.0.2",
        "4711",
        "10.0.0.1",
        layerstore.MOUNT,
        IMAGE_ID,
        "repo/img:tag",
        *("=" + d for d in DIFFS),
        "-" + DIFFS[0],
    ]


def test_a_sender_started_before_its_receiver_reads_the_port_from_stdin():
    # stream.run's port_on_stdin: the container starts while the receiver does, then learns the port
    from sparkcluster.movement import transfer

    args = [str(ROOT), IMAGE_ID, "img:1", *("=" + d for d in DIFFS), *("-" + d for d in DIFFS[:-1])]
    sender = subprocess.Popen(
        programs.argv(layerstore.SENDING_READER, "127.0.0.1", "-", "127.0.0.1", *args, python=sys.executable),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    sender.stdin.write(key_line())  # the key first (stream.run writes it as soon as the end starts)
    sender.stdin.flush()
    recv = subprocess.Popen(
        programs.argv(transfer.RECEIVER, "127.0.0.1", "127.0.0.1", "stdout", python=sys.executable),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    recv.stdin.write(key_line())
    recv.stdin.flush()
    port = next(int(x.split()[1]) for x in iter(recv.stderr.readline, b"") if x.startswith(b"@@port "))
    sender.stdin.write(b"%d\n" % port)
    sender.stdin.flush()
    _, err = sender.communicate(timeout=60)
    out, _ = recv.communicate(timeout=60)
    assert sender.returncode == 0 and recv.returncode == 0, err
    assert out == read(ROOT, DIFFS[:-1]).stdout
    argv = shlex.split(
        layerstore.send_command("img:1", "sha256:" + IMAGE_ID, "/var/lib/docker", (), (), "10.0.0.2", None, "10.0.0.1")
    )
    assert argv[:3] == ["docker", "run", "-i"]
    i = argv.index("-c")
    assert argv[i + 3 : i + 6] == ["10.0.0.2", "-", "10.0.0.1"]  # after the boot and the program
