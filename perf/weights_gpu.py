"""Weights replication where the cores are (issue 61): sparkcluster's own node programs
for a replication, run as local processes over loopback on the GPU machine the project borrows
(16 cores, its own disk), against limits measured in the same run.

What runs is what the weights stage runs on the nodes, from the shell commands it builds
(`movement/hfcache.send_command`, `receive_command`, `check_command`: since issue 61 item 3
programs/weights_send, weights_receive and weights_cache; before it tar, stream_sender, receiver,
weights_receive), here with every address 127.0.0.1; SSH and paramiko are
not measured (the commands run in local `bash`). The repository is synthetic and not compressible:
safetensors-shaped shards of random bytes (numpy's PCG64) named by their sha256, beside small files
named by their git sha1, as huggingface_hub's cache holds them. The source sits on a tmpfs, so its
reads are not the bound; page cache is dropped before each run (where the kernel lets us).

Runs, each of the whole repository:
- `tcp`: raw TCP over loopback, Python both ends (1 MiB sendall / recv_into): the link's limit;
- `disk`: the sink's write rate: O_DIRECT writes of 4 MiB, then fsync;
- `memcpy=N`: N processes copying memory at once (numpy, one thread each): the memory bus's rate;
- `one-disk`: one receiver writing the HF cache on the disk, then `check` (adopt, verify), then sync;
- `tar-disk`: `tar -c | (Python stand-in for nc) | tar -x` onto the disk, then sync (there is no nc);
- `one-tmpfs`, `three-tmpfs`: one receiver, then a chain of three (each receiver relays to the next,
  each on its own tmpfs), with `check` on each;
- `resume`: a replication to a tmpfs cut after `--cut` of its bytes (default 0.6), `check`, then only what it
  says is missing sent again: the bytes sent the second time against the bytes missing;
- `pin=N`: `one-tmpfs` and `three-tmpfs` again, for each package, with each receiver on N cores of its
  own and the sender on `--sender-cores` (default 1) of its own (`cores_of`): three receivers that share
  one machine no longer share its cores, nor the sender's;
- `relay=MODE`: `three-tmpfs` again (and, with `pin=N`, pinned) with the relays' `relay=MODE` argument
  ("splice", "peek": receiver.Spliced, Peeked, the forward spliced through pipes instead of copied),
  for each package.
Every chain's record says each receiver's own core-seconds per GB (`receivers`: the relays, then the
leaf), beside the leaf alone's (`one-tmpfs`).

`--rfs`: every run with loopback's receive work steered to the CPU the receiving process last ran on
(Receive Flow Steering: `rps_cpus`, `rps_flow_cnt` of lo's queue and `net.core.rps_sock_flow_entries`,
the kernel's Documentation/networking/scaling.rst), as it is on a machine of its own, where the next
node's kernel receives what a relay sends. Without it, loopback does much of a receiver's TCP receive
work in its sender's context, so a relay is charged for its next hop's and a leaf alone for none of its own.
The settings are put back at the end.
Figures: GB/s (10^9 bytes) of the repository over each run's wall time.

Each run also says what it cost the cores: the core-seconds per GB of every process it started
(getrusage of the waited children), and per program (its /proc times sampled every 20 ms: the last
sample before a process ends, so a few tens of ms short per process).

Packages (`--pkg NAME=ROOT`, repeatable; default `this=` the checkout it runs from): the replication
runs (`one-disk`, `one-tmpfs`, `three-tmpfs`) go once per package, each with the commands that
package's `hfcache` builds (built before the clock starts); `resume` runs with the last package.
So one call measures main's pipeline beside a branch's copy (`--pkg before=. --pkg
after=.devwork/h61`).

Usage (as root, from a checkout whose sparkcluster has programs/ as modules):
`python3 perf/weights_gpu.py OUTDIR [--gb 10] [--work /var/tmp/weights-gpu] [--pkg NAME=ROOT ...]`.
Writes OUTDIR/weights_gpu.json and OUTDIR/weights_gpu.md (the table, the budgets judged).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REPO = "synthetic/weights-gpu"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
SHARD = 2 * 10**9  # bytes a safetensors shard (the hub's models split at 2-5 GB)
MiB = 1 << 20


def drop_caches() -> bool:
    try:
        subprocess.run(["sync"], check=True)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def make_shard(args: tuple[str, int, int]) -> tuple[str, int]:
    """One shard of random bytes written to `folder`, named by its sha256."""
    import numpy as np

    folder, size, seed = args
    rng, h = np.random.default_rng(seed), hashlib.sha256()
    tmp = Path(folder) / f"shard-{seed}.tmp"
    with open(tmp, "wb") as f:
        left = size
        while left:
            b = rng.bytes(min(left, 64 * MiB))
            h.update(b)
            f.write(b)
            left -= len(b)
    name = h.hexdigest()
    tmp.rename(Path(folder) / name)
    return name, size


def make_repo(blobs: Path, total: int, shard: int = SHARD) -> list[dict]:
    """The manifest's files: shards summing to `total`, and three small files (git sha1 names)."""
    from multiprocessing import Pool

    blobs.mkdir(parents=True, exist_ok=True)
    sizes = [shard] * (total // shard) + ([total % shard] if total % shard else [])
    with Pool(min(8, len(sizes))) as pool:
        shards = pool.map(make_shard, [(str(blobs), s, i) for i, s in enumerate(sizes)])
    files = [
        {"path": f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors", "size": s, "blob": n}
        for i, (n, s) in enumerate(shards)
    ]
    for path, text in (("config.json", '{"model_type": "synthetic"}'), ("tokenizer.json", "{}" * 5000)):
        data = text.encode()
        name = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        (blobs / name).write_bytes(data)
        files.append({"path": path, "size": len(data), "blob": name})
    return files


MOUNTED: list[Path] = []


def tmpfs(path: Path, size_gb: int) -> Path:
    """A tmpfs of its own at `path` (root); where mounting is refused, a plain folder (said in the
    result's `tmpfs`)."""
    path.mkdir(parents=True, exist_ok=True)
    got = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_gb}G", "tmpfs", str(path)], capture_output=True)
    if got.returncode == 0:
        MOUNTED.append(path)
    return path


RFS = {  # Receive Flow Steering on loopback (Documentation/networking/scaling.rst), root only
    "/proc/sys/net/core/rps_sock_flow_entries": "32768",
    "/sys/class/net/lo/queues/rx-0/rps_flow_cnt": "32768",
    "/sys/class/net/lo/queues/rx-0/rps_cpus": None,  # every core: the mask written at the start
}


def steer(on: bool, saved: dict[str, str] | None = None) -> dict[str, str]:
    """RFS on loopback turned on (the old values returned), or the `saved` values put back. A value
    the kernel refuses is left as it was, said on stdout (`rfs_refused`) and absent from the record's
    `rfs` (the values in force, read back)."""
    if not on:
        for path, old in (saved or {}).items():
            try:
                Path(path).write_text(old + "\n")
            except OSError:
                pass
        return {}
    old: dict[str, str] = {}
    for path, want in RFS.items():
        if want is None:
            want = format((1 << (os.cpu_count() or 1)) - 1, "x")
        try:
            old[path] = Path(path).read_text().strip()
            Path(path).write_text(want + "\n")
        except OSError as e:
            old.pop(path, None)
            print(json.dumps({"rfs_refused": f"{path}: {e}"}), flush=True)
    return old


def umount(path: Path) -> None:
    subprocess.run(["umount", str(path)], check=False)


def rate(nbytes: int, secs: float) -> float:
    return nbytes / secs / 1e9


# -- the limits -------------------------------------------------------------------------------------

TCP_RECV = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", 0)); s.listen(1)
print(s.getsockname()[1], flush=True)
c, _ = s.accept(); mv = memoryview(bytearray(1 << 20)); n = 0
while (k := c.recv_into(mv)):
    n += k
print(n, flush=True)
"""
TCP_SEND = """
import os, socket, sys
b = os.urandom(1 << 20); s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
for _ in range(int(sys.argv[2]) // (1 << 20)):
    s.sendall(b)
s.close()
"""


def raw_tcp(total: int) -> dict:
    recv = subprocess.Popen([sys.executable, "-c", TCP_RECV], stdout=subprocess.PIPE, text=True)
    port = recv.stdout.readline().strip()
    t = time.monotonic()
    subprocess.run([sys.executable, "-c", TCP_SEND, port, str(total)], check=True)
    got = int(recv.stdout.readline())
    secs = time.monotonic() - t
    recv.wait()
    return {"bytes": got, "secs": secs, "gb_s": rate(got, secs)}


def disk_write(folder: Path, total: int) -> dict:
    """O_DIRECT writes of 4 MiB of random bytes from an aligned buffer, then fsync."""
    import mmap

    buf = mmap.mmap(-1, 4 * MiB)
    buf.write(os.urandom(4 * MiB))
    path = folder / "direct-write.bin"
    drop_caches()
    t = time.monotonic()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
    try:
        for _ in range(total // (4 * MiB)):
            os.write(fd, buf)
        os.fsync(fd)
    finally:
        os.close(fd)
    secs = time.monotonic() - t
    path.unlink()
    return {"bytes": total // (4 * MiB) * 4 * MiB, "secs": secs, "gb_s": rate(total, secs)}


NC_RECV = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", 0)); s.listen(1)
print(s.getsockname()[1], file=sys.stderr, flush=True)
c, _ = s.accept(); out = sys.stdout.buffer
while (b := c.recv(1 << 20)):
    out.write(b)
"""
NC_SEND = """
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1]))); inp = sys.stdin.buffer
while (b := inp.read(1 << 20)):
    s.sendall(b)
s.close()
"""


# -- what the cores spent ------------------------------------------------------------------------------

TICK = os.sysconf("SC_CLK_TCK")


class Cores:
    """The CPU of every process in the sessions started under it, per program: /proc/PID/stat's
    utime + stime, sampled every 20 ms (a program is its `sparkcluster.programs.X` argument, else
    its argv[0]); and getrusage's total of the waited children, exact."""

    def __init__(self):
        import threading

        self.sids: set[int] = set()
        self.seen: dict[int, tuple[str, int]] = {}
        self.stop = threading.Event()
        self.t = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self):
        import resource

        self.r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.t.start()
        return self

    def __exit__(self, *exc):
        import resource

        self.stop.set()
        self.t.join()
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.total = r.ru_utime + r.ru_stime - self.r0.ru_utime - self.r0.ru_stime

    def popen(self, *args, **kw) -> subprocess.Popen:
        p = subprocess.Popen(*args, start_new_session=True, **kw)
        self.sids.add(p.pid)
        self._sample()
        return p

    def _label(self, pid: int) -> str:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return "?"
        mod = next((a.decode() for a in argv if a.startswith(b"sparkcluster.programs.")), None)
        return mod.rsplit(".", 1)[1] if mod else os.path.basename(argv[0].decode(errors="replace")) or "?"

    def _sample(self) -> None:
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                f = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(f[3]) in self.sids:
                pid = int(d)
                old = self.seen.get(pid, ("bash",))[0]
                label = old if old not in ("bash", "?") else self._label(pid)  # bash forks, then execs
                self.seen[pid] = (label, int(f[11]) + int(f[12]))

    def _loop(self) -> None:
        while not self.stop.wait(0.02):
            self._sample()

    def per_gb(self, nbytes: int) -> dict:
        out: dict[str, float] = {}
        for label, ticks in self.seen.values():
            out[label] = out.get(label, 0.0) + ticks / TICK
        gb = nbytes / 1e9
        return {
            "core_s_per_gb": round(self.total / gb, 3),
            "programs": {k: round(v / gb, 3) for k, v in sorted(out.items(), key=lambda kv: -kv[1]) if v},
        }


def sha256_rate(blobs: Path, files: list[dict]) -> dict:
    """One thread's sha256 over the largest shard (from the tmpfs): what one hasher can verify."""
    big = max(files, key=lambda f: f["size"])
    h, t = hashlib.sha256(), time.monotonic()
    with open(blobs / big["blob"], "rb", buffering=0) as f:
        buf = memoryview(bytearray(4 * MiB))
        while n := f.readinto(buf):
            h.update(buf[:n])
    secs = time.monotonic() - t
    assert h.hexdigest() == big["blob"]
    return {"bytes": big["size"], "secs": secs, "gb_s": rate(big["size"], secs)}


MEMCPY = """
import sys, time
import numpy as np
a = np.ones(1 << 28, dtype=np.uint32); b = np.empty_like(a); a.copy(); t = time.monotonic()
for _ in range(int(sys.argv[1])):
    np.copyto(b, a)
print(time.monotonic() - t, flush=True)
"""


def memory_copy(procs: int, reps: int = 8) -> dict:
    """`procs` processes at once, each copying 1 GiB `reps` times (numpy's copyto, one thread each):
    the memory bus's copy rate as the receivers' copies meet it (GB/s copied, all processes)."""
    argv = [sys.executable, "-c", MEMCPY, str(reps)]
    ps = [subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) for _ in range(procs)]
    secs = max(float(p.communicate()[0]) for p in ps)
    copied = procs * reps * (1 << 30)
    return {"bytes": copied, "secs": secs, "gb_s": rate(copied, secs), "procs": procs}


