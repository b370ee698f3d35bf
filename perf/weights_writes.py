"""What one write costs the cores by its size and mode (issue 61): 1 GiB written to a file in a
folder (argv[1], default /var/tmp) from a page-aligned buffer of random bytes, in pwrite calls of
4 MiB, 2 MiB, 1 MiB and 256 KiB through the page cache and of 4 MiB with O_DIRECT; the page cache
dropped before each (as root), then a sync. Prints each one's core-seconds per GB (this process's
getrusage: the kernel's copy into the page cache is charged to the writer), the seconds of its
writes, and with the sync. Usage: `python3 perf/weights_writes.py [FOLDER] [REPS]`.
"""

from __future__ import annotations

import mmap
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

MiB = 1 << 20
TOTAL = 1 << 30


def one(path: Path, mv: memoryview, flags: int, chunk: int) -> tuple[float, float, float]:
    subprocess.run(["sync"], check=True)
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        pass
    r0, t = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | flags, 0o644)
    try:
        for off in range(0, TOTAL, chunk):
            os.pwrite(fd, mv[:chunk], off)
    finally:
        os.close(fd)
    r1, wrote = resource.getrusage(resource.RUSAGE_SELF), time.monotonic() - t
    subprocess.run(["sync"], check=True)
    synced = time.monotonic() - t
    path.unlink()
    cpu = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
    return cpu / (TOTAL / 1e9), wrote, synced


def main() -> int:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "/var/tmp")
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    buf = mmap.mmap(-1, 4 * MiB)
    buf.write(os.urandom(4 * MiB))
    mv = memoryview(buf)
    print("| write | core-s per GB | s writing | s with sync |\n|---|---:|---:|---:|")
    for _ in range(reps):
        for label, flags, chunk in (
            ("4 MiB, page cache", 0, 4 * MiB),
            ("2 MiB, page cache", 0, 2 * MiB),
            ("1 MiB, page cache", 0, MiB),
            ("256 KiB, page cache", 0, MiB // 4),
            ("4 MiB, O_DIRECT", os.O_DIRECT, 4 * MiB),
        ):
            cpu, wrote, synced = one(folder / "weights-writes.bin", mv, flags, chunk)
            print(f"| {label} | {cpu:.2f} | {wrote:.2f} | {synced:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
