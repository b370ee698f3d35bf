"""The programs' one tar reader: the entries of an archive read from a stream, each with its header
as it came (a sender passes it on byte for byte) and its data left to the caller to read or skip.

A ustar or GNU header's size is octal text, or base-256 when its first byte has the high bit set
(GNU tar, and POSIX's pax for a member over 8 GiB); a long name comes in a GNU `L` entry or a pax
`x` entry's `path=` record before the entry it names (GNU tar's documentation, "Basic Tar Format"
and "GNU Extensions": https://www.gnu.org/software/tar/manual/html_node/Standard.html).
"""

ZERO = b"\0" * 512


def size(h):
    f = h[124:136]
    if f[0] & 0x80:
        return int.from_bytes(f[1:], "big")
    return int(f.rstrip(b"\0 ").decode() or "0", 8)


def blocks(n):
    return (n + 511) // 512 * 512


class Entry:
    """One entry: `meta` the raw extended headers that came before it (pax `x` and `g`, GNU `L`),
    `header` its own; `end` the end-of-archive block (its `header`), after which nothing is read."""

    def __init__(self, meta, header, name, size, kind, end=False):
        self.meta, self.header, self.name, self.size, self.kind, self.end = meta, header, name, size, kind, end

    @property
    def regular(self):
        return self.kind in (b"0", b"\0")


def entries(read):
    """The entries of the archive `read(n)` gives (exactly n bytes, else it raises). The caller reads
    or skips `blocks(entry.size)` bytes of data after each entry before asking for the next."""
    meta, longname = b"", None
    while True:
        h = read(512)
        if h == ZERO:
            yield Entry(meta, h, "", 0, b"", end=True)
            return
        n, kind = size(h), h[156:157]
        if kind in (b"x", b"L", b"g"):
            data = read(blocks(n))
            meta += h + data
            if kind == b"L":
                longname = data[:n].rstrip(b"\0").decode("utf-8", "replace")
            elif kind == b"x":
                for rec in data[:n].decode("utf-8", "replace").split("\n"):
                    if " path=" in rec:
                        longname = rec.split(" path=", 1)[1]
            continue
        name = longname or (
            (h[345:500].rstrip(b"\0").decode("utf-8", "replace") + "/" if h[345] else "")
            + h[:100].rstrip(b"\0").decode("utf-8", "replace")
        )
        longname = None
        yield Entry(meta, h, name, n, kind)
        meta = b""
