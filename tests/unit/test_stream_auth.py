"""Node-to-node streams refuse what the head did not send (programs/framing, receiver, weights_receive):
the real receivers on loopback, fed frames made here. A forged, replayed or reordered frame, one under
another key, an end frame that is not the head's and a length over the bound are refused, and none of
their bytes reach the sink (`docker load`'s input, a byte pipe, the weights' incoming folder). A
sender's frames check out under the key it read from its stdin."""

from __future__ import annotations

import hashlib
import os
import socket
import struct
import subprocess
import sys

import pytest
from conftest import STREAM_KEY, key_line

from sparkcluster import programs
from sparkcluster.movement import hfcache, transfer
from sparkcluster.programs import framing, receiver, weights_send

KEY = bytes.fromhex(STREAM_KEY)
OTHER = bytes.fromhex("a7" * 32)
LINE = key_line()  # the key as movement/stream writes it to an end's stdin


class Frames:
    """Frames made by hand: `frame(data)` the next one under `key`, in sequence."""

    def __init__(self, key: bytes = KEY):
        self.seal = framing.Seal(key)

    def frame(self, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + data + self.seal.tag(len(data), data)

    def end(self) -> bytes:
        return self.frame(b"")


def start(cmd_argv: list[str], tmp_path, key: bytes | None = LINE) -> tuple[subprocess.Popen, int, object]:
    """A receiver (its stdout to a file), its stdin the key line; returns it, its port, its output."""
    out = open(tmp_path / "out", "wb")
    p = subprocess.Popen(cmd_argv, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.PIPE)
    if key is not None:
        p.stdin.write(key)
    p.stdin.close()
    line = p.stderr.readline()
    port = int(line.split()[1]) if line.startswith(b"@@port ") else 0
    p.first = b"" if port else line  # a receiver that ended before announcing a port: why
    return p, port, out


def byte_pipe(tmp_path, key=LINE):
    return start(
        programs.argv(transfer.RECEIVER, "127.0.0.1", "127.0.0.1", "stdout", python=sys.executable), tmp_path, key
    )


def send(port: int, *parts: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10, source_address=("127.0.0.1", 0)) as s:
        for p in parts:
            try:
                s.sendall(p)
            except OSError:  # the receiver refused and closed: the rest is not read
                break
        try:
            s.shutdown(socket.SHUT_WR)
            s.recv(1)
        except OSError:
            pass


def ended(p: subprocess.Popen, out) -> tuple[int, str]:
    rc = p.wait(timeout=30)
    out.close()
    return rc, (getattr(p, "first", b"") + p.stderr.read()).decode(errors="replace")


def test_frames_under_the_key_arrive(tmp_path):
    p, port, out = byte_pipe(tmp_path)
    f = Frames()
    send(port, f.frame(b"one "), f.frame(b"two"), f.end())
    assert ended(p, out)[0] == 0
    assert (tmp_path / "out").read_bytes() == b"one two"


@pytest.mark.parametrize(
    "case",
    ["forged data", "forged tag", "another key", "replayed", "reordered", "forged end"],
)
def test_a_frame_that_is_not_the_heads_is_refused_before_its_bytes_are_written(tmp_path, case):
    p, port, out = byte_pipe(tmp_path)
    f = Frames(OTHER if case == "another key" else KEY)
    first = f.frame(b"first")
    if case == "forged data":
        wire = [first[:6] + b"F" + first[7:]]
    elif case == "forged tag":
        wire = [first[:-1] + bytes([first[-1] ^ 1])]
    elif case == "another key":
        wire = [first]
    elif case == "replayed":
        wire = [first, first]
    elif case == "reordered":
        second = f.frame(b"second")
        wire = [second, first]
    else:  # an end frame that does not carry the run's tag: not the end of the stream
        wire = [first, struct.pack(">I", 0) + b"\0" * framing.TAG]
    send(port, *wire, f.end())
    rc, err = ended(p, out)
    assert rc == receiver.REFUSED, err
    assert "refused" in err and "nothing of it reached the sink" in err
    written = (tmp_path / "out").read_bytes()
    # a frame before the bad one was the head's and is written; nothing of the bad one is
    assert written == (b"first" if case in ("replayed", "forged end") else b"")


def test_a_length_over_the_bound_is_refused_before_anything_is_read(tmp_path):
    p, port, out = byte_pipe(tmp_path)
    send(port, struct.pack(">I", 0xFFFFFFFF) + b"x" * 64)
    rc, err = ended(p, out)
    assert rc == receiver.REFUSED and f"at most {framing.MAX_FRAME}" in err, err
    assert (tmp_path / "out").read_bytes() == b""


@pytest.mark.parametrize("key", [b"", b"not hex\n", b"ab\n"])
def test_a_receiver_without_a_key_accepts_nothing(tmp_path, key):
    p, port, out = byte_pipe(tmp_path, key=key)
    rc, err = ended(p, out)
    assert port == 0 and rc == receiver.REFUSED and "no stream key" in err


def test_docker_load_gets_nothing_from_a_forged_frame(tmp_path):
    """The image's sink: docker load is stopped, and a fake one that keeps only an input that ended
    cleanly shows that nothing was loaded."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "docker").write_text(
        '#!/bin/sh\ncat > "$FAKE_DOCKER_DIR/loading" && mv "$FAKE_DOCKER_DIR/loading" "$FAKE_DOCKER_DIR/loaded.tar"\n'
    )
    (bindir / "docker").chmod(0o755)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "FAKE_DOCKER_DIR": str(tmp_path)}
    out = open(tmp_path / "out", "wb")
    p = subprocess.Popen(
        programs.argv(transfer.RECEIVER, "127.0.0.1", "127.0.0.1", python=sys.executable),
        stdin=subprocess.PIPE,
        stdout=out,
        stderr=subprocess.PIPE,
        env=env,
    )
    p.stdin.write(key_line())
    p.stdin.close()
    port = int(p.stderr.readline().split()[1])
    f, bad = Frames(), Frames(OTHER)
    send(port, f.frame(b"a" * 1000), bad.frame(b"b" * 1000), f.end())
    rc, err = ended(p, out)
    assert rc == receiver.REFUSED and "nothing loaded" in err, err
    assert not (tmp_path / "loaded.tar").exists()
    if (tmp_path / "loading").exists():  # killed mid-way: what it had read is the head's frame only
        assert b"b" not in (tmp_path / "loading").read_bytes()


def _weights_receiver(tmp_path):
    cmd = hfcache.receive_command(str(tmp_path / "cache"), "org/m", "127.0.0.1", "127.0.0.1")
    return start(["bash", "-c", cmd], tmp_path)


def _opened(name: str, size: int) -> bytes:
    return (
        weights_send.HEAD.pack(b"F", 0, weights_send.SIZE.size + len(name))
        + weights_send.SIZE.pack(size)
        + name.encode()
    )


@pytest.mark.parametrize("case", ["forged chunk", "chunk under another key", "oversized name record"])
def test_the_weights_cache_gets_nothing_from_a_frame_that_is_not_the_heads(tmp_path, case):
    data = os.urandom(5000)
    name = hashlib.sha256(data).hexdigest()
    p, port, out = _weights_receiver(tmp_path)
    f = Frames()
    chunk = weights_send.HEAD.pack(b"D", 0, len(data)) + data
    if case == "forged chunk":
        good = f.frame(chunk)
        wire = [f.frame(_opened(name, len(data))), good[:20] + bytes([good[20] ^ 1]) + good[21:]]
    elif case == "chunk under another key":
        wire = [f.frame(_opened(name, len(data))), Frames(OTHER).frame(chunk)]
    else:  # a name record that claims 4 GiB: refused on its head, nothing allocated for it
        wire = [f.frame(weights_send.HEAD.pack(b"F", 0, 0xFFFFFFF0) + b"x" * 16)]
    send(port, *wire, f.frame(weights_send.HEAD.pack(b"E", 0, 0)), f.end())
    rc, err = ended(p, out)
    assert rc == receiver.REFUSED, err
    inc = tmp_path / "cache" / "hub" / hfcache.repo_folder("org/m") / ".sparkcluster-incoming"
    files = {x.name: x.read_bytes() for x in inc.iterdir() if x.is_file()} if inc.exists() else {}
    # the head's "F" frame may have opened the file's part; no byte of the refused chunk is in it
    assert not files.get(name) and all(not v for k, v in files.items() if k.startswith(name)), files


def test_the_weights_stream_arrives_under_the_key(tmp_path):
    data = os.urandom(5000)
    name = hashlib.sha256(data).hexdigest()
    p, port, out = _weights_receiver(tmp_path)
    f = Frames()
    chunk = weights_send.HEAD.pack(b"D", 0, len(data)) + data
    send(port, f.frame(_opened(name, len(data))), f.frame(chunk), f.frame(weights_send.HEAD.pack(b"E", 0, 0)), f.end())
    rc, err = ended(p, out)
    assert rc == 0, err
    inc = tmp_path / "cache" / "hub" / hfcache.repo_folder("org/m") / ".sparkcluster-incoming"
    assert (inc / name).read_bytes() == data


def test_a_senders_frames_carry_the_key_from_its_stdin_in_sequence(tmp_path):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    payload = os.urandom(3 * (1 << 20) + 5)
    snd = subprocess.Popen(
        programs.argv(
            transfer.STREAM_SENDER, "127.0.0.1", str(srv.getsockname()[1]), "127.0.0.1", python=sys.executable
        ),
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    snd.stdin.write(key_line() + payload)
    snd.stdin.close()
    c, _ = srv.accept()
    r = c.makefile("rb")
    seal, got = framing.Seal(KEY), b""
    while True:
        n = struct.unpack(">I", r.read(4))[0]
        assert n <= framing.MAX_FRAME
        data = r.read(n)
        assert r.read(framing.TAG) == seal.tag(n, data)
        if not n:
            break
        got += data
    r.close()
    c.close()
    assert snd.wait(timeout=30) == 0
    srv.close()
    assert got == payload


def test_a_sender_without_a_key_sends_nothing():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    srv.settimeout(0.5)
    got = subprocess.run(
        programs.argv(
            transfer.STREAM_SENDER, "127.0.0.1", str(srv.getsockname()[1]), "127.0.0.1", python=sys.executable
        ),
        input=b"no key here\n",
        capture_output=True,
        timeout=30,
    )
    assert got.returncode == 2 and b"no stream key" in got.stderr and b"Traceback" not in got.stderr
    with pytest.raises(TimeoutError):
        srv.accept()
    srv.close()
