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

A relay receives each piece of the stream into its buffer and sends it on from there (`Relay`). Two
arguments make it forward without the bytes passing through the process, where `spliceable` has
seen splice (and tee) work on this machine, else it is `Relay` as before: "relay=splice"
(`Spliced`: the connection spliced into a pipe, teed into a second one that a thread splices into
the next hop's socket, the first read into the buffer) and "relay=peek" (`Peeked`: each piece
copied into the buffer with MSG_PEEK, then the same bytes spliced out of the socket, through a pipe,
into the next hop's). Splice and tee move references to the kernel's pages, not the bytes; either
way this node's own copy is the one copy a leaf makes. Measured over loopback (perf/weights_gpu.md,
issue 77), both cost more core-seconds than the copy they save, so the copy stays the default. Every
way, the same bytes reach the next hop, and this node checks every frame's tag itself before any of
its bytes reach its own sink.
"""

import hmac
import os
import select
import socket
import subprocess
import sys
import threading

from sparkcluster.programs import framing
from sparkcluster.programs.pipes import wide_pipe

STREAM_CUT = 75
RELAY_FAILED = 76
REFUSED = 77


class Refused(ValueError):
    """A frame that is not the head's: refused before any of its bytes reach a sink."""


def recv_exact(c, mv):
    """mv filled from the connection `c` (recv_into: no copy but the kernel's); EOFError at its end."""
    got = 0
    while got < len(mv):
        k = c.recv_into(mv[got:])
        if not k:
            raise EOFError
        got += k


class Relay:
    """The connection to the next node of a chain (none at the chain's end). A next hop that stops
    taking data ends the relay, never this node's own copy: `err` says why."""

    hold = None  # weights_receive's chunk whose buffer a queued send still reads (Forward)

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

    def fill(self, c, mv):
        """mv filled from `c`, then passed on to the next hop."""
        recv_exact(c, mv)
        self.send(mv)

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


PIPE = 1 << 20  # each pipe of a spliced relay: Linux's default limit for any user (pipes.wide_pipe)


def _libc_tee():
    """tee(2) from the C library (Python has os.splice but no tee), raising OSError as os does;
    None where there is none."""
    try:
        import ctypes

        fn = ctypes.CDLL(None, use_errno=True).tee
    except (ImportError, OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_size_t, ctypes.c_uint)
    fn.restype = ctypes.c_ssize_t

    def tee(src, dst, n):
        k = fn(src, dst, n, 0)
        if k < 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
        return k

    return tee


def _pipe():
    r, w = os.pipe()
    try:
        import fcntl

        fcntl.fcntl(w, getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE)
    except (ImportError, OSError):
        pass  # the default capacity (64 KiB): smaller pieces, the same bytes
    return r, w


def spliceable(tee=None):
    """Whether this machine splices a socket into a pipe and the pipe into a socket (tried on a socket
    pair, a few bytes), and with `tee` (_libc_tee's) tees the pipe into another one on the way."""
    if not hasattr(os, "splice"):
        return False
    fds = []
    try:
        x, y = socket.socketpair()
        with x, y:
            a, b = _pipe(), _pipe()
            fds = [*a, *b]
            y.sendall(b"probe")
            if os.splice(x.fileno(), a[1], 5) != 5:
                return False
            if tee is not None and (tee(a[0], b[1], 5) != 5 or os.read(a[0], 5) != b"probe"):
                return False
            if os.splice((b if tee is not None else a)[0], x.fileno(), 5) != 5:
                return False
            return y.recv(5) == b"probe"
    except OSError:
        return False
    finally:
        for fd in fds:
            os.close(fd)


def _wait(sock, what):
    """Until `sock` is readable (select.POLLIN) or writable (POLLOUT), at most its timeout."""
    p = select.poll()
    p.register(sock.fileno(), what)
    t = sock.gettimeout()
    if not p.poll(None if t is None else int(t * 1000)):
        raise TimeoutError("timed out")


