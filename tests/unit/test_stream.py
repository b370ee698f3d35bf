"""The stream choreography (movement/stream) with stand-in ends: receivers started from the tail
back, each told its downstream's port, the sender against the first one's; what a receiver that
does not start fails with; the node a failed stream names and what it tells to check. The real
scripts over loopback: test_relay, test_image_send, test_image_chain, test_weights_chain."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sparkcluster.errors import StageError
from sparkcluster.movement import chain, stream, transfer
from sparkcluster.programs import framing

HOPS = [
    chain.Hop("h", "10.0.0.1", "w1", "10.0.0.2", "10.0.0.0/24"),
    chain.Hop("w1", "10.0.0.2", "w2", "10.0.0.3", "10.0.0.0/24"),
    chain.Hop("w2", "10.0.0.3", "w3", "10.0.0.4", "the control link"),
]


class Proc:
    def __init__(self, lines: list[str], code: int):
        self.lines, self.code, self.closed, self.stdin = lines, code, False, []

    def write(self, text: str):
        self.stdin.append(text)

    def stderr_lines(self):
        yield from self.lines

    def wait(self):
        return SimpleNamespace(ok=self.code == 0, exit_code=self.code, command="python3 ...", tail=lambda: "last lines")

    def close(self):
        self.closed = True


class Host:
    def __init__(self, proc: Proc):
        self.proc, self.commands = proc, []

    def start(self, argv, timeout=0):
        self.commands.append(argv[-1])
        return self.proc


def world(codes: dict[str, int], ports: dict[str, int] | None = None, sent: int = 1000):
    ports = {"w1": 4001, "w2": 4002, "w3": 4003} if ports is None else ports
    hosts = {"h": Host(Proc([f"@@sent {sent // 2}", f"@@sent {sent}"], codes.get("h", 0)))}
    for n in ("w1", "w2", "w3"):
        hosts[n] = Host(Proc([f"@@port {ports[n]}"] if ports.get(n) else ["bind failed"], codes.get(n, 0)))
    return hosts


def run(hosts, seen=None):
    return stream.run(
        "image",
        hosts,
        HOPS,
        receive=lambda h, fwd: f"recv {h.dst} {fwd}",
        send=lambda port: f"send {port}",
        on_sent=(seen.append if seen is not None else lambda n: None),
        sink="docker load",
        timeout=60,
    )


def test_receivers_start_from_the_tail_back_each_told_its_downstreams_port():
    hosts, seen = world({}), []
    got = run(hosts, seen)
    assert hosts["w3"].commands == ["recv w3 None"]
    assert hosts["w2"].commands == [f"recv w2 {transfer.next_hop('10.0.0.4', 4003, '10.0.0.3')}"]
    assert hosts["w1"].commands == [f"recv w1 {transfer.next_hop('10.0.0.3', 4002, '10.0.0.2')}"]
    assert hosts["h"].commands == ["send 4001"]
    assert seen == [500, 1000] and got.sent == 1000 and got.blame is None
    assert list(got.receivers) == ["w1", "w2", "w3"]


def test_every_end_gets_the_streams_own_key_on_stdin_and_never_in_a_command():
    """The stream's key (programs/framing) reaches each end as the first line of its stdin, one key
    for all of a stream's ends, another for the next stream, in no command line."""
    keys = []
    for _ in range(2):
        hosts = world({})
        run(hosts)
        got = {n: h.proc.stdin for n, h in hosts.items()}
        assert all(len(lines) == 1 and lines[0].endswith("\n") for lines in got.values()), got
        key = got["h"][0].strip()
        assert len(bytes.fromhex(key)) == framing.KEY_BYTES and {v[0] for v in got.values()} == {key + "\n"}
        assert not any(key in c for h in hosts.values() for c in h.commands)
        keys.append(key)
    assert keys[0] != keys[1]


def test_a_relay_that_cannot_reach_its_next_hop_names_the_link_and_ends_the_others():
    hosts = world({"w2": transfer.RELAY_FAILED}, ports={"w3": 4003})
    with pytest.raises(StageError) as e:
        run(hosts)
    f = e.value.failures[0]
    assert (f.host, f.step) == ("w2", "start the relay")
    assert f.reason == "w2 cannot reach w3 at 10.0.0.4:4003 from 10.0.0.3"
    assert "the link between w2 and w3 (the control link)" in f.fix
    assert hosts["w3"].proc.closed and hosts["h"].commands == [] and hosts["w1"].commands == []


def test_a_receiver_that_does_not_start_says_so():
    hosts = world({"w3": 1}, ports={})
    with pytest.raises(StageError) as e:
        run(hosts)
    f = e.value.failures[0]
    assert (f.host, f.step, f.reason) == ("w3", "start the receiver", "the receiver did not start")
    assert f.command == "python3 receiver (runs docker load)"


def test_a_node_of_its_own_failing_is_named_with_the_link_into_it_and_those_cut_after():
    got = run(world({"w2": 1, "w3": transfer.STREAM_CUT}))
    assert got.blame == "w2" and got.cut == ["w3"] and got.upstream == HOPS[1] and got.result.exit_code == 1
    e = got.failure("image", "send the image", "transfer failed", "`docker save img`")
    f = e.failures[0]
    assert (f.host, f.step, f.output_tail) == ("w2", "send the image", "last lines")
    assert f.fix == "check free disk on w2 and the link between w1 and w2 (10.0.0.0/24), then sparkcluster up"


def test_a_failed_sender_is_the_heads_and_points_at_what_it_reads():
    got = run(world({"h": 1, "w1": transfer.STREAM_CUT, "w2": transfer.STREAM_CUT, "w3": transfer.STREAM_CUT}))
    assert got.blame == "h" and got.upstream is None and got.cut == ["w1", "w2", "w3"]
    f = got.failure("image", "send the image", "transfer failed", "`docker save img`").failures[0]
    assert f.fix == "check `docker save img` on h and the link between h and w1 (10.0.0.0/24), then sparkcluster up"
