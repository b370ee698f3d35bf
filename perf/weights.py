"""Issue 15's budgets, measured on the testbed with its hub (`tests/testbed/hub`). Called from
perf/run.py with its Session as `bench` (the lead wires it: `weights_round(bench, baseline, i)` per
repetition inside the `with image.Baseline(...)` block, `weights_present(bench, run)` on each `up` of
`up.measure_from_down`, then `weights_figures(bench)` into `run.figures`). Not run by its author: no testbed was free.

Figures:
- hub bytes for a fresh two-node stage / the repo's size (budget 1.0: fetched once, not per node);
- bytes through the controller to the worker during that stage (the controller-side veth of the
  worker's LAN: SSH control traffic only; the weights go head->worker on the control link);
- replication throughput / a raw `tar | ssh | tar` of the same blobs over the same link (>= 0.90),
  both timed as the span during which the worker's control-link counter rose;
- with the weights present everywhere: the weights stage's own duration in `up` (< 1 s) and the hub
  bytes during it (0).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from perf import testbed
from perf.counters import sysfs_bytes
from perf.figures import Figure

SYNTHETIC = testbed.SYNTHETIC
PROFILE = "bench-weights"
REPO_DIR = f"hub/models--{SYNTHETIC.replace('/', '--')}"


def _cache() -> str:
    """The SSH user's HF cache on the hosts, from the testbed's facts file."""
    return testbed.hf_cache()


def _profile_dir(bench) -> Path:
    """The testbed profile with the synthetic repo as its model, in the bench's work dir."""
    d = Path(bench.sc.env.get("XDG_STATE_HOME", "/tmp")).parent / "bench-profiles"
    d.mkdir(parents=True, exist_ok=True)
    src = (testbed.PROFILES / "testbed.toml").read_text()
    (d / f"{PROFILE}.toml").write_text(re.sub(r"(?m)^model = .*$", f'model = "{SYNTHETIC}"', src))
    bench.sc.env["SPARKCLUSTER_PROFILES"] = testbed.profiles_env(d)
    return d


def _lan_worker_bytes() -> int:
    return sysfs_bytes(testbed.lan_veth("spark-worker"))


def weights_round(bench, baseline, i: int) -> None:
    _profile_dir(bench)
    tb, size = bench.tb, testbed.hub_stats()["repos"][SYNTHETIC]["size"]
    # 1. fresh on both nodes: the hub serves it once; nothing reaches the worker through the controller
    for h in ("spark-head", "spark-worker"):
        tb.sh(h, f"rm -rf {_cache()}/{REPO_DIR}")
    testbed.hub_knobs(bytes_served=0)
    lan0 = _lan_worker_bytes()
    bench.sc("weights", "pull", "--profile", PROFILE, timeout=1800)
    bench.rec("w_hub_ratio", testbed.hub_stats()["bytes_served"] / size)
    bench.rec("w_ctrl_worker_bytes", _lan_worker_bytes() - lan0)

    # 2. replication alone (worker emptied), then the raw baseline over the same link, order alternated
    def ours() -> None:
        tb.sh("spark-worker", f"rm -rf {_cache()}/{REPO_DIR}")
        with bench.sampler:
            t0 = time.time()
            bench.sc("weights", "pull", "--profile", PROFILE, timeout=1800)
            t1 = time.time()
        win = bench.sampler.window(t0, t1)
        if win is None:
            raise SystemExit("bench: no replication seen on the control link")
        bench.rec("w_repl_s", win[1] - win[0])
        bench.rec("w_repl_bytes", win[2])

    def theirs() -> None:
        d = "/tmp/sparkcluster-bench-weights"
        tb.sh("spark-worker", f"rm -rf {d} && mkdir -p {d}")
        with bench.sampler:
            t0 = time.time()
            tb.sh(
                "spark-head",
                f"set -o pipefail; tar -C {_cache()}/{REPO_DIR}/blobs -cf - . | {baseline.ssh} tar -C {d} -xf -",
                timeout=1800,
            )
            t1 = time.time()
        tb.sh("spark-worker", f"rm -rf {d}", check=False)
        win = bench.sampler.window(t0, t1)
        if win is None:
            raise SystemExit("bench: no baseline transfer seen on the control link")
        bench.rec("w_base_s", win[1] - win[0])

    for step in (ours, theirs) if i % 2 == 0 else (theirs, ours):
        step()
    bench.rec("w_repl_ratio", bench.raw["w_base_s"][-1] / bench.raw["w_repl_s"][-1])


def weights_present(bench, run, hub_bytes_before: int) -> None:
    """After an `up` from down with the model already on both nodes: the stage's duration (its
    "✓ weights N.Ns" line) and what the hub served meanwhile."""
    m = re.search(r"✓ weights ([0-9.]+)s", run.stderr)
    if m:
        bench.rec("w_present_s", float(m.group(1)))
    bench.rec("w_present_hub_bytes", testbed.hub_stats()["bytes_served"] - hub_bytes_before)


def weights_figures(bench) -> list:
    R, F = bench.raw, []
    if "w_hub_ratio" in R:
        F.append(
            Figure(
                "weights_hub_ratio",
                "hub bytes for a fresh two-node stage / model size",
                "ratio",
                "1.0",
                R["w_hub_ratio"],
                all(abs(x - 1.0) < 0.01 for x in R["w_hub_ratio"]),
            )
        )
        F.append(
            Figure(
                "weights_controller_bytes",
                "bytes to the worker through the controller during that stage (SSH control traffic only)",
                "bytes",
                "control only",
                R["w_ctrl_worker_bytes"],
                all(x < 1 << 20 for x in R["w_ctrl_worker_bytes"]),
            )
        )
        F.append(
            Figure(
                "weights_repl_ratio",
                "replication throughput / tar | ssh | tar",
                "ratio",
                ">= 0.90",
                R["w_repl_ratio"],
                all(x >= 0.90 for x in R["w_repl_ratio"]),
            )
        )
    if "w_present_s" in R:
        F.append(
            Figure(
                "weights_present_s",
                "weights stage with the snapshot on every node",
                "s",
                "< 1",
                R["w_present_s"],
                all(x < 1.0 for x in R["w_present_s"]),
            )
        )
        F.append(
            Figure(
                "weights_present_hub_bytes",
                "hub bytes with the snapshot on every node",
                "bytes",
                "0",
                [float(x) for x in R["w_present_hub_bytes"]],
                all(x == 0 for x in R["w_present_hub_bytes"]),
            )
        )
    return F
