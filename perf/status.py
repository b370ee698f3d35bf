"""`status --json` on a serving cluster: the CLI's wall time, that time as a ratio to what status
cannot avoid (perf/floors.py), and the same `status.status.collect_all` in-process, which separates the
interpreter's start-up from the work.
"""

from __future__ import annotations

import json
import time

from perf import testbed
from perf.figures import Figure, at_most_median, info

RATIO_TARGET = 1.5


def measure_cli(s) -> None:
    r = s.sc("status", "--json", check=False)
    st = json.loads(r.stdout)
    if st.get("state") != "healthy":
        raise SystemExit(f"bench: status says {st.get('state')}: {st.get('problems')}")
    s.rec("status_wall", r.wall)
    s.rec("conns_status", r.conns)


def measure_in_process(s) -> None:
    from sparkcluster.status import status as status_mod

    t = time.time()
    status_mod.collect_all(s.inv, testbed.API_KEY)
    s.rec("status_inprocess", time.time() - t)


def figures(R: dict) -> list[Figure]:
    # the wall time is shown, not judged: an absolute bound does not survive a slower machine
    F = [info("status_wall", "status --json on a serving cluster: wall time", "s", R["status_wall"])]
    if R.get("status_floor_ratio"):
        F.append(
            at_most_median(
                "status_floor_ratio",
                "  ... status / (start-up with its imports + connect and one round trip on the slowest host)",
                RATIO_TARGET,
                R["status_floor_ratio"],
            )
        )
    F.append(
        info(
            "status_inprocess",
            "  ... the same status, in-process (no interpreter start-up)",
            "s",
            R["status_inprocess"],
        )
    )
    return F