def tar_nc(src: Path, dst: Path, total: int) -> dict:
    dst.mkdir(parents=True, exist_ok=True)
    drop_caches()
    with Cores() as cores:
        t = time.monotonic()
        recv = cores.popen(
            f"python3 -c {sh(NC_RECV)} | tar -x -f - -C {sh(str(dst))}", shell=True, stderr=subprocess.PIPE, text=True
        )
        port = recv.stderr.readline().strip()
        send = cores.popen(
            ["bash", "-c", f"set -o pipefail; tar -c -f - -C {sh(str(src))} . | python3 -c {sh(NC_SEND)} {port}"]
        )
        if send.wait():
            raise RuntimeError("tar | nc failed")
        recv.wait()
        subprocess.run(["sync"], check=True)
        secs = time.monotonic() - t
    return {"bytes": total, "secs": secs, "gb_s": rate(total, secs), "rc": recv.returncode, **cores.per_gb(total)}


def sh(text: str) -> str:
    import shlex

    return shlex.quote(text)


# -- sparkcluster's replication ----------------------------------------------------------------------

IP = "127.0.0.1"
SINK, NEXT, PORT = "/weights-gpu-sink", 65432, 65433  # placeholders in a package's commands
COMMANDS = """
import json, sys
sys.path.insert(0, sys.argv[1])
from sparkcluster.movement import hfcache, transfer
a, ip = json.load(sys.stdin), "127.0.0.1"
print(json.dumps({
    "tail": hfcache.receive_command(a["sink"], a["repo"], ip, ip),
    "relay": hfcache.receive_command(a["sink"], a["repo"], ip, ip, transfer.next_hop(ip, a["next"], ip)),
    "send": hfcache.send_command(a["src"], a["repo"], a["names"], ip, a["port"], ip),
    "check": hfcache.check_command(a["sink"]),
    "folder": hfcache.repo_folder(a["repo"]),
    "source": hfcache.__file__,
}))
"""


