"""`up`'s figures: from a cluster that is down (wall time against the critical path timed by the hosts
themselves, and where the rest goes), and on a cluster already serving (wall time, as a ratio to what
it cannot avoid, perf/floors.py, and proof that nothing was touched).

The critical path is the work that is not sparkcluster's: the head container's create to its
`ray start --head` saying "Ray runtime started.", the worker's create to joining the GCS, the
collective test, and the server's exec to answering a completion (polled every 50 ms by the bench,
independent of `up`'s own polling). Everything else is overhead, split by the CLI's stage lines.
"""

from __future__ import annotations

import re

from perf.figures import Figure, at_most_median, info, median_dicts
from perf.hosts import ReadyProbe, container_times, serve_record, serving_identity
from perf.session import PROFILE

OVERHEAD_TARGET = 1.10
RATIO_TARGET = 1.5


def measure_from_down(s, i: int) -> str:
    """One `up` from down (image in place); also records the image stage with identical image IDs.
    Returns the progress line."""
    s.sc("down", timeout=120)
    with s.sampler, ReadyProbe(s.endpoint, s.prof.served_model_name) as probe:
        r = s.sc("up", "--profile", PROFILE, timeout=600)
    hc, wc, sv = container_times(s.tb, "spark-head"), container_times(s.tb, "spark-worker"), serve_record(s.tb)
    if probe.ready_at is None:
        raise SystemExit("bench: the 50 ms readiness probe never saw the server ready")
    t_pre, t_pre_ok = r.at("▸ preflight"), r.at("✓ preflight")
    t_img, t_img_ok = r.at("▸ image"), r.at("✓ image")
    t_ray_ok, t_serve_ok = r.at("✓ ray"), r.at("✓ serve")
    t_fab, t_fab_ok = r.at("▸ fabric"), r.at("✓ fabric")
    segs = {
        "head: create -> Ray head started": hc["ray"] - hc["created"],
        "worker: create -> joined Ray": wc["ray"] - wc["created"],
        # the collective test (issue 26) is work on the hosts that must finish before the server
        # starts; its ranks' own clocks are not read, so the stage as the CLI timed it
        "fabric: the collective test (stage)": (t_fab_ok - t_fab) if t_fab and t_fab_ok else 0.0,
        "server: exec -> answers a completion": probe.ready_at - sv["started_at"],
    }
    cp = sum(segs.values())
    gaps = {
        "CLI start-up (interpreter, imports)": t_pre - r.t0,
        "preflight (connect, lock, facts, checks)": t_pre_ok - t_pre,
        "image stage (IDs equal)": t_img_ok - t_pre_ok,
        "before the head container": hc["created"] - t_img_ok,
        "Ray head started -> worker create (0.25 s poll)": wc["created"] - hc["ray"],
        "worker joined -> ray stage done (0.25 s poll)": t_ray_ok - wc["ray"],
        "probe, then serve exec": sv["started_at"] - t_ray_ok - segs["fabric: the collective test (stage)"],
        "server ready -> serve done (0.1 s poll, supervisor, warm-up)": t_serve_ok - probe.ready_at,
        "summary and exit": r.t1 - t_serve_ok,
    }
    link, _ = s.sampler.delta(t_img, t_img_ok)
    s.rec("up_down_wall", r.wall)
    s.rec("up_down_cp", cp)
    s.rec("up_down_ratio", r.wall / cp)
    s.rec("up_down_segments", segs)
    s.rec("up_down_gaps", gaps)
    s.rec("up_down_stages", {k: float(v) for k, v in re.findall(r"✓ (\w+) ([\d.]+)s", r.stderr)})
    s.rec("image_same_s", t_img_ok - t_img)
    s.rec("image_same_link_bytes", link)
    s.rec("conns_up_down", r.conns)
    return (
        f"  up from down #{i}: {r.wall:.2f}s, critical path {cp:.2f}s ({r.wall / cp:.2f}); "
        f"image stage {t_img_ok - t_img:.2f}s, {link} B on the link; ssh {r.conns}"
    )


def measure_on_serving(s) -> bool:
    """One `up` on the serving cluster: it must say nothing to do and change nothing. Returns
    whether the containers and the server PID are unchanged."""
    before = serving_identity(s.tb, s.hosts)
    r = s.sc("up", "--profile", PROFILE)
    after = serving_identity(s.tb, s.hosts)
    if "nothing to do" not in r.stdout:
        raise SystemExit(f"bench: up on a serving cluster did something:\n{r.stdout}\n{r.stderr}")
    s.rec("up_serving_wall", r.wall)
    s.rec("up_serving_unchanged", 1.0 if before == after else 0.0)
    s.rec("conns_up_serving", r.conns)
    return before == after


def figures(R: dict) -> list[Figure]:
    """The up-from-down rows (the "up" family) and the up-on-a-serving-cluster rows (measured with
    the "serving" family): a partial run shows the part it measured; neither raises KeyError."""
    F = []
    if "up_down_ratio" in R or "up_serving_wall" not in R:
        F += [
            at_most_median("up_overhead", "up from down: wall / critical path", OVERHEAD_TARGET, R["up_down_ratio"]),
            info("up_down_wall", "up from down: wall time", "s", R["up_down_wall"]),
            info("up_down_cp", "up from down: critical path (host timestamps)", "s", R["up_down_cp"]),
        ]
    # the wall time is shown, not judged: an absolute bound does not survive a slower machine
    F.append(info("up_serving_wall", "up on a cluster already serving: wall time", "s", R["up_serving_wall"]))
    if R.get("up_serving_floor_ratio"):
        F.append(
            at_most_median(
                "up_serving_floor_ratio",
                "  ... up / (start-up with its imports + connect and facts script on the slowest host)",
                RATIO_TARGET,
                R["up_serving_floor_ratio"],
            )
        )
    F.append(
        Figure(
            "up_serving_unchanged",
            "  ... containers and server PID unchanged (1 = yes)",
            "count",
            "1",
            R["up_serving_unchanged"],
            all(x == 1 for x in R["up_serving_unchanged"]),
        )
    )
    return F


def breakdown(R: dict) -> dict:
    """Where `up` from down spends its time (medians): the table under perf/results.md's figures."""
    return {
        "critical_path": median_dicts(R["up_down_segments"]),
        "overhead": median_dicts(R["up_down_gaps"]),
        "stages": median_dicts(R["up_down_stages"]),
    }
