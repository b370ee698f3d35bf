"""One stream of bytes from the head along one or more nodes, run the same way for the image and
for the weights: the receivers started first, from the chain's tail back (a relay must know its
downstream's port before it announces its own), the one sender started against the first
receiver's announced port, its byte count followed for the progress bar, every end waited for,
and one rule (`culprit`) for the node a failed stream names. A single worker is a chain of one
hop (`chain.control`), so the single send and the chain are one choreography.

Every stream gets a key of its own (`new_key`), written as the first line of every end's stdin
over its SSH channel right after it starts (never in argv, a log or the dry run): the sender tags
each frame with it and each receiver refuses a frame whose tag does not match before any of its
bytes reach `docker load` or the cache (programs/framing).

What moves stays with the stage: it gives the command each end runs, and words a failed
transfer with what it knows (an image left behind, the files still missing).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from sparkcluster.errors import StageError, StepFailure
from sparkcluster.movement import transfer
from sparkcluster.movement.chain import Hop
from sparkcluster.programs import framing


@dataclass(frozen=True)
class Streamed:
    """A finished stream: the bytes the sender sent, how long it took, each end's result, and the
    node to name when it failed (None when every end succeeded)."""

    hops: list[Hop]
    sent: int
    secs: float
    sender: object  # the sender's CommandResult
    receivers: dict[str, object]  # node -> its receiver's CommandResult, in chain order
    blame: str | None
    first_s: float | None = None  # seconds from the sender's start to its first byte (None: it sent none)
    counts: dict[str, tuple[int, int]] = field(default_factory=dict)  # the sender's "@@<what> N BYTES" lines
    source: str = ""  # what the sender read, when the stage says (the image: "store" or "save")

    @property
    def result(self):
        """The blamed end's result (the sender's when the head is blamed)."""
        return self.sender if self.blame == self.hops[0].src else self.receivers[self.blame]

    @property
    def upstream(self) -> Hop | None:
        """The hop into the blamed node; None when the head is blamed."""
        return next((h for h in self.hops if h.dst == self.blame), None)

    @property
    def cut(self) -> list[str]:
        """The nodes after the blamed one whose stream was cut under them: they loaded nothing."""
        order = [h.dst for h in self.hops]
        after = order[order.index(self.blame) + 1 :] if self.blame in order else order
        return [n for n in after if self.receivers[n].exit_code == transfer.STREAM_CUT]

    def failure(self, stage: str, step: str, reason: str, source: str) -> StageError:
        """The stage's failure naming the blamed node, its command and last lines, and where to
        look: its disk and the link into it, or for the head, `source` (what its sender reads)
        and its link to the first node."""
        bad, res, up, first = self.blame, self.result, self.upstream, self.hops[0]
        fix = (
            f"check free disk on {bad} and the link between {up.src} and {bad} ({up.via})"
            if up
            else f"check {source} on {bad} and the link between {bad} and {first.dst} ({first.via})"
        ) + ", then sparkcluster up"
        return StageError(stage, [StepFailure(bad, step, reason, res.command[:160], res.tail(), fix)], fix)

    @property
    def rate(self) -> str:
        return f"{self.sent / 1e6:.1f} MB in {self.secs:.1f}s, {self.sent / 1e6 / max(self.secs, 1e-3):.1f} MB/s"


def run(
    stage: str,
    hosts: Mapping[str, object],
    hops: list[Hop],
    receive: Callable[[Hop, str | None], str],
    send: Callable[[int | None], str],
    on_sent: Callable[[int], None],
    sink: str,
    timeout: float,
    port_on_stdin: bool = False,
) -> Streamed:
    """Streams along `hops` (head first). `receive(hop, forward)`: the shell command of hop.dst's
    receiver (`forward`: its relay argument, None at the chain's end); `send(port)`: the head's
    sender to the first receiver's port; `sink`: what each receiver feeds (for a failure's
    command). A receiver that does not start fails here, naming its node. `port_on_stdin`: the
    sender (`send(None)`) starts first and reads the port from its stdin's first line, so that its
    own start (a container's, for the image's layer store: 0.5 s on the testbed) overlaps the
    receivers' (issue 40 item 7)."""
    procs: dict[str, object] = {}
    port = 0
    key = new_key()
    snd, t0 = None, time.monotonic()
    if port_on_stdin:
        snd = hosts[hops[0].src].start(transfer.bash(send(None)), timeout=timeout)
        hand_key(snd, key)
    for i in reversed(range(len(hops))):
        h, nxt = hops[i], (hops[i + 1] if i + 1 < len(hops) else None)
        fwd = transfer.next_hop(nxt.dst_ip, port, nxt.src_ip) if nxt else None
        recv = hosts[h.dst].start(transfer.bash(receive(h, fwd)), timeout=timeout)
        hand_key(recv, key)
        procs[h.dst] = recv
        got = announced_port(recv)
        if got is None:
            res = recv.wait()
            for n, p in procs.items():  # they would wait a minute for a sender that never comes
                if n != h.dst:
                    p.close()
            if snd is not None:  # its stdin ends: it reads no port, and exits
                snd.close()
            raise _did_not_start(stage, h, nxt, port, res, f"python3 receiver (runs {sink}{', relays' if nxt else ''})")
        port = got
    if snd is None:
        t0 = time.monotonic()
        snd = hosts[hops[0].src].start(transfer.bash(send(port)), timeout=timeout)
        hand_key(snd, key)
    else:
        try:
            snd.write(f"{port}\n")
        except OSError:  # it ended already: its result says why
            pass
    followed = follow_sender(snd, on_sent)
    sres = snd.wait()
    if port_on_stdin and not sres.ok and followed.first is None:
        # it ended before its first byte, perhaps before it connected (its container did not
        # start): the first receiver would wait a minute for it, then fail as its own fault
        first = hops[0]
        hosts[first.src].run(
            transfer.bash(transfer.hang_up_command(first.dst_ip, port, first.src_ip)), timeout=30, warn=True
        )
    results = {h.dst: procs[h.dst].wait() for h in hops}
    secs = time.monotonic() - t0
    bad = culprit(sres.ok, [(h.dst, results[h.dst].exit_code) for h in hops], hops[0].src)
    first = None if followed.first is None else followed.first - t0
    return Streamed(hops, followed.sent, secs, sres, results, bad, first, followed.counts)