STREAM_KEY = "5e" * 32  # the stream's key (programs/framing), as movement/stream hands it to each end


def keyed(p: subprocess.Popen) -> None:
    """The stream key as the first line of an end's stdin (a package from before the key ignores it)."""
    p.stdin.write(STREAM_KEY + "\n")
    p.stdin.close()


class Pkg:
    """One package's commands (its own `hfcache`, imported in a process of its own from ROOT), with
    placeholders for the sink, the next hop's port and the first receiver's port."""

    def __init__(self, name: str, root: Path, src_cache: Path):
        self.name, self.root, self.src = name, root.resolve(), src_cache

    def commands(self, names: list[str]) -> dict:
        ask = {"sink": SINK, "repo": REPO, "next": NEXT, "port": PORT, "src": str(self.src), "names": names}
        got = subprocess.run(
            [sys.executable, "-c", COMMANDS, str(self.root)], input=json.dumps(ask), capture_output=True, text=True
        )
        if got.returncode:
            raise RuntimeError(f"{self.root}: {got.stderr[-2000:]}")
        out = json.loads(got.stdout)
        if not Path(out["source"]).resolve().is_relative_to(self.root):  # never another tree's, silently
            raise RuntimeError(f"{self.name}: hfcache came from {out['source']}, not from {self.root}")
        return out


