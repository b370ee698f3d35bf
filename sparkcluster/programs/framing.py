"""What every sender starts with: the one connection from the sender's own address to the
receiver's announced port (argv[1:4]: the receiver's address and port, the sender's address).

The stream is framed so the receiver can tell a finished archive from a connection that broke, and
so that it can tell the head's bytes from anyone else's: each frame is a 4-byte length, the data,
then a tag, HMAC-SHA256 under the run's stream key over the frame's sequence number, its length and
its data (`Seal`); a zero length ends the stream, and the end frame is tagged too. The key (KEY_BYTES
random bytes, hex) is the first line of every end's stdin, put there by the controller over SSH
(movement/stream), never in argv; a sender whose stdin also carries its data (docker save, the
weights' names) reads the key line first, the data after it. A receiver (receiver.Frames) checks each
tag before any byte of the frame reaches its sink, so a frame forged, replayed, reordered, cut or
sent under another key is refused; a length over MAX_FRAME is refused before anything is read.

`out` sends one frame and says "@@sent N" on stderr at most four times a second, for the
controller's progress bar; `pump` frames a file to its end; `finish` sends the end frame and waits
for the receiver to close, which it does once its own sink and the next hop's are done. A port "-"
is read from the line after the key: a sender that takes a while to start (a container) starts
before the receivers have announced theirs (stream.run's `port_on_stdin`). An argument "rate=N" caps
the stream at N bytes a second (issue 40: a replication must not starve an engine serving on the
same nodes): after each frame the sender sleeps until the bytes sent fit the cap since the start,
so the link and the receivers' disks see at most that rate, averaged over a frame (1 MiB).
"""

import hashlib
import hmac
import mmap
import socket
import struct
import sys
import time

from sparkcluster.programs.pipes import wide_pipe

KEY_BYTES = 32
TAG = 32  # HMAC-SHA256's digest
LENGTH = struct.Struct(">I")
SEQ = struct.Struct(">QI")  # what each tag covers before the data: the frame's number and its length
# the largest frame a receiver takes: a weights chunk (4 MiB) with its record's head; the image's
# frames are 1 MiB. A longer one is refused before anything is read (the length field allows 4 GiB)
MAX_FRAME = (1 << 22) + 64


class BadKey(ValueError):
    pass


def read_key(inp):
    """The run's stream key: the first line of `inp` (a binary stream), KEY_BYTES bytes in hex."""
    line = inp.readline(4 * KEY_BYTES)
    try:
        key = bytes.fromhex(line.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        key = b""
    if len(key) != KEY_BYTES:
        raise BadKey("no stream key on the first line of stdin")
    return key


class Seal:
    """The tags of one direction of one stream, frame after frame: HMAC-SHA256(key, seq, length,
    data), seq counting from 0. `begin` starts a frame's tag, `update` takes its data as it goes
    (memoryviews: nothing copied), `digest` ends it and counts the frame."""

    def __init__(self, key):
        self.base = hmac.new(key, digestmod=hashlib.sha256)
        self.seq, self.h = 0, None

    def begin(self, n):
        self.h = self.base.copy()
        self.h.update(SEQ.pack(self.seq, n))

    def update(self, b):
        self.h.update(b)

    def digest(self):
        d, self.h = self.h.digest(), None
        self.seq += 1
        return d

    def tag(self, n, *parts):
        self.begin(n)
        for p in parts:
            self.update(p)
        return self.digest()

    def start(self, n):
        """The next frame's tag begun (its number and length taken) and handed out, to be finished
        elsewhere (a thread of a pool: `file_tag`, receiver's `verify`); the frame is counted."""
        h = self.base.copy()
        h.update(SEQ.pack(self.seq, n))
        self.seq += 1
        return h


def file_tag(h, head, f, offset, n):
    """A frame's tag (`h` from Seal.start) over `head` and `n` bytes of the open file `f` from
    `offset`, read from the file's pages mapped (never copied); hashlib leaves the GIL meanwhile, so
    a pool's threads tag several frames at once."""
    h.update(head)
    if n:
        start = offset - offset % mmap.ALLOCATIONGRANULARITY
        with mmap.mmap(f.fileno(), offset + n - start, access=mmap.ACCESS_READ, offset=start) as m:
            with memoryview(m) as mv:
                h.update(mv[offset - start :])
    return h.digest()


class Sender:
    def __init__(self, argv):
        dst, port, src = argv[1], argv[2], argv[3]
        self.inp = sys.stdin.buffer
        try:
            self.seal = Seal(read_key(self.inp))
        except BadKey as e:
            print(f"send: {e}; nothing sent", file=sys.stderr, flush=True)
            sys.exit(2)
        port = int(self.inp.readline(32) if port == "-" else port)  # "-": the line after the key (stream.run)
        self.rate = next((float(a[5:]) for a in argv[4:] if a.startswith("rate=")), 0.0)
        self.s = socket.create_connection((dst, port), timeout=30, source_address=(src, 0))
        self.s.settimeout(600)
        wide_pipe(self.inp)  # a producer piped in (docker save, tar) hands over 1 MiB at a time
        self.sent, self.last, self.began = 0, 0.0, time.monotonic()

    def out(self, b):
        mv = memoryview(b)
        while len(mv):
            part, mv = mv[:MAX_FRAME], mv[MAX_FRAME:]
            self.send_frame(part, self.seal.tag(len(part), part))

    def send_frame(self, b, tag):
        """One frame whose tag is made (its number taken from this sender's Seal, in order)."""
        self.s.sendall(LENGTH.pack(len(b)))
        self.s.sendall(b)
        self.s.sendall(tag)
        self.counted(len(b))

    def out_file(self, head, f, offset, n):
        """One frame of `head` then `n` bytes of the open file `f` from `offset`, tagged here."""
        self.send_file(head, f, offset, n, file_tag(self.seal.start(len(head) + n), head, f, offset, n))

    def send_file(self, head, f, offset, n, tag):
        """One frame of `head` then `n` bytes of the open file `f` from `offset`, the file's part sent
        by the kernel (sendfile: never copied through this process), then its tag (made already)."""
        if len(head) + n > MAX_FRAME:
            raise ValueError(f"a frame of {len(head) + n} bytes")
        self.s.sendall(LENGTH.pack(len(head) + n) + head)
        if n and self.s.sendfile(f, offset, n) != n:
            raise OSError(f"{f.name} ended before its {offset + n} bytes")
        self.s.sendall(tag)
        self.counted(len(head) + n)

    def counted(self, n):
        """`n` more bytes sent: paced to the cap, and said at most four times a second."""
        self.sent += n
        now = time.monotonic()
        if self.rate > 0 and self.sent / self.rate > now - self.began:
            time.sleep(self.sent / self.rate - (now - self.began))
            now = time.monotonic()
        if now - self.last > 0.25:
            print(f"@@sent {self.sent}", file=sys.stderr, flush=True)
            self.last = now

    def pump(self, f):
        while True:
            b = f.read(1 << 20)
            if not b:
                break
            self.out(b)

    def finish(self):
        self.s.sendall(LENGTH.pack(0) + self.seal.tag(0))
        self.s.shutdown(socket.SHUT_WR)
        self.s.recv(1)
        print(f"@@sent {self.sent}", file=sys.stderr, flush=True)
