"""The sending end of a weights replication (issue 61): the blobs named on stdin (NUL-separated,
read from the current folder, the repository's `blobs`) in one framed stream (framing) to the first
receiver (programs/weights_receive). argv: as framing's, then "files=K": how many files are in
flight at once (default FILES).

The stream is a run of records, one a frame, each after a head (HEAD: its kind, a file's id, the
length of the rest): "F" opens a file (its size, then its name), "D" carries
CHUNK bytes or fewer of an open file (its id, then the bytes, sent by the kernel from the file with
sendfile: this process never copies them), "E" ends the stream. The chunks of K files alternate,
so a receiver hashes K files at once, each on its own core: one sha256 stream is slower than a
Spark's link and disk (perf/weights_pipeline.md). A file's chunks come in order; a cut stream
leaves at most K files partly sent, which the receiving `check` drops and the next run sends again.
"""

import os
import struct
import sys

from sparkcluster.programs.framing import Sender

CHUNK = 1 << 22  # 4 MiB: the receiver's buffer, aligned for direct I/O
FILES = 4
HEAD = struct.Struct(">cII")  # every record's head: its kind, a file's id, the length of what follows
SIZE = struct.Struct(">Q")  # "F": the file's size, then its name


def names(raw):
    return [n.decode() for n in raw.split(b"\0") if n]


def main(argv):
    link = Sender(argv)
    width = next((int(a[6:]) for a in argv[4:] if a.startswith("files=")), FILES)
    todo = names(link.inp.read())
    todo.reverse()
    busy, nid = [], 0  # [id, file, size, offset] of each file in flight
    while todo or busy:
        while todo and len(busy) < max(1, width):
            name = todo.pop()
            f = open(name, "rb")
            size = os.fstat(f.fileno()).st_size
            link.out(HEAD.pack(b"F", nid, SIZE.size + len(name.encode())) + SIZE.pack(size) + name.encode())
            busy.append([nid, f, size, 0])
            nid += 1
        for b in list(busy):
            i, f, size, off = b
            n = min(CHUNK, size - off)
            if n:
                link.out_file(HEAD.pack(b"D", i, n), f, off, n)
                b[3] = off + n
            if b[3] == size:
                f.close()
                busy.remove(b)
    link.out(HEAD.pack(b"E", 0, 0))
    link.finish()


if __name__ == "__main__":
    main(sys.argv)
