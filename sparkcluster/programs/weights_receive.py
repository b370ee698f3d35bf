"""The receiving end of a weights replication (issue 61): the one-shot receiver and relay of the
image transfer (receiver's `accept`, `Frames`, `Relay`) writing the files of weights_send's stream
into the incoming folder itself. argv: the address to listen on, the sender's address, the incoming
folder, then as the receiver's ("next=ADDR,PORT,SRC" relays the stream as it arrives, "relay=splice"
or "relay=peek" without passing it through this process: receiver.Spliced, Peeked); "io=buffered" leaves out direct I/O.

Each file is hashed as it is written, so the cache's `check` need not read every received byte back
from disk to verify it (issue 40: the read-back was 30 % of a replication). The bytes go from the
socket into one of BUFFERS aligned buffers (recv_into: no copy but the kernel's), then to three
threads at once: the relay's (Forward: on to the next hop of a chain), the one writer (with O_DIRECT
where the filesystem takes it, so the bytes are not copied into the page cache; a file's unaligned
tail is written without it) and the file's own hasher (hashlib leaves the GIL for large buffers, so
the files in flight are hashed on as many cores). What it hashed it records (RECEIVED, one JSON line
per whole file: name, size, mtime, digest); `check` adopts a file whose record matches its size and
mtime and whose digest is its name, and hashes any other file as before. A blob is named by its
sha256, or by its git sha1 for a small file (huggingface_hub's cache layout); any other name is read
and dropped.
Exit status: the receiver's (STREAM_CUT when the stream ended before its end, RELAY_FAILED when
the chain after this node broke), 1 when this node could not write what it received.
"""

import collections
import errno
import fcntl
import hashlib
import json
import mmap
import os
import queue
import re
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

from sparkcluster.programs import receiver
from sparkcluster.programs.weights_send import CHUNK, HEAD, SIZE

RECEIVED = ".sparkcluster-received.jsonl"  # in the incoming folder: what this program hashed while writing
NAME = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")
BUFFERS = 16  # of CHUNK bytes each: 64 MiB in flight at most
PENDING = BUFFERS // 2  # chunks received whose tags are being checked, at most
VERIFIERS = max(2, min(8, os.cpu_count() or 2))  # threads checking chunks' tags
ALIGN = 4096  # direct I/O's offsets and lengths
# a write through the page cache at most 1 MiB at a time: 2 and 4 MiB writes cost 10-20 times the
# core-seconds per GB on ext4 (perf/weights_pipeline.md: 1.4-3.6 against 0.15)
BUFFERED = 1 << 20


class Chunk:
    """One buffer's bytes, free again once both the writer and the hasher are done with them."""

    def __init__(self, out, buf, n):
        self.out, self.buf, self.mv, self.users = out, buf, out.views[id(buf)][:n], 2

    def release(self):
        with self.out.lock:
            self.users -= 1
            last = not self.users
        if last:
            self.out.free.put(self.buf)


class File:
    def __init__(self, out, name, size):
        self.name, self.size, self.got, self.ok = name, size, 0, True
        self.part = os.path.join(out.inc, name + ".part")
        self.fd, self.direct = out.create(self.part)
        self.sha = hashlib.sha256() if len(name) == 64 else hashlib.sha1(b"blob %d\0" % size)
        self.q = queue.SimpleQueue()  # chunks to hash; None: the file's end
        self.written = threading.Event()
        self.t = threading.Thread(target=out.hash_file, args=(self,), daemon=True)
        self.t.start()


