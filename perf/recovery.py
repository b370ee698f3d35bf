"""Recovery (issue 40 item 4), for `make bench` and alone (`python -m perf.recovery` on the testbed
that is up): a wedged rank to serving again, and a worker reboot to serving again, each divided by
the parts that are not sparkcluster's, timed by the hosts in the same run. Budget: at most 1.15.

Wedge: under load (requests running, so the stall clock counts: node/verdict), rank 1's worker
process stopped with SIGSTOP. Not ours: the profile's stall bound (`stall_s`, read from the
supervisor's state file: a stall that long is what makes it a wedge) and the engine's start that
brings it back (its serve record's `started_at`, the supervisor's exec, to the first moment
/health is 200 and a one-token completion answers, polled every 50 ms by the bench: the server
segment of `up`'s critical path, perf/up.py). Ours: finding the wedge past the bound, stopping the
engine, the backoff, the wait for memory and for the Ray members, and noticing it serves.

Reboot: the testbed's knob (the worker's dockerd and everything under it stopped, then started).
Not ours: the host's boot to its dockerd and our container started again by Docker's restart
policy (the knob's start to the worker container's `StartedAt`), Ray joining (that `StartedAt` to
its `ray start` printing "Ray runtime started.", as in `up`'s critical path) and the engine's
start as above. Stand-in limit: the knob leaves the kernel, sshd and links up, so "boot" here is
dockerd's stop and start, seconds where a Spark's is a minute or more; the ratio is the harder here.

"Serving again" ends at the later of the supervisor's state turning `serving` (its `since`) and
the probe's first answer. Once each whatever BENCH_REPS: the testbed profile allows two restarts
an hour.
"""

from __future__ import annotations

import json
import time

from perf.figures import Figure, info, say
from perf.hosts import ReadyProbe, our_container, rfc3339, serve_record
from perf.load import Load
from perf.session import PROFILE, standalone

BUDGET = 1.15
HEAD, WORKER = "spark-head", "spark-worker"
HEAD_C = "sparkcluster-testbed-head"
JOURNAL = "/var/log/sparkcluster/journal.jsonl"
VERDICTS = ("wedged", "dead", "not-ready")


def state(tb) -> dict:
    res = tb.sh(HEAD, f"docker exec {HEAD_C} cat /run/sparkcluster/supervisor.json", check=False)
    try:
        return json.loads(res.stdout) if res.returncode == 0 and res.stdout.strip() else {}
    except ValueError:
        return {}


def verdict_after(tb, since: float, timeout: float) -> dict:
    """The first verdict the head's supervisor journalled at or after `since`."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        res = tb.sh(HEAD, f"docker exec {HEAD_C} tail -n 200 {JOURNAL}", check=False)
        for line in res.stdout.splitlines() if res.returncode == 0 else []:
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if e.get("event") == "verdict" and e.get("kind") in VERDICTS and e.get("ts", 0) >= since:
                return e
        time.sleep(0.5)
    raise SystemExit(f"bench: no verdict in the head's journal within {timeout:.0f}s; supervisor: {state(tb)}")


def serving_after(s, since: float, probe: ReadyProbe, timeout: float) -> float:
    """When the cluster served again: the later of the supervisor's `serving` (its since) and the
    probe's first answer, both after `since`."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        st = state(s.tb)
        if st.get("state") == "serving" and st.get("since", 0) > since and probe.ready_at:
            return max(st["since"], probe.ready_at)
        time.sleep(0.5)
    raise SystemExit(f"bench: not serving again within {timeout:.0f}s; supervisor: {state(s.tb)}")


def engine_exec(s) -> float:
    """When the supervisor ran the restarted engine: its serve record's `started_at`."""
    return float(serve_record(s.tb)["started_at"])


def wedge(s) -> dict:
    tb = s.tb
    stall = float((state(tb).get("policy") or {}).get("stall_s") or s.prof.supervisor.stall_s)
    pids = tb.sh(WORKER, "pgrep -f RayWorkerProc || true").stdout.split()
    if not pids:
        raise SystemExit("bench: no rank-1 worker process on spark-worker")
    model = s.prof.served_model_name
    with Load(s.endpoint, model) as load:
        if not load.first_done.wait(120):
            raise SystemExit(f"bench: no completion under load before the wedge ({load.failures} requests failed)")
        t0 = time.time()
        try:
            tb.sh(WORKER, "kill -STOP " + " ".join(pids))
            v = verdict_after(tb, t0, stall + 300)
            load.stop()  # the old engine is being stopped: no load into the new one's start
            with ReadyProbe(s.endpoint, model) as probe:
                end = serving_after(s, t0, probe, 600)
                started = engine_exec(s)
        finally:
            tb.sh(WORKER, "kill -CONT " + " ".join(pids) + " 2>/dev/null || true", check=False)
    return {
        "total": end - t0,
        "stall_bound": stall,
        "detect": v["ts"] - t0,
        # ours, shown: the old engine's stop, the backoff, the waits for memory and Ray; then noticing
        "verdict_to_exec": started - v["ts"],
        "engine_start": probe.ready_at - started,
        "ready_to_serving": end - probe.ready_at,
        "verdict": v["kind"],
        "cause": v.get("cause", ""),
    }


