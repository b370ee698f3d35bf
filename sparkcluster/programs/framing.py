"""What every sender starts with: the one connection from the sender's own address to the
receiver's announced port (argv[1:4]: the receiver's address and port, the sender's address).

The stream is framed (4-byte length, then data; a zero length ends it) so the receiver can tell a
finished archive from a connection that broke. `out` sends one frame and says "@@sent N" on stderr
at most four times a second, for the controller's progress bar; `pump` frames a file to its end;
`finish` sends the end frame and waits for the receiver to close, which it does once its own sink
and the next hop's are done. A port "-" is read from the first line of stdin: a sender that takes a
while to start (a container) starts before the receivers have announced theirs (stream.run's
`port_on_stdin`). An argument "rate=N" caps the stream at N bytes a second (issue 40: a replication
must not starve an engine serving on the same nodes): after each frame the sender sleeps until the
bytes sent fit the cap since the start, so the link and the receivers' disks see at most that rate,
averaged over a frame (1 MiB).
"""

import socket
import struct
import sys
import time

from sparkcluster.programs.pipes import wide_pipe


class Sender:
    def __init__(self, argv):
        dst, port, src = argv[1], argv[2], argv[3]
        port = int(sys.stdin.readline() if port == "-" else port)  # "-": on stdin's first line (stream.run)
        self.rate = next((float(a[5:]) for a in argv[4:] if a.startswith("rate=")), 0.0)
        self.s = socket.create_connection((dst, port), timeout=30, source_address=(src, 0))
        self.s.settimeout(600)
        self.inp = sys.stdin.buffer
        wide_pipe(self.inp)  # a producer piped in (docker save, tar) hands over 1 MiB at a time
        self.sent, self.last, self.began = 0, 0.0, time.monotonic()

    def out(self, b):
        if not b:
            return
        self.s.sendall(struct.pack(">I", len(b)) + b)
        self.counted(len(b))

    def out_file(self, head, f, offset, n):
        """One frame of `head` then `n` bytes of the open file `f` from `offset`, the file's part
        sent by the kernel (sendfile: never copied through this process)."""
        self.s.sendall(struct.pack(">I", len(head) + n) + head)
        if n and self.s.sendfile(f, offset, n) != n:
            raise OSError(f"{f.name} ended before its {offset + n} bytes")
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
        self.s.sendall(struct.pack(">I", 0))
        self.s.shutdown(socket.SHUT_WR)
        self.s.recv(1)
        print(f"@@sent {self.sent}", file=sys.stderr, flush=True)