class Out:
    """The incoming folder: the writer thread, a hasher thread per file in flight, the record."""

    def __init__(self, inc, direct):
        self.inc, self.direct, self.err = inc, direct, ""
        self.lock = threading.Lock()
        self.free = queue.SimpleQueue()
        self.views = {}
        for _ in range(BUFFERS):
            b = mmap.mmap(-1, CHUNK)  # page-aligned, as direct I/O needs
            self.views[id(b)] = memoryview(b)
            self.free.put(b)
        self.writes = queue.SimpleQueue()  # (file, offset, chunk); chunk None: the file's end
        self.files, self.open = [], {}
        self.rec = open(os.path.join(inc, RECEIVED), "a")
        self.writer = threading.Thread(target=self.write_all, daemon=True)
        self.writer.start()

    def create(self, path):
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        if self.direct and hasattr(os, "O_DIRECT"):
            try:
                return os.open(path, flags | os.O_DIRECT, 0o644), True
            except OSError as e:
                if e.errno != errno.EINVAL:  # a filesystem without direct I/O: written through the cache
                    raise
        return os.open(path, flags, 0o644), False

    def begin(self, i, name, size):
        if len(self.open) >= 64:
            raise ValueError("more than 64 files at once")
        try:
            f = File(self, name, size)
        except OSError as e:
            self.fail(SimpleNamespace(name=name, ok=False), e)  # nowhere to write: the rest relayed only
            return
        self.files.append(f)
        self.open[i] = f
        if not size:
            self.end(i)

    def chunk(self, n):
        return Chunk(self, self.free.get(), n)

    def put(self, i, c):
        f = self.open[i]
        if f.got + len(c.mv) > f.size:
            raise ValueError(f"more bytes than {f.name}'s {f.size}")
        self.writes.put((f, f.got, c))
        f.q.put(c)
        f.got += len(c.mv)
        if f.got == f.size:
            self.end(i)

    def end(self, i):
        f = self.open.pop(i)
        self.writes.put((f, 0, None))
        f.q.put(None)

    def write_all(self):
        while True:
            job = self.writes.get()
            if job is None:
                return
            f, off, c = job
            if c is None:
                try:
                    os.close(f.fd)
                except OSError as e:
                    self.fail(f, e)
                f.written.set()
                continue
            if f.ok and not self.err:
                try:
                    self.pwrite(f, c.mv, off)
                except OSError as e:
                    self.fail(f, e)
            else:
                f.ok = False
            c.release()

    def pwrite(self, f, mv, off):
        while len(mv):
            if f.direct and (len(mv) % ALIGN or off % ALIGN):
                self.buffered(f)
            try:
                k = os.pwrite(f.fd, mv if f.direct else mv[:BUFFERED], off)
            except OSError as e:
                if e.errno != errno.EINVAL or not f.direct:
                    raise
                self.buffered(f)  # direct I/O refused after all: the rest through the cache
                continue
            mv, off = mv[k:], off + k

    def buffered(self, f):
        fcntl.fcntl(f.fd, fcntl.F_SETFL, fcntl.fcntl(f.fd, fcntl.F_GETFL) & ~os.O_DIRECT)
        f.direct = False

    def fail(self, f, e):
        f.ok = False
        if not self.err:
            self.err = f"receive: writing {f.name}: {e}; the rest of the stream is relayed, not written"
            print(self.err, file=sys.stderr, flush=True)

    def hash_file(self, f):
        while True:
            c = f.q.get()
            if c is None:
                break
            f.sha.update(c.mv)
            c.release()
        f.written.wait()
        if not (f.ok and f.got == f.size):
            return  # cut, or not written whole: `check` drops the part
        final = os.path.join(self.inc, f.name)
        try:
            os.replace(f.part, final)
            st = os.stat(final)
        except OSError as e:
            self.fail(f, e)
            return
        with self.lock:
            self.rec.write(json.dumps([f.name, st.st_size, st.st_mtime_ns, f.sha.hexdigest()]) + "\n")
            self.rec.flush()

    def close(self):
        """Every file still open ends here unfinished; every thread's work awaited."""
        for i in list(self.open):
            self.end(i)
        self.writes.put(None)
        self.writer.join()
        for f in self.files:
            f.t.join()
        self.rec.close()


class Forward:
    """A relay's sends on a thread of their own, in order, so this node receives the next chunk while
    the last goes on to the next hop (inline, one thread copies every byte in and out again). A
    chunk's bytes are sent from its buffer (`hold`: the buffer is not reused before); anything else
    is copied first."""

    END, STOP = object(), object()

    def __init__(self, relay):
        self.relay, self.hold = relay, None
        self.q = queue.Queue(4 * BUFFERS)  # bounded: a slow next hop slows this one, never its memory
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def fill(self, c, mv):
        receiver.recv_exact(c, mv)
        self.send(mv)

    def send(self, mv):
        c = self.hold
        if c is not None and len(mv) >= 1 << 16:
            with c.out.lock:
                c.users += 1
            self.q.put((mv, c))
        else:
            self.q.put((bytes(mv), None))

    def end(self):
        self.q.put((self.END, None))

    def run(self):
        while True:
            b, c = self.q.get()
            if b is self.STOP:
                return
            if b is self.END:
                self.relay.end()
            else:
                self.relay.send(b)
            if c is not None:
                c.release()

    def done(self):
        self.q.put((self.STOP, None))
        self.t.join()

    def cut(self):
        self.done()
        self.relay.cut()

    def wait(self):
        self.done()
        self.relay.wait()

    def failed(self, rc):
        return self.relay.failed(rc)