def variant(cmd: dict, width: int | None, io: str | None, relay: str | None = None) -> dict:
    """The commands with weights_send's `files=` (how many files in flight), weights_receive's
    `io=` (direct I/O left out) or `relay=` (a relay's forwarding: "splice" or "peek", receiver.relay_to) set:
    the programs' own arguments, for measuring what each buys."""
    cmd = dict(cmd)
    if width:
        cmd["send"] = cmd["send"].replace(f"{IP} {PORT} {IP} ", f"{IP} {PORT} {IP} files={width} ")
    for arg, keys in ((f"io={io}" if io else "", ("tail", "relay")), (f"relay={relay}" if relay else "", ("relay",))):
        for k in keys if arg else ():
            a, sep, b = cmd[k].rpartition(".sparkcluster-incoming ")
            cmd[k] = f"{a}{sep}{arg} {b}"
    return cmd


def cores_of(i: int, pin: int | None, send: int = 1) -> set[int] | None:
    """With `pin`, the cores a process may run on: the sender (i = 0) on the first `send` cores,
    receiver i on the `pin` cores after the ones before it (for pin=5 and one sender core: 1-5, 6-10,
    11-15 on 16 cores; pin=4 and four: sender 0-3, receivers 4-7, 8-11, 12-15); None: unpinned."""
    if not pin:
        return None
    if i == 0:
        return set(range(send))
    first = send + (i - 1) * pin
    got = set(range(first, first + pin)) & set(range(os.cpu_count() or 1))
    if len(got) < pin:
        raise RuntimeError(f"pin={pin}: receiver {i} needs cores {first}-{first + pin - 1}, there are {os.cpu_count()}")
    return got


