"""The receiver as a relay (issue 27): the real RECEIVER and sender snippets chained over loopback
addresses (127.0.0.1 the head, .2, .3, .4 the workers), each hop accepting only its upstream's
address and forwarding every frame to the next as it arrives."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time

import pytest
from conftest import STREAM_KEY, StderrLines

from sparkcluster import programs
from sparkcluster.movement import transfer

HEAD = "127.0.0.1"
HOPS = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]

# docker load that keeps what it read only when its input ended cleanly (killed, it leaves nothing)
FAKE_DOCKER = r"""#!/bin/sh
case "$1" in
  load) if [ -n "${FAKE_DOCKER_FULL:-}" ]; then  # its disk fills after 1 MB: it stops reading, fails
          head -c 1000000 >/dev/null; echo "write /var/lib/docker/tmp: no space left on device" >&2; exit 1
        fi
        cat > "$FAKE_DOCKER_DIR/loading" && mv "$FAKE_DOCKER_DIR/loading" "$FAKE_DOCKER_DIR/loaded.tar" ;;
  *) exit 64 ;;
esac
"""


class Proc(StderrLines):
    def __init__(self, cmd: str, env: dict, stdout, stdin=subprocess.DEVNULL, key: str | None = STREAM_KEY):
        super().__init__(transfer.bash(cmd), env=env, stdout=stdout, stdin=stdin, key=key)


@pytest.fixture
def nodes(tmp_path):
    """Per hop: its own folder (stdout sink file, fake docker's output) and environment."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "docker").write_text(FAKE_DOCKER)
    (bindir / "docker").chmod(0o755)
    (bindir / "python3").symlink_to(sys.executable)
    out = []
    for ip in HOPS:
        d = tmp_path / ip
        d.mkdir()
        out.append((d, {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "FAKE_DOCKER_DIR": str(d)}))
    return out


def sender(port: int, src: str = HEAD) -> str:
    return programs.command(transfer.STREAM_SENDER, HOPS[0], str(port), src)


def start_chain(nodes, sink: str | None = "stdout", hops=HOPS, how: str = "") -> tuple[list[Proc], int]:
    """Receivers started from the tail back, each told its downstream's port; returns them in chain
    order and the first hop's port. `how`: the relays' argument relay=HOW (receiver.relay_to)."""
    procs: list[Proc] = []
    port = 0
    for i in reversed(range(len(hops))):
        d, env = nodes[i]
        up = HEAD if i == 0 else hops[i - 1]
        fwd = transfer.next_hop(hops[i + 1], port, hops[i]) if i + 1 < len(hops) else None
        args = [hops[i], up, *(["stdout"] if sink == "stdout" else []), *([fwd] if fwd else [])]
        args += [f"relay={how}"] if how else []
        cmd = programs.command(transfer.RECEIVER, *args)  # the image's receive_command, with a "stdout" sink
        with open(d / "out", "wb") as out:
            p = Proc(cmd, env, stdout=out)
        procs.insert(0, p)
        port = int(p.wait_for("@@port ").split()[1])
    return procs, port


def kill_all(procs):
    for p in procs:
        p.kill()


@pytest.mark.parametrize("how", ["", "splice", "peek"])
def test_a_chain_of_three_delivers_identical_bytes_to_every_hop(nodes, tmp_path, how):
    payload = os.urandom(5 * (1 << 20) + 13)
    procs, port = start_chain(nodes, how=how)
    try:
        send = Proc(sender(port), os.environ, stdout=subprocess.DEVNULL, stdin=subprocess.PIPE)
        send.p.stdin.write(payload)
        send.p.stdin.close()
        assert send.wait() == 0, send.lines
        assert [p.wait() for p in procs] == [0, 0, 0], [p.lines for p in procs]
    finally:
        kill_all(procs)
    for d, _ in nodes:
        assert (d / "out").read_bytes() == payload


def test_a_chain_feeds_docker_load_on_every_hop(nodes, tmp_path):
    payload = os.urandom(2 * (1 << 20))
    procs, port = start_chain(nodes, sink=None)
    try:
        send = Proc(sender(port), os.environ, stdout=subprocess.DEVNULL, stdin=subprocess.PIPE)
        send.p.stdin.write(payload)
        send.p.stdin.close()
        assert send.wait() == 0, send.lines
        assert [p.wait() for p in procs] == [0, 0, 0], [p.lines for p in procs]
    finally:
        kill_all(procs)
    for d, _ in nodes:
        assert (d / "loaded.tar").read_bytes() == payload


@pytest.mark.parametrize("sink", ["stdout", None])
def test_a_sender_killed_mid_way_cuts_every_hop(nodes, sink):
    procs, port = start_chain(nodes, sink=sink)
    try:
        send = Proc(sender(port), os.environ, stdout=subprocess.DEVNULL, stdin=subprocess.PIPE)
        send.p.stdin.write(os.urandom(3 * (1 << 20)))
        send.p.stdin.flush()
        send.wait_for("@@sent ")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (nodes[-1][0] / "out").stat().st_size == 0 and sink:
            time.sleep(0.02)  # the tail has seen bytes: the cut is mid-stream on every hop
        send.p.kill()
        send.wait()
        codes = [p.wait() for p in procs]
    finally:
        kill_all(procs)
    assert codes == [transfer.STREAM_CUT] * 3, [p.lines for p in procs]
    for p in procs:
        assert any("ended before" in line for line in p.lines), p.lines
    if sink is None:  # docker load was stopped on every hop: nothing loaded anywhere
        assert not any((d / "loaded.tar").exists() for d, _ in nodes)


def test_a_next_hop_that_refuses_is_reported_by_the_relay(nodes):
    # the last hop relays to a port where nothing listens: it says so before announcing its own port
    d, env = nodes[0]
    p = Proc(
        transfer.receive_command(HOPS[0], HEAD, transfer.next_hop("127.0.0.9", 9, HOPS[0])),
        env,
        stdout=subprocess.DEVNULL,
    )
    assert p.wait() == transfer.RELAY_FAILED
    assert any(line.startswith("relay: cannot reach the next hop 127.0.0.9:9 from 127.0.0.2") for line in p.lines)
    assert not any(line.startswith("@@port") for line in p.lines)


@pytest.mark.parametrize("how", ["", "splice", "peek"])
def test_a_next_hop_lost_mid_way_is_the_relays_failure_and_its_own_copy_is_whole(nodes, tmp_path, how):
    payload = os.urandom(8 * (1 << 20))
    procs, port = start_chain(nodes, hops=HOPS[:2], how=how)
    try:
        procs[1].p.kill()  # the second hop dies after accepting the relay's connection
        procs[1].wait()
        send = Proc(sender(port), os.environ, stdout=subprocess.DEVNULL, stdin=subprocess.PIPE)
        send.p.stdin.write(payload)
        send.p.stdin.close()
        assert send.wait() == 0, send.lines  # the head's stream to the first hop is whole
        assert procs[0].wait() == transfer.RELAY_FAILED, procs[0].lines
    finally:
        kill_all(procs)
    assert any("stopped taking data" in line for line in procs[0].lines) or any(
        "did not take the end" in line for line in procs[0].lines
    ), procs[0].lines
    assert (nodes[0][0] / "out").read_bytes() == payload


def test_a_relay_accepts_only_its_upstream(nodes, tmp_path):
    procs, port = start_chain(nodes, hops=HOPS[:2])
    try:
        stranger = Proc(sender(port, "127.0.0.7"), os.environ, stdout=subprocess.DEVNULL, stdin=subprocess.PIPE)
        stranger.p.stdin.write(b"not from the head")
        stranger.p.stdin.close()
        stranger.wait()
        time.sleep(0.3)
        assert procs[0].p.poll() is None and procs[1].p.poll() is None
        send = Proc(sender(port), os.environ, stdout=subprocess.DEVNULL, stdin=subprocess.PIPE)
        send.p.stdin.write(b"from the head")
        send.p.stdin.close()
        assert send.wait() == 0
        assert [p.wait() for p in procs] == [0, 0]
    finally:
        kill_all(procs)
    assert [(d / "out").read_bytes() for d, _ in nodes[:2]] == [b"from the head"] * 2


def test_next_hop_refuses_odd_addresses():
    with pytest.raises(ValueError):
        transfer.next_hop("1.2.3.4,5", 1, "5.6.7.8")
    assert transfer.next_hop("1.2.3.4", 40000, "5.6.7.8") == "next=1.2.3.4,40000,5.6.7.8"


def test_the_bench_finds_the_last_receiver_of_a_chain_by_its_command_line():
    """perf/weights_scale.py cuts a replication by killing the receiver that writes the files and
    relays nowhere, found with `pgrep -f` in the first 4 KB of its command line."""
    from perf.weights_scale import LEAF_RECEIVER  # perf's, only for this test
    from sparkcluster.movement import hfcache

    def line(cmd: str) -> str:
        words = shlex.split(cmd)
        i = words.index("python3")
        return " ".join(words[i:])[:4095]

    leaf = hfcache.receive_command("/hf", "org/m", "10.0.0.3", "10.0.0.2")
    relay = hfcache.receive_command(
        "/hf", "org/m", "10.0.0.2", "10.0.0.1", transfer.next_hop("10.0.0.3", 9, "10.0.0.2")
    )
    assert re.search(LEAF_RECEIVER, line(leaf), re.S)
    assert not re.search(LEAF_RECEIVER, line(relay), re.S)


def test_a_sink_that_fails_mid_way_is_that_nodes_own_failure_not_a_cut_stream(nodes):
    """docker load that ends early (its disk full) breaks the receiver's pipe: the node's own failure
    (docker load's status), so the stage names that node, not the head whose sender saw the reset."""
    d, env = nodes[0]
    env = {**env, "FAKE_DOCKER_FULL": "1"}
    procs, port = start_chain([(d, env)], sink=None, hops=HOPS[:1])
    try:
        send = Proc(sender(port), os.environ, stdout=subprocess.DEVNULL, stdin=subprocess.PIPE)
        try:
            send.p.stdin.write(os.urandom(16 * (1 << 20)))
            send.p.stdin.close()
        except BrokenPipeError:
            pass
        send.wait()
        codes = [p.wait() for p in procs]
    finally:
        kill_all(procs)
    assert codes == [1], procs[0].lines
    assert any("sink stopped taking data" in line for line in procs[0].lines), procs[0].lines
    assert transfer.STREAM_CUT not in codes