def new_key() -> str:
    """A stream's own key (programs/framing), hex: one per stream, so a frame of one stream is
    refused in any other, this run's or another's."""
    return secrets.token_hex(framing.KEY_BYTES)


def hand_key(proc, key: str) -> None:
    """`key` as the first line of a started end's stdin. An end that already ended says why in its
    result."""
    try:
        proc.write(f"{key}\n")
    except OSError:
        pass


def _did_not_start(stage: str, h: Hop, nxt: Hop | None, port: int, res, command: str) -> StageError:
    if res.exit_code == transfer.RELAY_FAILED and nxt:
        what = f"{h.dst} cannot reach {nxt.dst} at {nxt.dst_ip}:{port} from {nxt.src_ip}"
        fix = f"check the link between {h.dst} and {nxt.dst} ({nxt.via}), then sparkcluster up"
        return StageError(stage, [StepFailure(h.dst, "start the relay", what, command, res.tail(), fix)], fix)
    return StageError(
        stage, [StepFailure(h.dst, "start the receiver", "the receiver did not start", command, res.tail())]
    )


def culprit(sender_ok: bool, codes: list[tuple[str, int]], head: str) -> str | None:
    """The node to name for a stream that failed, or None when every hop succeeded. `codes`: each
    receiver's exit status in chain order. A failure of a node's own (its sink, the node lost)
    comes first; then the head's sender (everything after it is only cut); then a relay that could
    not forward; then the first node whose stream was cut under it."""
    own = [n for n, c in codes if c not in (0, transfer.STREAM_CUT, transfer.RELAY_FAILED)]
    if own:
        return own[0]
    if not sender_ok:
        return head
    for want in (transfer.RELAY_FAILED, transfer.STREAM_CUT):
        hit = [n for n, c in codes if c == want]
        if hit:
            return hit[0]
    return None


def announced_port(recv) -> int | None:
    """The port a started receiver listens on ("@@port N" on its stderr), or None when it ended first."""
    for line in recv.stderr_lines():
        if line.startswith("@@port "):
            return int(line.split()[1])
    return None


@dataclass
class Followed:
    """What a sender said on stderr: its last byte count, when its first bytes left (monotonic),
    and its other counts ("@@dropped N BYTES": layers left out; "@@hashed N BYTES": layers it had
    to read in full to learn which they were)."""

    sent: int = 0
    first: float | None = None
    counts: dict[str, tuple[int, int]] = field(default_factory=dict)


def follow_sender(snd, on_sent) -> Followed:
    """Reads a sender's "@@" lines until it ends, calling on_sent(N) for each "@@sent N"."""
    f = Followed()
    for line in snd.stderr_lines():
        if line.startswith("@@sent "):
            f.sent = int(line.split()[1])
            if f.first is None and f.sent:
                f.first = time.monotonic()
            on_sent(f.sent)
        elif line.startswith("@@"):
            w = line[2:].split()
            if len(w) == 3 and w[1].isdigit() and w[2].isdigit():
                f.counts[w[0]] = (int(w[1]), int(w[2]))
    return f