def pinned(cpus: set[int] | None):
    """A preexec_fn that keeps the process (and every process it starts) on `cpus`."""
    return None if cpus is None else (lambda: os.sched_setaffinity(0, cpus))


def replicate(
    pkg: Pkg,
    sinks: list[Path],
    files: list[dict],
    blobs: list[str] | None = None,
    cut_at: float | None = None,
    width: int | None = None,
    io: str | None = None,
    pin: int | None = None,
    drop: bool = True,
    relay: str | None = None,
    send_cores: int = 1,
) -> dict:
    """One replication head -> sinks[0] -> sinks[1] ... as the weights stage runs it (hfcache's
    commands, every address 127.0.0.1): receivers started from the tail, each relay told its next
    hop's announced port, then the sender; `check` on every sink; a final sync. `cut_at`: kill the
    sender once it has sent that share of the bytes (no check then). `width`, `io`, `relay`: `variant`.
    `pin`: each receiver on `pin` cores of its own, the sender on `send_cores` (`cores_of`), so receivers
    sharing one machine do not share cores (they still share its memory bus). `drop`: page cache
    dropped first. Each receiver's own cost (`receivers`, head first: the relays, then the leaf) is
    its process's getrusage as reaped (`reap`), what it started included."""
    names = blobs if blobs is not None else [f["blob"] for f in files]
    total = sum(f["size"] for f in files if f["blob"] in names)
    cmd = variant(pkg.commands(names), width, io, relay)
    if drop:
        drop_caches()
    with Cores() as cores:
        t = time.monotonic()
        recvs, nxt = [], None
        for i, sink in reversed(list(enumerate(sinks, 1))):
            c = cmd["tail"] if nxt is None else cmd["relay"].replace(f"{IP},{NEXT},{IP}", f"{IP},{nxt},{IP}")
            p = cores.popen(
                ["bash", "-c", c.replace(SINK, str(sink))],
                stdin=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                preexec_fn=pinned(cores_of(i, pin, send_cores)),
            )
            keyed(p)
            line = p.stderr.readline()
            if not line.startswith("@@port "):
                raise RuntimeError(f"receiver said {line!r}: {p.stderr.read()[-2000:]}")
            nxt = int(line.split()[1])
            recvs.insert(0, p)
        send = cmd["send"].replace(f"{IP} {PORT} {IP}", f"{IP} {nxt} {IP}")
        snd = cores.popen(
            ["bash", "-c", send],
            stdin=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=pinned(cores_of(0, pin, send_cores)),
        )
        keyed(snd)
        sent, tail = 0, []
        for line in snd.stderr:
            if line.startswith("@@sent "):
                sent = int(line.split()[1])
                if cut_at is not None and sent >= cut_at * total:
                    os.killpg(snd.pid, 9)
                    break
            else:
                tail.append(line)
        snd.wait()
        spent = [reap(p) for p in recvs]
        codes = [p.returncode for p in recvs]
        streamed = time.monotonic() - t
        out = {"bytes": total, "sent": sent, "sender_rc": snd.returncode, "receiver_rc": codes}
        out["receivers"] = [round(c / (total / 1e9), 3) for c in spent]
        if snd.returncode and cut_at is None:
            out["sender_said"] = "".join(tail)[-1000:]
        if cut_at is None:
            manifest = json.dumps({"folder": cmd["folder"], "commit": COMMIT, "files": files, "ref": "main"})
            checks = []
            for sink in sinks:
                got = cores.popen(
                    ["bash", "-c", cmd["check"].replace(SINK, str(sink))],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                so, se = got.communicate(manifest)
                checks.append(json.loads(so.strip().splitlines()[-1]) if got.returncode == 0 else se[-500:])
            subprocess.run(["sync"], check=True)
            out["checks"] = [
                {k: c[k] for k in ("missing", "adopted", "corrupt")} if isinstance(c, dict) else c for c in checks
            ]
        secs = time.monotonic() - t
    out.update({"secs": secs, "streamed_s": streamed, "gb_s": rate(total, secs), **cores.per_gb(total)})
    return out


def reap(p: subprocess.Popen) -> float:
    """Waits for `p` and returns the core-seconds (user + sys) it and every process it waited for
    spent: wait4's rusage of that one child, so each receiver of a chain is told apart."""
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return ru.ru_utime + ru.ru_stime


def check_of(pkg: Pkg, sink: Path, files: list[dict]) -> dict:
    cmd = pkg.commands([])
    manifest = json.dumps({"folder": cmd["folder"], "commit": COMMIT, "files": files, "ref": "main"})
    got = subprocess.run(
        ["bash", "-c", cmd["check"].replace(SINK, str(sink))],
        input=manifest,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(got.stdout.strip().splitlines()[-1])


def resume(pkg: Pkg, sink: Path, files: list[dict], cut_at: float) -> dict:
    """A replication cut after `cut_at` of its bytes, `check`, then only what it says is missing."""
    cut = replicate(pkg, [sink], files, cut_at=cut_at)
    after = check_of(pkg, sink, files)
    again = replicate(pkg, [sink], files, blobs=after["missing"])
    return {
        "cut_sent": cut["sent"],
        "cut_receiver_rc": cut["receiver_rc"],
        "adopted_after_cut": after["adopted"],
        "missing_bytes": after["missing_bytes"],
        "resent": again["sent"],
        "checks": again.get("checks"),
    }


def cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "?"
    name = next((x.split(":", 1)[1].strip() for x in text.splitlines() if x.startswith("model name")), "?")
    return name + (" (sha_ni)" if " sha_ni" in text else "")


def table(res: dict) -> str:
    """The runs as a markdown table, and the budgets judged on each package's runs."""
    rows = ["| run | GB/s | s | core-s per GB | the programs' core-s per GB |", "|---|---:|---:|---:|---|"]
    for key, r in res.items():
        if isinstance(r, dict) and "gb_s" in r:
            progs = ", ".join(f"{k} {v:.2f}" for k, v in r.get("programs", {}).items())
            if len(r.get("receivers", [])) > 1:  # a chain: each relay's cost beside the leaf's
                progs += "; relays " + ", ".join(f"{v:.2f}" for v in r["receivers"][:-1])
                progs += f", leaf {r['receivers'][-1]:.2f}"
            elif r.get("receivers"):
                progs += f"; leaf alone {r['receivers'][0]:.2f}"
            cost = f"{r['core_s_per_gb']:.2f}" if "core_s_per_gb" in r else ""
            rows.append(f"| {key} | {r['gb_s']:.3f} | {r['secs']:.1f} | {cost} | {progs} |")
    out = "\n".join(rows) + "\n"
    link, disk, tar = (res.get(k, {}).get("gb_s") for k in ("tcp", "disk", "tar-disk"))
    for name in res.get("packages", {}):
        one, tone, three = (res.get(f"{name}:{k}", {}).get("gb_s") for k in ("one-disk", "one-tmpfs", "three-tmpfs"))
        judged = []
        if one and link and disk:
            judged.append(f"one receiver / min(link, disk) = {one / min(link, disk):.2f} (>= 0.8)")
        if one and tar:
            judged.append(f"one receiver / tar = {one / tar:.2f} (>= 1.5)")
        if tone and three:
            judged.append(f"chain of three / one, tmpfs, time = {tone / three:.2f} (<= 1.2)")
        out += f"\n{name}: " + "; ".join(judged) + "\n"
    for key in sorted(k for k in res if ":one-tmpfs:pin=" in k):
        three = res.get(key.replace(":one-tmpfs:", ":three-tmpfs:"), {}).get("gb_s")
        if res[key].get("gb_s") and three:
            out += f"\n{key.replace(':one-tmpfs', '')}: chain of three / one, tmpfs, time = "
            out += f"{res[key]['gb_s'] / three:.2f} (<= 1.2), each receiver on cores of its own"
            out += f", the sender on {res.get('sender_cores', 1)}\n"
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--gb", type=float, default=10.0)
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/weights-gpu"))
    ap.add_argument("--runs", default="tcp,disk,sha256,one-disk,tar-disk,one-tmpfs,three-tmpfs,resume")
    ap.add_argument("--shard-mb", type=int, default=SHARD // 10**6, help="a shard's size (the hub's: 2-5 GB)")
    ap.add_argument("--cut", type=float, default=0.6, help="the resume run's cut, a share of the bytes")
    ap.add_argument("--pkg", action="append", default=[], help="NAME=ROOT: a checkout's package to measure")
    ap.add_argument("--sender-cores", type=int, default=1, help="pin=N's cores for the sender (from core 0)")
    ap.add_argument("--rfs", action="store_true", help="loopback's receive work on the receiving process's core")
    a = ap.parse_args(argv)
    runs = set(a.runs.split(","))
    total = int(a.gb * 1e9)
    gb = int(a.gb) + 2
    a.out.mkdir(parents=True, exist_ok=True)
    work = a.work
    work.mkdir(parents=True, exist_ok=True)
    res: dict = {
        "gb": a.gb,
        "cores": os.cpu_count(),
        "cpu": cpu_model(),
        "drop_caches": drop_caches(),
        "python": sys.version.split()[0],
        "kernel": os.uname().release,
        "disk_fs": subprocess.run(["df", "-T", str(work)], capture_output=True, text=True).stdout.splitlines()[-1:],
        "sender_cores": a.sender_cores,
        "smt": Path("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list").read_text().strip(),
    }

    def run(key, fn, *args, **kw):
        """One run, noted; a run that fails is noted with its error and the rest go on (one call on
        a borrowed machine should bring back what it can)."""
        try:
            note(key, fn(*args, **kw))
        except Exception as e:  # noqa: BLE001
            note(key, {"error": f"{type(e).__name__}: {e}"[:2000]})

    def note(key, value):
        res[key] = value
        print(json.dumps({key: value}), flush=True)
        (a.out / "weights_gpu.json").write_text(json.dumps(res, indent=1))

    steered = steer(True) if a.rfs else {}
    res["rfs"] = {p: Path(p).read_text().strip() for p in steered}
    try:
        src = tmpfs(work / "src", gb)
        blobs = src / "hub" / f"models--{REPO.replace('/', '--')}" / "blobs"
        pkgs = [Pkg(n, Path(r or "."), src) for n, r in (p.split("=", 1) for p in a.pkg or ["this="])]
        note("packages", {p.name: str(p.root) for p in pkgs})
        t = time.monotonic()
        files = make_repo(blobs, total, a.shard_mb * 10**6)
        res["generate_s"] = time.monotonic() - t
        print(json.dumps({"generated": len(files), "secs": res["generate_s"]}), flush=True)
        if "tcp" in runs:
            run("tcp", raw_tcp, total)
        for key in sorted(r for r in runs if r.startswith("memcpy=")):  # the memory bus, N copiers at once
            run(key, memory_copy, int(key[7:]))
        if "sha256" in runs:
            run("sha256", sha256_rate, blobs, files)
        disk = work / "disk"
        disk.mkdir(exist_ok=True)
        if "disk" in runs:
            run("disk", disk_write, disk, total)
        for p in pkgs:
            if "one-disk" in runs:
                run(f"{p.name}:one-disk", replicate, p, [disk / "one"], files)
                shutil.rmtree(disk / "one", ignore_errors=True)
        if "tar-disk" in runs:
            run("tar-disk", tar_nc, blobs, disk / "tar", total)
            shutil.rmtree(disk / "tar", ignore_errors=True)
        sinks = [tmpfs(work / f"sink{i}", gb) for i in range(3)]
        for p in pkgs:
            for key, n in (("one-tmpfs", 1), ("three-tmpfs", 3)):
                if key in runs:
                    run(f"{p.name}:{key}", replicate, p, sinks[:n], files)
                    for s in sinks:
                        shutil.rmtree(s / "hub", ignore_errors=True)
        last = pkgs[-1]
        for key in sorted(r for r in runs if r.startswith(("files=", "io="))):  # the last package's variants
            how = {"width": int(key[6:])} if key.startswith("files=") else {"io": key[3:]}
            for where, sink in (("disk", disk / "one"), ("tmpfs", sinks[0])):
                run(f"{last.name}:one-{where}:{key}", replicate, last, [sink], files, **how)
                shutil.rmtree(sink if where == "disk" else sink / "hub", ignore_errors=True)
        for key in sorted(r for r in runs if r.startswith("pin=")):  # one, then three, each on cores of its own
            for p in pkgs:
                for name, n in (("one-tmpfs", 1), ("three-tmpfs", 3)):
                    run(
                        f"{p.name}:{name}:{key}",
                        replicate,
                        p,
                        sinks[:n],
                        files,
                        pin=int(key[4:]),
                        send_cores=a.sender_cores,
                    )
                    for s in sinks:
                        shutil.rmtree(s / "hub", ignore_errors=True)
        for key in sorted(r for r in runs if r.startswith("relay=")):  # the relays' forwarding, chosen
            for p in pkgs:
                for pin in [None] + sorted(int(r[4:]) for r in runs if r.startswith("pin=")):
                    name = f"{p.name}:three-tmpfs" + (f":pin={pin}" if pin else "") + f":{key}"
                    run(name, replicate, p, sinks[:3], files, pin=pin, relay=key[6:], send_cores=a.sender_cores)
                    for s in sinks:
                        shutil.rmtree(s / "hub", ignore_errors=True)
        if "resume" in runs:
            run(f"{last.name}:resume", resume, last, sinks[0], files, a.cut)
    finally:
        steer(False, steered)
        res["tmpfs"] = [str(m) for m in MOUNTED]
        (a.out / "weights_gpu.json").write_text(json.dumps(res, indent=1))
        (a.out / "weights_gpu.md").write_text(table(res))
        print(table(res), flush=True)
        for m in MOUNTED:
            umount(m)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path.cwd()))
    raise SystemExit(main())
