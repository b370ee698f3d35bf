"""A relay's cost beside a leaf's (issue 77): sparkcluster's weights replication over loopback, as
perf/weights_gpu.py runs it (the same commands, `replicate`), on a machine of few cores where the
GPU machine's tmpfs mounts and dropped page cache are not wanted (a shared workstation).

Runs, each of the whole repository, `--reps` times, the packages alternating:
- `leaf`: the head's sender to one receiver;
- `relay`: the head's sender to a relay, which forwards to a leaf;
- `splice`: the same with the relay's argument `relay=splice` (programs/receiver's Spliced: the
  forward spliced through pipes, not copied through the process; its own probe may fall back).
Each receiver's own cost is its process's getrusage (user + sys, what it started included) as
reaped, in core-seconds per GB of the repository. Over loopback the kernel's receive work for a
stream is partly done in the sending process's context (the loopback device delivers in its
sender's softirq), so a relay also carries some of its leaf's receive work, and a leaf alone some
of its own is charged to the head's sender.

The repository (`--gb`, in shards of `--shard-mb` and two small files, random bytes) and the sinks
are plain folders under `--work`: put it on a tmpfs (/dev/shm) so neither the source's reads nor a
disk bound the figures; the page cache is not dropped (a tmpfs is the page cache).

Usage: `python3 perf/weights_relay.py OUTDIR [--gb 1] [--work /dev/shm/weights-relay] [--reps 3]
[--pkg NAME=ROOT ...]`. Writes OUTDIR/weights_relay.json and prints the table (medians, min-max).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from weights_gpu import Pkg, cpu_model, make_repo, replicate  # noqa: E402

REPO_FOLDER = "hub"


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"


def table(res: dict) -> str:
    rows = [
        "| package | relay's forward | leaf alone | relay | its leaf | relay - leaf alone | GB/s leaf, chain |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for name in res["packages"]:

        def of(run, key, name=name):
            return [r[key] for r in res["runs"] if r["pkg"] == name and r["run"] == run and key in r]

        leaf = [x[0] for x in of("leaf", "receivers")]
        for run in ("relay", *res["forward"]):
            chain = of(run, "receivers")
            if not leaf or not chain:
                continue
            relay, tail = [c[0] for c in chain], [c[1] for c in chain]
            rows.append(
                f"| {name} | {'copy' if run == 'relay' else 'relay=' + run} | {spread(leaf)} | {spread(relay)} | "
                f"{spread(tail)} | {statistics.median(relay) - statistics.median(leaf):+.2f} | "
                f"{statistics.median(of('leaf', 'gb_s')):.2f}, {statistics.median(of(run, 'gb_s')):.2f} |"
            )
    return "\n".join(rows) + "\n\ncore-seconds (user + sys) per GB, median (min-max)\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--shard-mb", type=int, default=250)
    ap.add_argument("--work", type=Path, default=Path("/dev/shm/weights-relay"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--forward", type=lambda x: [m for m in x.split(",") if m], default=["splice"], help="relay=MODEs")
    ap.add_argument("--pkg", action="append", default=[], help="NAME=ROOT: a checkout's package to measure")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    src = a.work / "src"
    blobs = src / "hub" / "models--synthetic--weights-gpu" / "blobs"
    sinks = [a.work / "sink0", a.work / "sink1"]
    pkgs = [Pkg(n, Path(r or "."), src) for n, r in (p.split("=", 1) for p in a.pkg or ["this="])]
    res: dict = {
        "gb": a.gb,
        "cores": os.cpu_count(),
        "cpu": cpu_model(),
        "kernel": os.uname().release,
        "python": sys.version.split()[0],
        "loadavg_before": os.getloadavg(),
        "packages": {p.name: str(p.root) for p in pkgs},
        "forward": a.forward,
        "runs": [],
    }
    try:
        shutil.rmtree(a.work, ignore_errors=True)
        files = make_repo(blobs, int(a.gb * 1e9), a.shard_mb * 10**6)
        for rep in range(a.reps):
            for p in pkgs:
                for run, n in (("leaf", 1), ("relay", 2), *((m, 2) for m in a.forward)):
                    t = time.monotonic()
                    try:
                        r = replicate(p, sinks[:n], files, drop=False, relay=run if n == 2 and run != "relay" else None)
                        if any(r["receiver_rc"]) or r["sender_rc"] or any(not isinstance(c, dict) for c in r["checks"]):
                            r["error"] = "a receiver, the sender or a check failed"
                    except Exception as e:  # noqa: BLE001
                        r = {"error": f"{type(e).__name__}: {e}"[:2000]}
                    r.update({"pkg": p.name, "run": run, "rep": rep, "wall": time.monotonic() - t})
                    res["runs"].append(r)
                    print(json.dumps({k: r.get(k) for k in ("pkg", "run", "rep", "gb_s", "receivers", "error")}))
                    for s in sinks:
                        shutil.rmtree(s, ignore_errors=True)
    finally:
        res["loadavg_after"] = os.getloadavg()
        (a.out / "weights_relay.json").write_text(json.dumps(res, indent=1))
        shutil.rmtree(a.work, ignore_errors=True)
    print(table(res))
    (a.out / "weights_relay.md").write_text(table(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
