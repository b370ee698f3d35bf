"""The one-shot receiver: listens on argv[1] (the node's control-link address), accepts one
connection from argv[2] (the sender's address) only, and writes the framed stream (framing) to its
sink: `docker load` (the image), or "stdout" (a byte pipe). An argument "next=ADDR,PORT,SRC" makes it
a relay, forwarding every frame to the next node's receiver as it arrives. The stream is framed so
the receiver can tell a finished archive from a connection that broke: it then kills docker load
instead of closing its input, since a tar cut at an entry boundary can read as a short but valid
archive. Each frame's tag is checked (framing: HMAC-SHA256 under the run's stream key, the first
line of stdin) before any of its bytes reach the sink: nothing the head did not send reaches
`docker load`. Exit status: STREAM_CUT (75) when the connection ended before the end frame,
RELAY_FAILED (76) when the next hop could not be reached or stopped taking data, REFUSED (77) when a
frame was not the head's (a tag that does not match, a length over framing's MAX_FRAME) or the key
was missing; the nodes after it then see a cut stream.

The weights' receiver (weights_receive) is the same one-shot connection and relay (`accept`,
`Frames`, `Relay`) with the files written in the same process.
"""

import hmac
import socket
import subprocess
import sys

from sparkcluster.programs import framing
from sparkcluster.programs.pipes import wide_pipe

STREAM_CUT = 75
RELAY_FAILED = 76
REFUSED = 77


class Refused(ValueError):
    """A frame that is not the head's: refused before any of its bytes reach a sink."""


class Relay:
    """The connection to the next node of a chain (none at the chain's end). A next hop that stops
    taking data ends the relay, never this node's own copy: `err` says why."""

    def __init__(self, hop):
        self.s, self.err, self.where = None, "", ""
        if hop:
            dst, port, src = hop[0], int(hop[1]), hop[2]
            self.where = f"{dst}:{port}"
            try:
                self.s = socket.create_connection((dst, port), timeout=30, source_address=(src, 0))
                self.s.settimeout(600)
            except OSError as e:
                print(f"relay: cannot reach the next hop {dst}:{port} from {src}: {e}", file=sys.stderr, flush=True)
                sys.exit(RELAY_FAILED)

    def send(self, b):
        if self.s is None:
            return
        try:
            self.s.sendall(b)
        except OSError as e:
            self.err = f"relay: the next hop {self.where} stopped taking data: {e}"
            print(self.err, file=sys.stderr, flush=True)
            self.s.close()
            self.s = None

    def cut(self):
        """The stream ended before its end frame: the next node sees a cut stream too."""
        if self.s is not None:
            self.s.close()
            self.s = None

    def end(self):
        """The end frame passed on; the next node's close awaited by `wait`."""
        if self.s is None:
            return
        try:
            self.s.shutdown(socket.SHUT_WR)
        except OSError as e:
            self.err = f"relay: the next hop {self.where} did not take the end of the stream: {e}"
            print(self.err, file=sys.stderr, flush=True)
            self.s = None

    def wait(self):
        """The next node closes when it is done (its own sink, and its next hop's)."""
        if self.s is not None:
            try:
                self.s.recv(1)
            except OSError:
                pass

    def failed(self, rc):
        """The exit status: this node's own `rc`, else RELAY_FAILED when the chain after it broke."""
        if self.err and not rc:
            print(
                "relay: this node's own copy is complete; the nodes after it did not get theirs",
                file=sys.stderr,
                flush=True,
            )
            return RELAY_FAILED
        return rc


def accept(argv):
    """The relay (argv's "next=ADDR,PORT,SRC", reached before anything is announced), then "@@port N"
    on stderr, then the one connection from the sender's address (argv[2]) on argv[1]."""
    bind, peer = argv[1], argv[2]
    hop = [a[5:].split(",") for a in argv[3:] if a.startswith("next=")]
    s = socket.socket()
    s.bind((bind, 0))
    s.listen(1)
    s.settimeout(60)
    relay = Relay(hop[0] if hop else None)
    print(f"@@port {s.getsockname()[1]}", file=sys.stderr, flush=True)
    while True:
        c, addr = s.accept()
        if addr[0] == peer:
            break
        c.close()
    s.close()
    c.settimeout(600)
    return c, relay


