"""A capped replication beside a serving engine (issue 61 item 3; the cap is issue 40's
`replication_max_mb_s`): `python -m perf.weights_cap` on the pair that is up (`make bench` runs it after
perf.run, with the pair serving). Run 2026-11-28 (perf/weights_cap.md at 20 MB/s, 1024 MB: median 0.974,
met; perf/weights_cap-40.md at 40 MB/s, 2048 MB: median 0.891, not met), hence the default cap of 20.

Method. The cluster serves the testbed profile under perf/load.py's steady load (four requests in
flight, 64 tokens each with ignore_eos). The scale hub (perf/testbed.scale_hub, WEIGHTS_MB, default
2048) holds a repository of random shards that a copy of the testbed's inventory names as its
`hf_endpoint`, with `replication_max_mb_s = CAP_MB_S` (default 20) in its `[cluster]`; the head
fetches it once. Per repetition, interleaved (the order alternates): one window of WINDOW_S idle
(nothing replicating) and one during a replication to the worker (its copy removed first, then
`weights pull`, the same stage as `up`; the window begins LEAD_S after the pull starts, once the
head's resolve and the nodes' checks are done, and counts only when the pull is still running at
its end). In each, the engine's generated tokens a second from its own counter at both ends
(perf/load.throughput). Figure: tok/s during the capped replication / idle, budget >= 0.9 on the
median; the pull's own rate is shown beside (its "sent to" line), so a cap that did not hold shows.
The testbed's hosts share two cores: the engine and the replication's programs compete for them,
which a Spark's 20 cores would not.
"""

from __future__ import annotations

import os
import re
import shlex
import threading
import time

from perf import load, testbed
from perf.figures import Figure, at_least_median, info, say
from perf.session import PROFILE, standalone
from perf.weights_scale import SIZE_MB, Scale

CAP_MB_S = float(os.environ.get("CAP_MB_S", "20"))
WINDOW_S, LEAD_S, MIN_REPS = 20.0, 5.0, 3
BUDGET = 0.9
SENT = re.compile(r"sent to \S+: [\d.]+ MB in [\d.]+s, ([\d.]+) MB/s")


def capped(x: Scale, cap: float) -> None:
    """The scale inventory's copy with the cap in its [cluster]."""
    text = x.inventory.read_text()
    text = re.sub(r"(?m)^replication_max_mb_s = .*\n", "", text)
    x.inventory.write_text(re.sub(r"(?m)^\[cluster\]\n", f"[cluster]\nreplication_max_mb_s = {cap:g}\n", text, count=1))


def during(s, x: Scale, worker: str) -> tuple[float, float | None, bool]:
    """(tok/s, the pull's MB/s, whether the pull outlasted the window): the worker's copy removed, the
    pull started, the window measured once it is replicating."""
    x.empty([worker])
    got: dict = {}
    pull = threading.Thread(target=lambda: got.setdefault("r", x.pull(check=False)), daemon=True)
    pull.start()
    time.sleep(LEAD_S)
    tput = load.throughput(s.endpoint, s.prof.served_model_name, WINDOW_S)
    overlapped = pull.is_alive()
    pull.join(7200)
    r = got.get("r")
    m = SENT.search(r.stderr) if r is not None else None
    return tput, float(m.group(1)) if m else None, overlapped


def measure(s) -> None:
    if not s.serving():
        s.sc("up", "--profile", PROFILE, timeout=900)
    with testbed.scale_hub(SIZE_MB) as (endpoint, files):
        x = Scale(s, endpoint, files)
        worker = x.workers[0]
        capped(x, CAP_MB_S)
        say(f"weights cap: {x.size / 1e9:.2f} GB to {worker} at most {CAP_MB_S:g} MB/s, beside the serving engine")
        s.details["weights_cap"] = {"bytes": x.size, "cap_mb_s": CAP_MB_S, "window_s": WINDOW_S, "lead_s": LEAD_S}
        try:
            x.pull()  # the head's copy, fetched once
            for i in range(max(s.reps, MIN_REPS)):
                order = ("idle", "capped") if i % 2 == 0 else ("capped", "idle")
                row: dict = {}
                for what in order:
                    if what == "idle":
                        row["idle"] = load.throughput(s.endpoint, s.prof.served_model_name, WINDOW_S)
                    else:
                        row["capped"], row["pull_mb_s"], row["overlapped"] = during(s, x, worker)
                s.rec("wc_row", row)
                say(
                    f"  #{i}: idle {row['idle']:.1f} tok/s, capped replication {row['capped']:.1f} tok/s "
                    f"(pull {row['pull_mb_s'] or 0:.1f} MB/s{'' if row['overlapped'] else ', ended inside the window'})"
                )
        finally:
            for h in x.hosts:
                s.tb.sh(h, f"rm -rf {shlex.quote(x.repo_dir)}", check=False)
            x.inventory.unlink(missing_ok=True)


def figures(R: dict) -> list[Figure]:
    rows = [r for r in R.get("wc_row", []) if r.get("overlapped")]
    if not rows:
        return []
    ratio = [r["capped"] / r["idle"] for r in rows]
    return [
        at_least_median(
            "wc_serving_ratio",
            f"serving tok/s during a replication capped at {CAP_MB_S:g} MB/s / idle",
            BUDGET,
            ratio,
        ),
        info("wc_pull_mb_s", "the capped replication's own rate", "MB/s", [r["pull_mb_s"] or 0.0 for r in rows]),
        info("wc_idle_tok_s", "serving tok/s, idle", "tok/s", [r["idle"] for r in rows]),
    ]


def main(argv: list[str] | None = None) -> int:
    return standalone(
        "weights_cap",
        "Serving tok/s during a replication capped by replication_max_mb_s, against idle (issue 61). "
        "CAP_MB_S (default 20), WEIGHTS_MB (default 2048).",
        measure,
        figures,
        argv,
    )


if __name__ == "__main__":
    raise SystemExit(main())
