"""A weights relay that forwards without copying the stream through itself (programs/receiver's
`Spliced` and `Peeked`, the argument relay=splice or relay=peek, issue 77) against the one that
receives each piece and sends it on (`Relay`: the default, and what the probe falls back to where
there is no splice or tee): the same bytes reach every node of a chain, a frame that is not the
head's is refused by the relay and its next hop alike, and a cut chain resumes. The fallback runs
with os.splice taken away before the relay starts (a sitecustomize on its PYTHONPATH), as on a
Python older than 3.10: the program's own probe then picks the copy."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from test_stream_auth import Frames, _opened
from test_weights import KEY, TINY, _receive, _sent, _shards, check, keyed, sh

from sparkcluster.movement import hfcache, transfer
from sparkcluster.programs import receiver, weights_send
from sparkcluster.programs.weights_receive import RECEIVED

IP = "127.0.0.1"
NO_SPLICE = "import os\ndel os.splice\n"


@pytest.fixture
def without_splice(tmp_path) -> dict:
    """An environment whose Pythons have no os.splice."""
    d = tmp_path / "nosplice"
    d.mkdir()
    (d / "sitecustomize.py").write_text(NO_SPLICE)
    return {**os.environ, "PYTHONPATH": str(d)}


def _relay(cache: Path, next_port: int, env: dict | None = None, how: str = "") -> tuple[subprocess.Popen, int]:
    """A weights relay to `next_port`; `how`: its argument relay=HOW (receiver.relay_to)."""
    cmd = hfcache.receive_command(str(cache), TINY, IP, IP, transfer.next_hop(IP, next_port, IP))
    if how:  # the program's own argument, after the incoming folder (as perf/weights_gpu's `variant`)
        a, sep, b = cmd.rpartition(".sparkcluster-incoming ")
        cmd = f"{a}{sep}relay={how} {b}"
    p = keyed(subprocess.Popen(["bash", "-c", cmd], stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    return p, int(p.stderr.readline().split()[1])


def _incoming(cache: Path) -> dict[str, bytes]:
    inc = Path(hfcache.incoming_dir(str(cache), TINY))
    return {p.name: p.read_bytes() for p in inc.iterdir() if p.name != RECEIVED} if inc.exists() else {}


def _chain(tmp_path, m, head, name: str, env: dict | None, how: str) -> dict[str, dict[str, bytes]]:
    """head -> relay -> leaf, the relay's environment `env`, its argument relay=`how`; what each wrote."""
    leaf_cache, relay_cache = tmp_path / f"{name}-leaf", tmp_path / f"{name}-relay"
    leaf, lport = _receive(leaf_cache)
    relay, rport = _relay(relay_cache, lport, env, how)
    snd = sh(hfcache.send_command(str(head), TINY, [f.blob for f in m.files], IP, rport, IP), stdin=KEY)
    assert snd.returncode == 0, snd.stderr
    assert relay.wait(timeout=60) == 0, relay.stderr.read()
    assert leaf.wait(timeout=60) == 0, leaf.stderr.read()
    for cache in (relay_cache, leaf_cache):
        done = check(cache, m)
        assert done["missing"] == [] and done["adopted"] == len(m.files) and done["corrupt"] == []
    return {"relay": _blobs(relay_cache), "leaf": _blobs(leaf_cache)}


def _blobs(cache: Path) -> dict[str, bytes]:
    """The files `check` adopted into the cache's blobs."""
    return {p.name: p.read_bytes() for p in Path(hfcache.blobs_dir(str(cache), TINY)).iterdir()}


def test_this_machine_splices_and_a_python_without_splice_does_not():
    assert receiver.spliceable() and receiver.spliceable(receiver._libc_tee())  # Linux 2.6.17, Python 3.10
    probe = "from sparkcluster.programs import receiver as r\nprint(r.spliceable(), r.spliceable(r._libc_tee()))"
    got = subprocess.run([sys.executable, "-c", NO_SPLICE + probe], capture_output=True, text=True)
    assert got.stdout.split() == ["False", "False"], got.stderr


def test_the_splicing_relays_and_the_copying_ones_deliver_the_same_bytes(tmp_path, without_splice):
    """Files of several chunks and an unaligned tail through a chain whose relay splices and tees,
    one whose relay peeks and splices, one whose relay was asked to splice on a Python without
    os.splice (the probe's fallback), and one whose relay copies (the default): every copy is the
    head's, byte for byte, adopted by `check`."""
    m, head = _shards(tmp_path, n=3, size=9 * 2**20 + 5)
    blobs = Path(hfcache.blobs_dir(str(head), TINY))
    want = {f.blob: (blobs / f.blob).read_bytes() for f in m.files}
    got = [
        _chain(tmp_path, m, head, "spliced", None, "splice"),
        _chain(tmp_path, m, head, "peeked", None, "peek"),
        _chain(tmp_path, m, head, "fallback", without_splice, "splice"),
        _chain(tmp_path, m, head, "copied", None, ""),
    ]
    for g in got:
        assert g["relay"] == g["leaf"] == want