class Frames:
    """The framed stream (framing), a frame at a time: `begin` reads its length (refused past
    framing.MAX_FRAME, before anything else is read), `take` reads its bytes into the caller's
    buffer (recv_into: no copy but the kernel's) and into its tag, `check` reads its tag and refuses
    the frame unless it matches: the caller hands a frame's bytes on only after `check`. Every piece
    is forwarded to the relay as it arrives (each node checks its own copy). The end frame (length
    0) is checked in `begin`, then passed on; EOFError when the connection ended before it."""

    def __init__(self, c, relay, key):
        self.c, self.relay, self.seal = c, relay, framing.Seal(key)
        self.left, self.done = 0, False
        self.head = memoryview(bytearray(framing.LENGTH.size))
        self.tag = memoryview(bytearray(framing.TAG))

    def _fill(self, mv):
        got = 0
        while got < len(mv):
            k = self.c.recv_into(mv[got:])
            if not k:
                raise EOFError
            got += k
        self.relay.send(mv)

    def begin(self):
        """The next frame's length; 0 at the end frame (its tag checked, then passed on)."""
        if self.left or self.seal.h is not None:
            raise Refused("a frame begun before the last was checked")
        self._fill(self.head)
        n = framing.LENGTH.unpack(self.head)[0]
        if n > framing.MAX_FRAME:
            raise Refused(f"a frame of {n} bytes (at most {framing.MAX_FRAME})")
        self.seal.begin(n)
        self.left = n
        if not n:
            self.check()
            self.done = True
            self.relay.end()
        return n

    def take(self, mv):
        """len(mv) more bytes of the open frame into mv, not yet checked."""
        if len(mv) > self.left:
            raise Refused(f"a record of {len(mv)} bytes where its frame has {self.left} left")
        self._fill(mv)
        self.seal.update(mv)
        self.left -= len(mv)

    def check(self):
        """The open frame's tag, read and compared: Refused unless it is the run's."""
        if self.left:
            raise Refused(f"a frame {self.left} bytes longer than its record")
        want = self.seal.digest()
        self._fill(self.tag)
        if not hmac.compare_digest(want, self.tag):
            raise Refused(f"frame {self.seal.seq - 1} does not carry the run's tag (forged, replayed or reordered)")

    def take_raw(self, mv):
        """len(mv) more bytes of the open frame into mv, left out of its tag: the caller checks the
        frame with `detach` and `verify` instead of `check`."""
        if len(mv) > self.left:
            raise Refused(f"a record of {len(mv)} bytes where its frame has {self.left} left")
        self._fill(mv)
        self.left -= len(mv)

    def detach(self):
        """The open frame's tag as far as this end made it (what `take` read), its number and the
        tag that came after it: `verify` finishes it, on a thread of the caller's (hashlib leaves
        the GIL), so this one reads the next frame meanwhile."""
        if self.left:
            raise Refused(f"a frame {self.left} bytes longer than its record")
        h, self.seal.h = self.seal.h, None
        self.seal.seq += 1
        self._fill(self.tag)
        return h, self.seal.seq - 1, bytes(self.tag)

    def read(self, n):
        """Exactly n more bytes of the open frame (a record's head), not yet checked."""
        buf = bytearray(n)
        self.take(memoryview(buf))
        return bytes(buf)


def verify(h, mv, tag):
    """Whether the frame whose tag `h` (Frames.detach) has made so far, with the bytes `mv` that
    take_raw left out of it, carries `tag`."""
    h.update(mv)
    return hmac.compare_digest(h.digest(), tag)


def key_or_exit():
    """The run's stream key from stdin's first line; REFUSED without one."""
    try:
        return framing.read_key(sys.stdin.buffer)
    except framing.BadKey as e:
        print(f"receive: {e}; nothing accepted", file=sys.stderr, flush=True)
        sys.exit(REFUSED)


def main(argv):
    to_stdout = "stdout" in argv[3:]
    key = key_or_exit()
    c, relay = accept(argv)
    frames = Frames(c, relay, key)
    load = None if to_stdout else subprocess.Popen(["docker", "load"], stdin=subprocess.PIPE)
    sink = sys.stdout.buffer if to_stdout else load.stdin
    wide_pipe(sink)
    sink_err, done = "", False
    buf = memoryview(bytearray(framing.MAX_FRAME))
    refused = ""
    try:
        while True:
            n = frames.begin()
            if not n:
                done = True
                break
            frames.take(buf[:n])
            frames.check()
            if sink is not None:
                try:
                    sink.write(buf[:n])
                except OSError as e:
                    sink_err = f"receive: the sink stopped taking data: {e}"
                    print(sink_err, file=sys.stderr, flush=True)
                    sink = None
                    if relay.s is None:
                        break  # nothing left to feed
    except EOFError:
        pass
    except Refused as e:
        refused = f"receive: refused {e}; nothing of it reached the sink"
        print(refused, file=sys.stderr, flush=True)
    except (TimeoutError, OSError) as e:
        print(f"receive: {e}", file=sys.stderr)
    if refused:
        relay.cut()
        if load:
            load.kill()
            load.wait()
            print("receive: docker load stopped, nothing loaded", file=sys.stderr, flush=True)
        sys.exit(REFUSED)
    if not done and sink_err:
        # this node's own sink stopped (docker load ended: no space left, a bad archive) with nothing
        # after it to feed: its own failure, not a cut stream, whatever the sender then saw
        relay.cut()
        rc = load.wait() if load else 0
        sys.exit(rc or 1)
    if not done:
        # closed without the end frame: the next node sees a cut stream and loads nothing either
        relay.cut()
        if load:
            load.kill()
            load.wait()
            print(
                "receive: the stream ended before the archive did; docker load stopped, nothing loaded", file=sys.stderr
            )
        else:
            sys.stdout.flush()
            print("receive: the stream ended before the sender finished", file=sys.stderr)
        sys.exit(STREAM_CUT)
    rc = 0
    if sink is not None:
        try:
            sink.close()
        except OSError as e:
            sink_err = sink_err or f"receive: the sink stopped taking data: {e}"
    if load:
        rc = load.wait()
    if sink_err and not rc:
        rc = 1
    relay.wait()
    sys.exit(relay.failed(rc))


if __name__ == "__main__":
    main(sys.argv)