class Spliced(Relay):
    """A relay whose forwarded bytes never pass through this process (the module's docstring):
    the connection spliced into pipe `a`, `a` teed into pipe `b`, `a` read into the caller's buffer,
    `b` spliced into the next hop's socket by a thread of its own (`forward`), so this node receives
    the next piece while the last goes on. A next hop that stops taking data ends the forwarding,
    as Relay's; the rest of `b` is then read and dropped, so the teeing never waits on it."""

    def __init__(self, hop, tee):
        super().__init__(hop)
        self.tee = tee
        self.a, self.b = _pipe(), _pipe()
        self.teeing, self.cutting = True, False
        self.t = threading.Thread(target=self.forward, daemon=True)
        self.t.start()

    def fill(self, c, mv):
        got = 0
        while got < len(mv):
            while True:
                try:
                    k = os.splice(c.fileno(), self.a[1], min(len(mv) - got, PIPE))
                    break
                except BlockingIOError:  # a socket with a timeout is non-blocking underneath
                    _wait(c, select.POLLIN)
            if not k:
                raise EOFError
            while k:
                t = k
                if self.teeing:
                    try:
                        t = self.tee(self.a[0], self.b[1], k)  # what `b` has room for; the rest after
                    except OSError:
                        t = k  # the thread ended (its end of `b` closed): this node's copy goes on
                    if self.err:
                        self.stop()
                n = 0
                while n < t:
                    n += os.readv(self.a[0], [mv[got + n : got + t]])
                got, k = got + t, k - t

    def forward(self):
        try:
            while True:
                try:
                    if not os.splice(self.b[0], self.s.fileno(), PIPE):
                        break  # `b`'s write end closed: the stream is over, or cut
                except BlockingIOError:
                    _wait(self.s, select.POLLOUT)
            if not self.cutting:
                self.s.shutdown(socket.SHUT_WR)
        except OSError as e:
            if not self.cutting:
                self.err = f"relay: the next hop {self.where} stopped taking data: {e}"
                print(self.err, file=sys.stderr, flush=True)
            while os.read(self.b[0], PIPE):
                pass
        finally:
            os.close(self.b[0])

    def stop(self):
        """No more teeing: `b`'s write end closed, so the thread sees its end."""
        if self.teeing:
            self.teeing = False
            os.close(self.b[1])

    def send(self, b):
        raise AssertionError("a spliced relay takes its bytes in `fill`")

    def cut(self):
        if self.s is not None:
            self.cutting = True  # the thread ends without passing on the end of the stream
            try:
                self.s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.stop()
            self.t.join()
            self.s.close()
            self.s = None

    def end(self):
        """The end frame is in `b`: the thread passes the rest on, then the end of the stream."""
        self.stop()

    def wait(self):
        self.stop()
        self.t.join()
        if self.err and self.s is not None:
            self.s.close()
            self.s = None
        super().wait()


class Peeked(Relay):
    """A relay whose forwarded bytes never pass through this process, and whose own copy is the one
    a leaf makes: each piece is copied into the caller's buffer with MSG_PEEK (left in the socket),
    then those same bytes are spliced out of the socket into a pipe and from the pipe into the next
    hop's socket (references to the kernel's pages, not copies). A next hop that stops taking data
    ends the forwarding, as Relay's; the pieces after it are received as a leaf's."""

    def __init__(self, hop):
        super().__init__(hop)
        self.p = _pipe()

    def fill(self, c, mv):
        got = 0
        while got < len(mv):
            if self.s is None:  # no next hop (any more): received as a leaf's
                recv_exact(c, mv[got:])
                return
            k = c.recv_into(mv[got:], 0, socket.MSG_PEEK)
            if not k:
                raise EOFError
            self.take(c, k)
            got += k

    def take(self, c, k):
        """The `k` bytes at the head of `c` (peeked already) spliced on to the next hop."""
        while k:
            while True:
                try:
                    n = os.splice(c.fileno(), self.p[1], min(k, PIPE))
                    break
                except BlockingIOError:  # not expected: the bytes were peeked
                    _wait(c, select.POLLIN)
            if not n:
                raise EOFError
            k -= n
            try:
                while n:
                    try:
                        n -= os.splice(self.p[0], self.s.fileno(), n)
                    except BlockingIOError:
                        _wait(self.s, select.POLLOUT)
            except OSError as e:
                self.err = f"relay: the next hop {self.where} stopped taking data: {e}"
                print(self.err, file=sys.stderr, flush=True)
                self.s.close()
                self.s = None
                while n:  # what the pipe still holds, dropped; the rest of the piece consumed so
                    n -= len(os.read(self.p[0], n))
                while k:
                    b = c.recv(min(k, PIPE))
                    if not b:
                        raise EOFError from e
                    k -= len(b)
                return

    def send(self, b):
        raise AssertionError("a peeking relay takes its bytes in `fill`")


def relay_to(hop, how=""):
    """The relay for argv's next hop: `how` (argv's "relay=HOW") "splice" or "peek" where this
    machine splices (`spliceable`), else the copy."""
    if hop and how == "peek" and spliceable():
        return Peeked(hop)
    if hop and how == "splice":
        tee = _libc_tee()
        if tee is not None and spliceable(tee):
            return Spliced(hop, tee)
    return Relay(hop)


def accept(argv):
    """The relay (argv's "next=ADDR,PORT,SRC", reached before anything is announced; "relay=HOW":
    how it forwards, `relay_to`), then "@@port N"
    on stderr, then the one connection from the sender's address (argv[2]) on argv[1]."""
    bind, peer = argv[1], argv[2]
    hop = [a[5:].split(",") for a in argv[3:] if a.startswith("next=")]
    s = socket.socket()
    s.bind((bind, 0))
    s.listen(1)
    s.settimeout(60)
    how = next((a[6:] for a in argv[3:] if a.startswith("relay=")), "")
    relay = relay_to(hop[0] if hop else None, how)
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
        self.relay.fill(self.c, mv)

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
