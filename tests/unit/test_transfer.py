"""The head-to-worker image transfer: quoting of the command strings, and the real RECEIVER and
SENDER snippets run locally over loopback, with `docker save`/`docker load` replaced by files."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time

import pytest

from conftest import StderrLines
from sparkcluster import transfer

HOSTILE_IMAGE = "repo/img:tag; touch /tmp/pwned $(id) `id` 'q' \"d\""
HOSTILE_IP = "1.2.3.4; rm -rf / $(id)"


# ---- command strings ----------------------------------------------------------------------------

def test_send_command_quotes_image_and_ips():
    cmd = transfer.send_command(HOSTILE_IMAGE, HOSTILE_IP, 40123, "5.6.7.8 && $(id)")
    words = shlex.split(cmd)
    i = words.index("save")
    assert words[i - 1:i + 2] == ["docker", "save", HOSTILE_IMAGE]
    assert words[-3:] == [HOSTILE_IP, "40123", "5.6.7.8 && $(id)"]
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
    assert words[j + 1:j + 3] == [HOSTILE_IP, "9.9.9.9 `id`"]
    assert words[-3:] == ["|", "docker", "load"]
    assert cmd.startswith("set -o pipefail; ")


def test_bash_wraps_the_command():
    assert transfer.bash("echo hi") == ["bash", "-c", "echo hi"]


def test_describe_names_both_ends():
    d = transfer.describe("img:1", "spark-head", "198.19.2.1", "spark-worker", "198.19.2.2")
    assert "198.19.2.1 -> 198.19.2.2" in d and "spark-head" in d and "spark-worker" in d


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

    def __init__(self, cmd: str, env: dict):
        super().__init__(transfer.bash(cmd), env=env, stdout=subprocess.PIPE)


def start_receiver(env, bind: str, peer: str) -> tuple[Proc, int]:
    recv = Proc(transfer.receive_command(bind, peer), env)
    line = recv.wait_for("@@port ")
    port = int(line.split()[1])
    assert 0 < port < 65536
    return recv, port


def test_image_bytes_arrive_byte_for_byte(fake_env):
    tmp, env = fake_env
    payload = os.urandom(3 * (1 << 20) + 7)  # crosses the 1 MiB chunk boundaries
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


def test_empty_image_stream(fake_env):
    tmp, env = fake_env
    (tmp / "image.tar").write_bytes(b"")
    recv, port = start_receiver(env, "127.0.0.1", "127.0.0.1")
    try:
        send = Proc(transfer.send_command("img:1", "127.0.0.1", port, "127.0.0.1"), env)
        assert send.wait() == 0, send.lines
        assert recv.wait() == 0, recv.lines
    finally:
        recv.kill()
    assert (tmp / "loaded.tar").read_bytes() == b""
    assert send.lines[-1] == "@@sent 0"


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
    payload = b"image bytes " * 1000
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
    assert send.lines[-1] == f"@@sent {len(payload)}"


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
