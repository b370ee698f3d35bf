"""Reads `docker save` on stdin and sends it framed (framing), leaving out the layer tars whose diff
ID the worker holds: it holds those chains, and docker load does not open their files. Every layer
file is judged by its name, without reading it, wherever the name can say which layer it is:
- `blobs/sha256/<hex>` (the OCI layout of Docker 25 and later): an uncompressed layer's digest is
  its diff ID;
- `<v1 id>/layer.tar` (Docker 20.10 to 24): the v1 ID is the digest of the directory's own `json`
  (which the archive holds just before the tar: `json` sorts before `layer.tar`) with its `id`
  removed and its layer's chain ID added (moby image/v1/imagev1.go CreateID, called by
  image/tarexport/save.go saveImage; the bottom layers' json got its `os` after the ID was made,
  the top layer's before). The sender recomputes that digest for each of the image's chain IDs
  (argv "=<hex>": its diff IDs in order) and so learns which layer the directory holds.
A layer file that neither names (a json that matches no chain, a blob named by another digest) is
hashed while spooled to disk, then sent or dropped: the old way, correct but reading and writing the
layer once more on the head. Every other entry (manifest.json, the config, VERSION/json, index.json)
passes through byte for byte.

argv: as framing's, then "-<hex>" a diff ID to leave out, "+<hex>" one of the image's other diff
IDs, "=<hex>" the image's diff IDs bottom up (with repeats).
"""

import hashlib
import json
import os
import re
import sys
import tempfile

from sparkcluster.programs import tar
from sparkcluster.programs.framing import Sender

BLOB = re.compile(r"(?:.*/)?blobs/sha256/([0-9a-f]{64})$")
V1JSON = re.compile(r"(?:.*/)?([0-9a-f]{64})/json$")
V1TAR = re.compile(r"(?:.*/)?([0-9a-f]{64})/layer\.tar$")
EARLY = "the image archive ended early (docker save, or the layer store reader, stopped)"


def chain_ids(order):
    chains = []
    for d in order:
        chains.append(hashlib.sha256(f"sha256:{chains[-1]} sha256:{d}".encode()).hexdigest() if chains else d)
    return chains


def members(s):
    """A JSON object's members as the raw text of each value, as the engine wrote them."""
    dec, out, i = json.JSONDecoder(), {}, s.index("{") + 1
    while True:
        while s[i] in " \t\r\n,":
            i += 1
        if s[i] == "}":
            return out
        k, i = dec.raw_decode(s, i)
        while s[i] in " \t\r\n:":
            i += 1
        j = dec.raw_decode(s, i)[1]
        out[k], i = s[i:j], j


def v1_layer(v1, data, order, chains):
    """The diff ID whose chain makes `v1` the digest of this json (moby's v1.CreateID), else None."""
    f = members(data.decode("utf-8"))
    for with_os in (False, True):
        c = {k: v for k, v in f.items() if k not in ("id", "parent") and (with_os or k != "os")}
        if "parent" in f:
            c["parent"] = json.dumps("sha256:" + json.loads(f["parent"]))
        for i, chain in enumerate(chains):
            c["layer_id"] = f'"sha256:{chain}"'
            text = "{" + ",".join(json.dumps(k) + ":" + c[k] for k in sorted(c)) + "}"
            if hashlib.sha256(text.encode("utf-8")).hexdigest() == v1:
                return order[i]
    return None


def main(argv):
    link = Sender(argv)
    out, inp = link.out, link.inp
    skip = {a[1:] for a in argv[4:] if a[0] == "-"}
    keep = {a[1:] for a in argv[4:] if a[0] == "+"}
    order = [a[1:] for a in argv[4:] if a[0] == "="]
    chains = chain_ids(order)
    dropped, ndrop, hashed, nhash = 0, 0, 0, 0
    named = {}  # v1 directory -> the diff ID of the layer it holds

    def read(n):
        b = inp.read(n)
        if len(b) != n:
            raise SystemExit(EARLY)
        return b

    def copy(n, sink):
        while n:
            b = read(min(n, 1 << 20))
            n -= len(b)
            sink(b)

    # a docker save that dies mid-way closes the pipe like one that finished (and a cut after a layer
    # ends in that layer's own zero blocks): the archive is walked entry by entry even when nothing is
    # left out, and only one that reaches tar's end-of-archive block is complete
    for e in tar.entries(read):
        n, name, blocks = e.size, e.name, tar.blocks(e.size)
        if e.end:
            out(e.meta + e.header)
            link.pump(inp)
            break
        m = BLOB.match(name)
        v1j = V1JSON.match(name) if e.regular and skip and n < (1 << 20) else None
        v1t = V1TAR.match(name) if e.regular else None
        if v1t and v1t.group(1) in named:
            m = BLOB.match("blobs/sha256/" + named[v1t.group(1)])  # judged as the blob it is
        if v1j:
            data = read(blocks)
            out(e.meta + e.header + data)
            try:
                d = v1_layer(v1j.group(1), data[:n], order, chains)
            except (ValueError, IndexError, UnicodeDecodeError):
                d = None
            if d:
                named[v1j.group(1)] = d
        elif e.regular and m and m.group(1) in skip:
            copy(blocks, lambda b: None)
            dropped, ndrop = dropped + n, ndrop + 1
        elif (
            e.regular
            and skip
            and not (m and m.group(1) in keep)
            and (name.endswith("/layer.tar") or (m and n > (1 << 20)))
        ):
            # a layer whose name does not say its diff ID: hashed on the way, spooled to disk meanwhile
            # (/var/tmp: disk-backed, where /tmp may be memory)
            sha = hashlib.sha256()
            with tempfile.TemporaryFile(dir="/var/tmp" if os.path.isdir("/var/tmp") else None) as t:
                copy(n, lambda b, sha=sha, t=t: (sha.update(b), t.write(b)))
                pad = read(blocks - n)
                hashed, nhash = hashed + n, nhash + 1
                if sha.hexdigest() in skip:
                    dropped, ndrop = dropped + n, ndrop + 1
                else:
                    out(e.meta + e.header)
                    t.seek(0)
                    link.pump(t)
                    out(pad)
        else:
            out(e.meta + e.header)
            copy(blocks, out)
    link.finish()
    print(f"@@dropped {ndrop} {dropped}", file=sys.stderr, flush=True)
    print(f"@@hashed {nhash} {hashed}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main(sys.argv)
