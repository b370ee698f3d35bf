"""`python -m perf.collect`: perf/results.md as one `make bench` run's whole record, its last step.

`perf.run` writes its record (perf/results.json) and its table; every other
family of `make bench` writes a table of its own (`FAMILIES`). This puts them together in one file,
in the order `make bench` runs them, each under its command, with the GPU machine's figures named
beside a family that has them. A family's table older than this run's start (`perf.run`'s record's
`when`) was not measured by this run: it is marked so, and the exit status is 1, so
that a run cut short never reads as a whole one.

The tree named is the one `perf.run` recorded at its start (`details.tree`); `--tree REV` names
another, and a record from before there was one falls back to the checkout's HEAD now.
"""

from __future__ import annotations

import argparse
import calendar
import json
import sys
import time
from pathlib import Path

from perf.run import RESULTS_JSON, RESULTS_MD, table_of, tree

PERF = Path(__file__).resolve().parent
SLACK_S = 60  # clocks' and file times' leeway under perf.run's start (its record's `when`, to the minute)

# (the command, its table, what it measures, the GPU machine's figures beside it), in make bench's order
FAMILIES = (
    ("python -m perf.run, its executors", "executors.md", "Ray against vLLM's own launch", ""),
    ("python -m perf.weights_cap", "weights_cap.md", "a capped replication beside the serving engine", ""),
    ("python -m perf.gateway_exposure", "gateway_exposure.md", "what a peer without a key can hold", ""),
    ("python -m perf.gateway_limits", "gateway_limits.md", "a key's limits against none", "gateway.md"),
    ("python -m perf.swap", "swap.md", "a swap on one Spark against a cold start", ""),
    ("python -m perf.console_load", "console_load.md", "the engine with a web console open", ""),
    ("python -m perf.nodes (switch)", "nodes-switch.md", "four Sparks through a switch", ""),
    ("python -m perf.weights_scale", "weights_scale.md", "weights at scale along the chain", "weights_gpu.md"),
    ("python -m perf.nodes (ring)", "nodes-ring.md", "four Sparks as a ring", ""),
)


def demoted(text: str) -> str:
    """A family's table under this file's headings: its own title left out (the section's heading
    names it), its other headings two levels down."""
    lines = text.strip().splitlines()
    if lines and lines[0].startswith("# "):
        lines = lines[1:]
    return "\n".join("##" + line if line.startswith("#") else line for line in lines).strip()


def collect(rev: str = "", results_json: Path = RESULTS_JSON, perf: Path = PERF) -> tuple[str, list[str]]:
    """The whole record's text, and the families whose tables this run did not write."""
    d = json.loads(results_json.read_text())
    details = d["details"]
    started = calendar.timegm(time.strptime(d["when"], "%Y-%m-%d %H:%M UTC")) - SLACK_S
    head = table_of(d)
    out = [
        f"# One `make bench` run, tree {rev or details.get('tree') or tree()}",
        "",
        "Every family of `make bench` from one run, in its order (written by `python -m perf.collect`).",
        "",
        "## The pair (`python -m perf.run`)",
        "",
        head.strip(),
    ]
    stale = []
    for cmd, name, what, beside in FAMILIES:
        path = perf / name
        out += ["", f"## {what[0].upper()}{what[1:]} (`{cmd}`)", ""]
        if not path.exists():
            stale.append(name)
            out.append("Not measured: this run wrote no table.")
            continue
        if path.stat().st_mtime < started:
            stale.append(name)
            when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(path.stat().st_mtime))
            out.append(f"**Not measured by this run**: the table below is from {when}.")
            out.append("")
        out.append(demoted(path.read_text()))
        if beside:
            out += ["", f"On the GPU machine the project borrows (16 and 32 cores): `perf/{beside}`."]
    return "\n".join(out) + "\n", stale


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m perf.collect", description=__doc__.splitlines()[0])
    ap.add_argument("--tree", default="", help="the revision the run measured (default: perf.run's record)")
    a = ap.parse_args(argv)
    text, stale = collect(a.tree)
    RESULTS_MD.write_text(text)
    print(f"wrote {RESULTS_MD.relative_to(PERF.parent)}", file=sys.stderr)
    if stale:
        print(f"not measured by this run: {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
