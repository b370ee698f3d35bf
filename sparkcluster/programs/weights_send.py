"""The sending end of a weights replication (issue 61): the blobs named on stdin (NUL-separated,
read from the current folder, the repository's `blobs`) in one framed stream (framing) to the first
receiver (programs/weights_receive). argv: as framing's, then "files=K": how many files are in
flight at once (default FILES).

The stream is a run of records, one a frame, each after a head (HEAD: its kind, a file's id, the
length of the rest): "F" opens a file (its size, then its name), "D" carries
CHUNK bytes or fewer of an open file (its id, then the bytes, sent by the kernel from the file with
sendfile: this process never copies them; their tags made by a pool of threads from the files'
pages mapped, a few chunks ahead of the one being sent), "E" ends the stream. The chunks of K files alternate,
so a receiver hashes K files at once, each on its own core: one sha256 stream is slower than a
Spark's link and disk (perf/weights_pipeline.md). A file's chunks come in order; a cut stream
leaves at most K files partly sent, which the receiving `check` drops and the next run sends again.
"""

import collections
import os
import struct
import sys
from concurrent.futures import ThreadPoolExecutor

from sparkcluster.programs.framing import Sender, file_tag

CHUNK = 1 << 22  # 4 MiB: the receiver's buffer, aligned for direct I/O
FILES = 4
HEAD = struct.Struct(">cII")  # every record's head: its kind, a file's id, the length of what follows
SIZE = struct.Struct(">Q")  # "F": the file's size, then its name
AHEAD = 2  # chunks tagged ahead of the one being sent, per file in flight (CHUNK bytes of memory map each)


def names(raw):
    return [n.decode() for n in raw.split(b"\0") if n]


def main(argv):
    link = Sender(argv)
    width = next((int(a[6:]) for a in argv[4:] if a.startswith("files=")), FILES)
    todo = names(link.inp.read())
    todo.reverse()
    # each chunk's tag is made by a pool's thread (hashlib leaves the GIL) while this one sends the
    # chunks before it: one sha256 stream is slower than a Spark's link (perf/weights_pipeline.md).
    # Frames leave in the order their numbers were taken; at most AHEAD of them wait
    pool = ThreadPoolExecutor(max(1, width))
    ahead = collections.deque()

    def send(limit):
        while len(ahead) > limit:
            item = ahead.popleft()
            if item[0] is None:
                link.send_frame(item[1], item[2])
                continue
            tag, head, f, off, n, last = item
            link.send_file(head, f, off, n, tag.result())
            if last:
                f.close()

    def record(b):
        ahead.append((None, b, link.seal.tag(len(b), b)))

    busy, nid = [], 0  # [id, file, size, offset] of each file in flight
    while todo or busy:
        while todo and len(busy) < max(1, width):
            name = todo.pop()
            f = open(name, "rb")
            size = os.fstat(f.fileno()).st_size
            record(HEAD.pack(b"F", nid, SIZE.size + len(name.encode())) + SIZE.pack(size) + name.encode())
            busy.append([nid, f, size, 0])
            nid += 1
        for b in list(busy):
            i, f, size, off = b
            n = min(CHUNK, size - off)
            if n:
                head = HEAD.pack(b"D", i, n)
                tag = pool.submit(file_tag, link.seal.start(len(head) + n), head, f, off, n)
                ahead.append((tag, head, f, off, n, off + n == size))
                b[3] = off + n
            elif not size:
                f.close()
            if b[3] == size:
                busy.remove(b)
            send(AHEAD * max(1, width))
    record(HEAD.pack(b"E", 0, 0))
    send(0)
    pool.shutdown()
    link.finish()


if __name__ == "__main__":
    main(sys.argv)
