"""The receiving end of a weights replication (after the stream's receiver): writes each file of
the tar stream into the incoming folder (argv[1]) and hashes it on the way, so the cache's `check`
need not read every received byte back from disk to verify it (measured on loopback: the read-back
was 30 % of a replication's time, issue 40). What it hashed it records (RECEIVED, one JSON line per
whole file: name, size, mtime, digest); `check` adopts a file whose record matches its size and
mtime and whose digest is its name, and hashes any other file as before. A blob is named by its
sha256, or by its git sha1 for a small file (huggingface_hub's cache layout).
"""

import hashlib
import json
import os
import re
import sys

from sparkcluster.programs import tar

RECEIVED = ".sparkcluster-received.jsonl"  # in the incoming folder: what this program hashed while writing
NAME = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")


def main(argv):
    inc = argv[1]
    os.makedirs(inc, exist_ok=True)
    inp, rec = sys.stdin.buffer, open(os.path.join(inc, RECEIVED), "a")

    def read(n):
        b = inp.read(n)
        if len(b) != n:
            raise EOFError
        return b

    current = None
    try:
        for e in tar.entries(read):
            if e.end:
                while inp.read(1 << 16):  # tar's trailing blocks: taken, so the receiver's writes all land
                    pass
                break
            n, name = e.size, os.path.basename(e.name)
            pad = tar.blocks(n) - n
            if not e.regular or not NAME.match(name):
                read(n + pad)  # not a blob: never written
                continue
            current = name
            sha = hashlib.sha256() if len(name) == 64 else hashlib.sha1(b"blob %d\0" % n)
            part = os.path.join(inc, name + ".part")
            with open(part, "wb") as f:
                left = n
                while left:
                    b = read(min(left, 1 << 20))
                    sha.update(b)
                    f.write(b)
                    left -= len(b)
            read(pad)
            os.replace(part, os.path.join(inc, name))
            st = os.stat(os.path.join(inc, name))
            rec.write(json.dumps([name, st.st_size, st.st_mtime_ns, sha.hexdigest()]) + "\n")
            rec.flush()
            current = None
    except EOFError:
        print("receive: the archive ended inside %s" % (current or "a header"), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv)