def _spliced_pair(data: bytes, how: str):
    """A relay (relay_to's `how`) in this process between a socket pair's far end (upstream) and a
    listener (the next hop): what fill() returned, and what the next hop received."""
    lst = socket.create_server((IP, 0))
    up, down = socket.socketpair()
    relay = receiver.relay_to([IP, str(lst.getsockname()[1]), IP], how)
    nxt, _ = lst.accept()
    got_next = []
    t = threading.Thread(target=lambda: got_next.append(nxt.makefile("rb").read()))
    t.start()
    threading.Thread(target=lambda: (up.sendall(data), up.shutdown(socket.SHUT_WR))).start()
    down.settimeout(10)
    buf = memoryview(bytearray(len(data)))
    for off in range(0, len(data), 3 * 2**20 + 1):  # pieces that do not match the pipe's size
        relay.fill(down, buf[off : off + 3 * 2**20 + 1])
    relay.end()
    t.join(10)
    nxt.close()
    relay.wait()
    for s in (lst, up, down):
        s.close()
    return relay, bytes(buf), got_next[0]


@pytest.mark.parametrize("how, kind", [("splice", receiver.Spliced), ("peek", receiver.Peeked)])
def test_a_splicing_relay_reads_its_own_copy_and_forwards_the_same_bytes(how, kind):
    data = os.urandom(7 * 2**20 + 3)
    relay, mine, forwarded = _spliced_pair(data, how)
    assert type(relay) is kind
    assert mine == data and forwarded == data and relay.err == ""


@pytest.mark.parametrize("how", ["splice", "peek"])
def test_a_tampered_chunk_is_refused_by_a_splicing_relay_and_its_next_hop(tmp_path, how):
    """A chunk whose bytes were changed on the wire: the relay refuses it before writing any of it and
    cuts the chain; its next hop, which got the chunk as it arrived, refuses it too or sees the cut.
    Neither keeps a byte of it."""
    data = os.urandom(3 * 2**20)
    name = hashlib.sha256(data).hexdigest()
    leaf_cache, relay_cache = tmp_path / "leaf", tmp_path / "relay"
    leaf, lport = _receive(leaf_cache)
    relay, rport = _relay(relay_cache, lport, how=how)
    f = Frames()
    chunk = bytearray(f.frame(weights_send.HEAD.pack(b"D", 0, len(data)) + data))
    chunk[2**20] ^= 1
    wire = [f.frame(_opened(name, len(data))), bytes(chunk), f.frame(weights_send.HEAD.pack(b"E", 0, 0)), f.end()]
    with socket.create_connection((IP, rport), timeout=10, source_address=(IP, 0)) as s:
        for part in wire:
            try:
                s.sendall(part)
            except OSError:
                break
        try:
            s.shutdown(socket.SHUT_WR)
            s.recv(1)
        except OSError:
            pass
    assert relay.wait(timeout=30) == receiver.REFUSED, relay.stderr.read()
    assert leaf.wait(timeout=30) in (receiver.REFUSED, receiver.STREAM_CUT)
    for cache in (relay_cache, leaf_cache):
        got = _incoming(cache)
        assert not got.get(name) and all(not v for k, v in got.items() if k.startswith(name)), got


@pytest.mark.parametrize("how", ["splice", "peek"])
def test_a_chain_cut_mid_way_through_a_splicing_relay_resumes_with_only_what_is_missing(tmp_path, how):
    """The sender killed mid-way (paced by a cap): the relay and its leaf both see a cut stream, each
    `check` adopts the files that arrived whole, and the next run along the chain sends only what is
    missing; then both snapshots are complete."""
    m, head = _shards(tmp_path, n=6, size=2**20 + 7)
    leaf_cache, relay_cache = tmp_path / "leaf", tmp_path / "relay"
    need = [f.blob for f in m.files]
    leaf, lport = _receive(leaf_cache)
    relay, rport = _relay(relay_cache, lport, how=how)
    snd = keyed(
        subprocess.Popen(
            ["bash", "-c", hfcache.send_command(str(head), TINY, need, IP, rport, IP, rate=4e6)],
            stdin=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
    )
    for line in snd.stderr:
        if line.startswith("@@sent ") and int(line.split()[1]) >= 2.5e6:
            os.killpg(snd.pid, 9)
            break
    snd.wait()
    assert relay.wait(timeout=30) == transfer.STREAM_CUT and leaf.wait(timeout=30) == transfer.STREAM_CUT
    after = [check(c, m) for c in (relay_cache, leaf_cache)]
    for got in after:
        assert 1 <= got["adopted"] < 6 and got["corrupt"] == []
    missing = sorted(set(after[0]["missing"]) | set(after[1]["missing"]))
    leaf, lport = _receive(leaf_cache)
    relay, rport = _relay(relay_cache, lport, how=how)
    snd = sh(hfcache.send_command(str(head), TINY, missing, IP, rport, IP), stdin=KEY)
    assert snd.returncode == 0 and relay.wait(timeout=30) == 0 and leaf.wait(timeout=30) == 0, snd.stderr
    assert _sent(snd.stderr) < len(missing) * (2**20 + 7 + 100) + 100  # the missing files and their heads
    for cache in (relay_cache, leaf_cache):
        done = check(cache, m)
        assert done["missing"] == [] and done["present_bytes"] == m.size, json.dumps(done)