def reboot(s) -> dict:
    tb, model = s.tb, s.prof.served_model_name
    t0 = time.time()
    tb.reboot(WORKER)
    v = verdict_after(tb, t0, 300)  # the old engine is gone: the probe sees only the new one
    with ReadyProbe(s.endpoint, model) as probe:
        end = serving_after(s, t0, probe, 900)
        exec_at = engine_exec(s)
    name = our_container(tb, WORKER)
    started = rfc3339(tb.docker(WORKER, f"inspect --format '{{{{.State.StartedAt}}}}' {name}").stdout)
    if started < t0:
        raise SystemExit(f"bench: {name} on {WORKER} was not started again by the reboot")
    line = tb.sh(
        WORKER,
        f"docker logs -t --since {int(started)} {name} 2>&1 | grep 'Ray runtime started' | tail -1",
        check=False,
    ).stdout.strip()
    if not line:
        raise SystemExit(f"bench: no 'Ray runtime started' in the log of {name} since its restart")
    joined = rfc3339(line.split()[0])
    return {
        "total": end - t0,
        "boot_to_container": started - t0,
        "ray_join": joined - started,
        "engine_start": probe.ready_at - exec_at,
        # ours, shown: the verdict, and from the worker's joining to the engine's exec; then noticing
        "verdict": v["ts"] - t0,
        "joined_to_exec": exec_at - joined,
        "ready_to_serving": end - probe.ready_at,
    }


def not_ours(kind: str, parts: dict) -> float:
    """The parts of a recovery that are not sparkcluster's (see the module's docstring)."""
    if kind == "wedge":
        return parts["stall_bound"] + parts["engine_start"]
    return parts["boot_to_container"] + parts["ray_join"] + parts["engine_start"]


def measure(s) -> None:
    """On the serving cluster of session `s`: a wedge, then a worker reboot, each to serving again."""
    if not s.serving():
        s.sc("up", "--profile", PROFILE, timeout=900)
    for kind, run in (("wedge", wedge), ("reboot", reboot)):
        parts = run(s)
        ratio = parts["total"] / not_ours(kind, parts)
        s.rec(f"{kind}_to_serving_s", parts["total"])
        s.rec(f"{kind}_parts", parts)
        s.rec(f"{kind}_ratio", ratio)
        say(
            f"  {kind} to serving again {parts['total']:.1f}s, / the parts not ours {ratio:.2f}: "
            + ", ".join(f"{k} {v:.1f}s" if isinstance(v, float) else f"{k} {v}" for k, v in parts.items())
        )


def figures(R: dict) -> list[Figure]:
    F: list[Figure] = []
    if R.get("wedge_ratio"):
        w = R["wedge_parts"]
        F += [
            Figure(
                "recovery_wedge",
                "wedged rank (SIGSTOP, under load) to serving again / (stall bound + engine start)",
                "ratio",
                f"<= {BUDGET}",
                R["wedge_ratio"],
                max(R["wedge_ratio"]) <= BUDGET,
            ),
            info("recovery_wedge_s", "  ... wedge to serving again", "s", R["wedge_to_serving_s"]),
            info("recovery_wedge_detect", "  ... wedge to the supervisor's verdict", "s", [p["detect"] for p in w]),
            info("recovery_wedge_bound", "  ... the profile's stall bound", "s", [p["stall_bound"] for p in w]),
            info(
                "recovery_wedge_engine",
                "  ... engine start (exec to a completion)",
                "s",
                [p["engine_start"] for p in w],
            ),
            info(
                "recovery_wedge_stop",
                "  ... ours: verdict to the new exec (stop, backoff, waits)",
                "s",
                [p["verdict_to_exec"] for p in w],
            ),
            info(
                "recovery_wedge_notice",
                "  ... ours: first completion to the supervisor's serving",
                "s",
                [p["ready_to_serving"] for p in w],
            ),
        ]
    elif R.get("wedge_to_serving_s"):  # a results.json from before the ratio
        F.append(info("wedge_to_serving", "rank 1 stopped (SIGSTOP) to serving again", "s", R["wedge_to_serving_s"]))
    if R.get("reboot_ratio"):
        b = R["reboot_parts"]
        F += [
            Figure(
                "recovery_reboot",
                "worker reboot to serving again / (boot to dockerd and container + Ray join + engine start)",
                "ratio",
                f"<= {BUDGET}",
                R["reboot_ratio"],
                max(R["reboot_ratio"]) <= BUDGET,
            ),
            info("recovery_reboot_s", "  ... reboot to serving again", "s", R["reboot_to_serving_s"]),
            info(
                "recovery_reboot_boot",
                "  ... boot to dockerd, container started again",
                "s",
                [p["boot_to_container"] for p in b],
            ),
            info("recovery_reboot_ray", "  ... Ray joining", "s", [p["ray_join"] for p in b]),
            info(
                "recovery_reboot_engine",
                "  ... engine start (exec to a completion)",
                "s",
                [p["engine_start"] for p in b],
            ),
            info(
                "recovery_reboot_verdict", "  ... the knob to the supervisor's verdict", "s", [p["verdict"] for p in b]
            ),
            info(
                "recovery_reboot_exec",
                "  ... ours: worker joined Ray to the new exec",
                "s",
                [p["joined_to_exec"] for p in b],
            ),
            info(
                "recovery_reboot_notice",
                "  ... ours: first completion to the supervisor's serving",
                "s",
                [p["ready_to_serving"] for p in b],
            ),
        ]
    elif R.get("reboot_to_serving_s"):
        F.append(info("reboot_to_serving", "worker reboot to serving again", "s", R["reboot_to_serving_s"]))
    return F


def main(argv: list[str] | None = None) -> int:
    return standalone(
        "recovery", "Recovery to serving again against the parts not ours (issue 40 item 4).", measure, figures, argv
    )


if __name__ == "__main__":
    raise SystemExit(main())