NAME_BYTES = 256  # an "F" record's rest: its size and a name of 40 or 64 characters


def receive(frames, out):
    """The records up to "E" (weights_send's), one a frame, then the end frame. A frame's bytes reach
    the writer and the hasher only once its tag is checked (receiver.Frames); a record's lengths are
    bounded before anything is allocated for it. A chunk's tag is checked on a pool's thread while
    this one receives the next (one sha256 stream is slower than a Spark's link), and the chunks go
    on to the writer in the order they came, each once its own tag matched."""
    pool = ThreadPoolExecutor(VERIFIERS)
    pending = collections.deque()  # (check, file id, chunk, frame number), in the stream's order

    def commit(limit, done_only=False):
        """The oldest chunks on to the writer, until `limit` are left (`done_only`: until the
        oldest is still being checked); Refused at the first whose tag does not match."""
        while len(pending) > limit and not (done_only and not pending[0][0].done()):
            check, i, c, seq = pending.popleft()
            if not check.result():
                c.release()
                c.release()
                raise receiver.Refused(f"frame {seq} does not carry the run's tag (forged, replayed or reordered)")
            out.put(i, c)

    try:
        records(frames, out, pool, pending, commit)
    except BaseException:
        for item in pending:  # never written: their buffers are not used again
            item[0].cancel()
        raise
    finally:
        pool.shutdown(wait=False)


def records(frames, out, pool, pending, commit):
    scratch = memoryview(bytearray(CHUNK))
    while True:
        n = frames.begin()
        if n < HEAD.size:
            raise receiver.Refused(f"a frame of {n} bytes where a record was due")
        kind, i, k = HEAD.unpack(frames.read(HEAD.size))
        if k != n - HEAD.size:
            raise receiver.Refused(f"a record of {k} bytes in a frame of {n}")
        if kind == b"F":
            if k > NAME_BYTES or k < SIZE.size:
                raise receiver.Refused(f"a file's record of {k} bytes")
            rest = frames.read(k)
            frames.check()
            commit(0)
            size, name = (
                SIZE.unpack(rest[: SIZE.size])[0],
                os.path.basename(rest[SIZE.size :].decode("utf-8", "replace")),
            )
            if NAME.match(name) and not out.err:
                out.begin(i, name, size)
        elif kind == b"D":
            if k > CHUNK:
                raise receiver.Refused(f"a chunk of {k} bytes")
            if i not in out.open or out.err:
                frames.take(scratch[:k])  # not a blob, or nowhere to write it: relayed only
                frames.check()
                continue
            commit(PENDING - 1)  # a buffer for this chunk is free, or will be once the writer is done
            c = out.chunk(k)
            frames.relay.hold = c
            try:
                frames.take_raw(c.mv)
            except BaseException:
                c.release()
                c.release()
                raise
            frames.relay.hold = None
            h, seq, tag = frames.detach()
            pending.append((pool.submit(receiver.verify, h, c.mv, tag), i, c, seq))
            commit(0, done_only=True)
        elif kind == b"E":
            frames.check()
            commit(0)
            if frames.begin():
                raise receiver.Refused("bytes after the end")
            return
        else:
            raise receiver.Refused(f"not a record: {kind!r}")


def main(argv):
    inc = argv[3]
    key = receiver.key_or_exit()
    os.makedirs(inc, exist_ok=True)
    out = Out(inc, "io=buffered" not in argv[4:])
    c, relay = receiver.accept([argv[0], argv[1], argv[2], *argv[4:]])
    if relay.s is not None and not isinstance(relay, (receiver.Spliced, receiver.Peeked)):
        relay = Forward(relay)
    done, refused = False, False
    try:
        receive(receiver.Frames(c, relay, key), out)
        done = True
    except EOFError:
        pass
    except (TimeoutError, OSError) as e:
        print(f"receive: {e}", file=sys.stderr)
    except receiver.Refused as e:
        refused = True
        print(f"receive: refused {e}; nothing of it written", file=sys.stderr, flush=True)
    except ValueError as e:
        print(f"receive: not a weights stream: {e}", file=sys.stderr)
    out.close()
    if refused:
        relay.cut()
        sys.exit(receiver.REFUSED)
    if not done:
        relay.cut()
        print("receive: the stream ended before the sender finished", file=sys.stderr)
        sys.exit(receiver.STREAM_CUT)
    relay.wait()
    sys.exit(relay.failed(1 if out.err else 0))


if __name__ == "__main__":
    main(sys.argv)
