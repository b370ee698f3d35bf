"""Weights replication where the cores are (issue 61, a first run): sparkcluster's own node programs
for a replication, run as local processes over loopback on the GPU machine the project borrows
(16 cores, its own disk), against limits measured in the same run.

What runs is what the weights stage runs on the nodes, from the shell commands it builds
(`movement/hfcache.send_command`, `receive_command`, `check_command`: programs/stream_sender,
receiver, weights_receive, weights_cache), here with every address 127.0.0.1; SSH and paramiko are
not measured (the commands run in local `bash`). The repository is synthetic and not compressible:
safetensors-shaped shards of random bytes (numpy's PCG64) named by their sha256, beside small files
named by their git sha1, as huggingface_hub's cache holds them. The source sits on a tmpfs, so its
reads are not the bound; page cache is dropped before each run (where the kernel lets us).

Runs, each of the whole repository:
- `tcp`: raw TCP over loopback, Python both ends (1 MiB sendall / recv_into): the link's limit;
- `disk`: the sink's write rate: O_DIRECT writes of 4 MiB, then fsync;
- `one-disk`: one receiver writing the HF cache on the disk, then `check` (adopt, verify), then sync;
- `tar-disk`: `tar -c | (Python stand-in for nc) | tar -x` onto the disk, then sync (there is no nc);
- `one-tmpfs`, `three-tmpfs`: one receiver, then a chain of three (each receiver relays to the next,
  each on its own tmpfs), with `check` on each;
- `resume`: a replication to a tmpfs cut after about 40 % of its bytes, `check`, then only what it
  says is missing sent again: the bytes sent the second time against the bytes missing.
Figures: GB/s (10^9 bytes) of the repository over each run's wall time.

Usage (as root, from a checkout whose sparkcluster has programs/ as modules):
`python3 perf/weights_gpu.py OUTDIR [--gb 10] [--work /var/tmp/weights-gpu]`. Writes OUTDIR/weights_gpu.json.
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


def make_repo(blobs: Path, total: int) -> list[dict]:
    """The manifest's files: shards summing to `total`, and three small files (git sha1 names)."""
    from multiprocessing import Pool

    blobs.mkdir(parents=True, exist_ok=True)
    sizes = [SHARD] * (total // SHARD) + ([total % SHARD] if total % SHARD else [])
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


def tar_nc(src: Path, dst: Path, total: int) -> dict:
    dst.mkdir(parents=True, exist_ok=True)
    drop_caches()
    t = time.monotonic()
    recv = subprocess.Popen(
        f"python3 -c {sh(NC_RECV)} | tar -x -f - -C {sh(str(dst))}", shell=True, stderr=subprocess.PIPE, text=True
    )
    port = recv.stderr.readline().strip()
    subprocess.run(
        f"set -o pipefail; tar -c -f - -C {sh(str(src))} . | python3 -c {sh(NC_SEND)} {port}",
        shell=True,
        check=True,
        executable="/bin/bash",
    )
    recv.wait()
    subprocess.run(["sync"], check=True)
    secs = time.monotonic() - t
    return {"bytes": total, "secs": secs, "gb_s": rate(total, secs), "rc": recv.returncode}


def sh(text: str) -> str:
    import shlex

    return shlex.quote(text)


# -- sparkcluster's replication ----------------------------------------------------------------------


def replicate(
    src_cache: Path, sinks: list[Path], files: list[dict], blobs: list[str] | None = None, cut_at: float | None = None
) -> dict:
    """One replication head -> sinks[0] -> sinks[1] ... as the weights stage runs it (hfcache's
    commands, every address 127.0.0.1): receivers started from the tail, each relay told its next
    hop's announced port, then the sender; `check` on every sink; a final sync. `cut_at`: kill the
    sender once it has sent that share of the bytes (no check then)."""
    from sparkcluster.movement import hfcache, transfer

    names = blobs if blobs is not None else [f["blob"] for f in files]
    total = sum(f["size"] for f in files if f["blob"] in names)
    drop_caches()
    t = time.monotonic()
    recvs, nxt = [], None
    for sink in reversed(sinks):
        fwd = transfer.next_hop("127.0.0.1", nxt, "127.0.0.1") if nxt is not None else None
        cmd = hfcache.receive_command(str(sink), REPO, "127.0.0.1", "127.0.0.1", fwd)
        p = subprocess.Popen(["bash", "-c", cmd], stderr=subprocess.PIPE, text=True, start_new_session=True)
        line = p.stderr.readline()
        if not line.startswith("@@port "):
            raise RuntimeError(f"receiver said {line!r}: {p.stderr.read()[-2000:]}")
        nxt = int(line.split()[1])
        recvs.insert(0, p)
    send = hfcache.send_command(str(src_cache), REPO, names, "127.0.0.1", nxt, "127.0.0.1")
    snd = subprocess.Popen(["bash", "-c", send], stderr=subprocess.PIPE, text=True, start_new_session=True)
    sent = 0
    for line in snd.stderr:
        if line.startswith("@@sent "):
            sent = int(line.split()[1])
            if cut_at is not None and sent >= cut_at * total:
                os.killpg(snd.pid, 9)
                break
    snd.wait()
    codes = [p.wait() for p in recvs]
    streamed = time.monotonic() - t
    out = {"bytes": total, "sent": sent, "sender_rc": snd.returncode, "receiver_rc": codes}
    if cut_at is None:
        manifest = json.dumps({"folder": hfcache.repo_folder(REPO), "commit": COMMIT, "files": files, "ref": "main"})
        checks = []
        for sink in sinks:
            got = subprocess.run(
                ["bash", "-c", hfcache.check_command(str(sink))], input=manifest, capture_output=True, text=True
            )
            checks.append(json.loads(got.stdout.strip().splitlines()[-1]) if got.returncode == 0 else got.stderr[-500:])
        subprocess.run(["sync"], check=True)
        out["checks"] = [
            {k: c[k] for k in ("missing", "adopted", "corrupt")} if isinstance(c, dict) else c for c in checks
        ]
    secs = time.monotonic() - t
    out.update({"secs": secs, "streamed_s": streamed, "gb_s": rate(total, secs)})
    return out


def check_of(sink: Path, files: list[dict]) -> dict:
    from sparkcluster.movement import hfcache

    manifest = json.dumps({"folder": hfcache.repo_folder(REPO), "commit": COMMIT, "files": files, "ref": "main"})
    got = subprocess.run(
        ["bash", "-c", hfcache.check_command(str(sink))], input=manifest, capture_output=True, text=True, check=True
    )
    return json.loads(got.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--gb", type=float, default=10.0)
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/weights-gpu"))
    ap.add_argument("--runs", default="tcp,disk,one-disk,tar-disk,one-tmpfs,three-tmpfs,resume")
    a = ap.parse_args(argv)
    runs = set(a.runs.split(","))
    total = int(a.gb * 1e9)
    gb = int(a.gb) + 2
    a.out.mkdir(parents=True, exist_ok=True)
    work = a.work
    work.mkdir(parents=True, exist_ok=True)
    res: dict = {"gb": a.gb, "cores": os.cpu_count(), "drop_caches": drop_caches(), "python": sys.version.split()[0]}
    try:
        from sparkcluster.movement import hfcache

        src = tmpfs(work / "src", gb)
        blobs = Path(hfcache.blobs_dir(str(src), REPO))
        t = time.monotonic()
        files = make_repo(blobs, total)
        res["generate_s"] = time.monotonic() - t
        print(json.dumps({"generated": len(files), "secs": res["generate_s"]}), flush=True)

        def note(key, value):
            res[key] = value
            print(json.dumps({key: value}), flush=True)
            (a.out / "weights_gpu.json").write_text(json.dumps(res, indent=1))

        if "tcp" in runs:
            note("tcp", raw_tcp(total))
        disk = work / "disk"
        disk.mkdir(exist_ok=True)
        if "disk" in runs:
            note("disk", disk_write(disk, total))
        if "one-disk" in runs:
            note("one-disk", replicate(src, [disk / "one"], files))
            shutil.rmtree(disk / "one", ignore_errors=True)
        if "tar-disk" in runs:
            note("tar-disk", tar_nc(blobs, disk / "tar", total))
            shutil.rmtree(disk / "tar", ignore_errors=True)
        sinks = []
        for i in range(3):
            sinks.append(tmpfs(work / f"sink{i}", gb))
        if "one-tmpfs" in runs:
            note("one-tmpfs", replicate(src, sinks[:1], files))
            for s in sinks:
                shutil.rmtree(s / "hub", ignore_errors=True)
        if "three-tmpfs" in runs:
            note("three-tmpfs", replicate(src, sinks, files))
            for s in sinks:
                shutil.rmtree(s / "hub", ignore_errors=True)
        if "resume" in runs:
            cut = replicate(src, sinks[:1], files, cut_at=0.4)
            after = check_of(sinks[0], files)
            missing = after["missing"]
            again = replicate(src, sinks[:1], files, blobs=missing)
            note(
                "resume",
                {
                    "cut_sent": cut["sent"],
                    "cut_receiver_rc": cut["receiver_rc"],
                    "adopted_after_cut": after["adopted"],
                    "missing_bytes": after["missing_bytes"],
                    "resent": again["sent"],
                    "checks": again.get("checks"),
                },
            )
    finally:
        res["tmpfs"] = [str(m) for m in MOUNTED]
        (a.out / "weights_gpu.json").write_text(json.dumps(res, indent=1))
        for m in MOUNTED:
            umount(m)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path.cwd()))
    raise SystemExit(main())
