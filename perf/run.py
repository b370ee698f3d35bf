"""`make bench` (python -m perf.run): sparkcluster's performance figures on the testbed.

Every figure is a ratio, a count or a duration measured in this run, the median of REPS
repetitions (default 5, `BENCH_REPS`), with min and max. Method per figure: perf/README.md.
Writes perf/results.json (git-ignored) and perf/results.md, and prints the table.

This module only orders the run and writes the results; each family of figures is measured in its
own module (doctor, up, status, memory, connections, image, monitoring, supervisor and recovery,
executors, compile_restarts, gateway; the short commands' floors in floors), and the testbed is
reached through perf/testbed.py alone.

The whole run holds the testbed's cooperative lock (/tmp/sparkcluster-testbed.lock). It uses the
testbed's cluster as its own: it takes it down and up several times, removes the cluster image on
the worker (sparkcluster sends it again), and runs a throwaway second sshd on the worker's
control address for the save-ssh-load baseline, removed at the end. At the end the cluster is
left serving if it was serving at the start, down otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from perf import (
    compile_restarts,
    connections,
    doctor,
    executors,
    floors,
    gateway,
    image,
    memory,
    monitoring,
    recovery,
    status,
    supervisor,
    testbed,
    up,
)
from perf.cli import CLI, REPO
from perf.figures import Figure, die, render, say
from perf.session import PROFILE, REPS, Session

RESULTS_JSON = REPO / "perf" / "results.json"
RESULTS_MD = REPO / "perf" / "results.md"
EXECUTORS_MD = REPO / "perf" / "executors.md"


def on_serving(s: Session, i: int) -> None:
    """Repetition i on a serving cluster: doctor, status --json and up (each a fresh CLI process),
    status in-process, the containers' memory, the doctor's fan-out, then the short commands' floors."""
    doctor.measure_cli(s)
    status.measure_cli(s)
    unchanged = up.measure_on_serving(s)
    status.measure_in_process(s)
    memory.measure_serving(s)
    both, single = doctor.measure_fanout(s, i)
    walls = {
        "doctor": s.last("doctor_cli_wall"),
        "status": s.last("status_wall"),
        "up_serving": s.last("up_serving_wall"),
    }
    ratios = floors.measure(s, walls)
    say(
        f"  serving #{i}: doctor {walls['doctor']:.2f}s, status {walls['status']:.2f}s, "
        f"up {walls['up_serving']:.2f}s (unchanged: {unchanged}); in-process both {both:.2f}s vs single "
        + ", ".join(f"{k} {v:.2f}s" for k, v in single.items())
        + "; / floor: "
        + ", ".join(f"{k} {v:.2f}" for k, v in ratios.items())
    )


# `--only`: the families a partial run measures, in the whole run's order
FAMILIES = ("up", "serving", "monitoring", "supervisor", "executors", "delta", "transfer", "compile", "gateway")


def bench(s: Session, only: tuple[str, ...] = FAMILIES) -> None:
    tb, img, reps = s.tb, image.Images(s), s.reps
    was_serving = s.serving()
    s.details["started_serving"] = was_serving
    if tb.image_id("spark-head", s.image) is None:
        say("the cluster image is not on the head: one unmeasured up builds it")
        s.sc("up", "--profile", PROFILE, timeout=1800)
    if not img.same_on_both():
        say("the worker's image differs: copying it first (unmeasured)")
        s.sc("down", timeout=120)
        if tb.image_id("spark-worker", s.image):
            img.worker_rmi()
        tb.copy_image(s.image)
    s.details["image"] = {"ref": s.image, "size_bytes": img.size()}

    if "up" in only:
        say(f"up from a cluster that is down, image in place ({reps}x)")
        for i in range(reps):
            say(up.measure_from_down(s, i))
    if "serving" in only and not s.serving():
        s.sc("up", "--profile", PROFILE, timeout=900)
    if "serving" in only:
        run_serving(s, reps)
    if "monitoring" in only:
        run_monitoring(s, reps)
    if "supervisor" in only:
        say("supervisor: its own CPU and memory while serving, then a wedge and a worker reboot to serving again")
        supervisor.measure(s)
    if "executors" in only:
        run_executors(s, reps)
    if "delta" in only:
        run_delta(s, img, reps)
    if "transfer" in only:
        run_transfer(s, img, reps)
    if "compile" in only:
        say(
            f"compile caches: engine start cold, warm after down/up, and a supervisor restart "
            f"({min(reps, compile_restarts.MAX_REPS)}x, {compile_restarts.PROFILE} on spark-head)"
        )
        compile_restarts.measure(s)
    if "gateway" in only:
        say(f"gateway: through it against straight to the engine, interleaved ({reps}x), and its idle memory")
        gateway.measure(s)
    if was_serving:
        say("leaving the cluster serving, as it was")
        s.sc("up", "--profile", PROFILE, timeout=600)


def run_serving(s: Session, reps: int) -> None:
    say(f"on a serving cluster: doctor, status --json, up, in-process fan-out, start-up and host floors ({reps}x)")
    for i in range(reps):
        on_serving(s, i)


def run_monitoring(s: Session, reps: int) -> None:
    say(
        f"monitoring (issue 37): its cost on each node, scrape time, throughput on / off, interleaved "
        f"({max(reps, monitoring.MIN_REPS)}x)"
    )
    try:
        monitoring.measure(s)
    except (SystemExit, Exception) as e:  # the other families' figures are kept; this one says why not
        say(f"monitoring not measured: {e}")
        s.rec("mon_error", str(e)[:300])


def run_executors(s: Session, reps: int) -> None:
    tb = s.tb
    say(f"executors: up from down, memory and idle CPU of both hosts, with ray and with mp ({reps}x)")
    s.details["executors"] = executors.measure(tb, s.sc, s.hosts, memory.containers_pss_bytes, reps)
    EXECUTORS_MD.write_text(
        executors.render(s.details["executors"], s.hosts, time.strftime("%Y-%m-%d %H:%M UTC"), reps)
    )


def run_delta(s: Session, img, reps: int) -> None:
    tb = s.tb
    say(f"image transfer, base on both hosts: bytes on the link / bytes of the layers the worker lacks ({reps}x)")
    s.sc("down", timeout=120)
    try:
        for i in range(reps):
            say(img.delta(i))
    finally:
        s.sc("down", timeout=120, check=False)
        if tb.image_id("spark-worker", s.image) is None:
            tb.copy_image(s.image)


def run_transfer(s: Session, img, reps: int) -> None:
    tb = s.tb
    say(f"image transfer, worker lacks every layer: sparkcluster vs docker save | ssh | docker load ({reps}x)")
    aside = s.workdir / "worker-images.tar"
    try:
        img.worker_bare(aside)
        with image.Baseline(tb, str(s.head.control_ip), str(s.worker.control_ip)) as baseline:
            for i in range(reps):
                img.transfer(i, baseline)
    finally:
        s.sc("down", timeout=120, check=False)  # what a Ctrl-C'd up may have left
        img.restore_worker(aside)
        if tb.image_id("spark-worker", s.image) is None:
            tb.copy_image(s.image)
    img.restore_aliases()


def figures(R: dict, image_size: int, hosts: tuple[str, ...] = testbed.HOSTS, partial: bool = False) -> list[Figure]:
    """The table's rows, family by family, from the raw repetitions (this run's or results.json's).
    `partial` (a run with --only): a family whose figures this run did not measure is left out."""
    rows = [
        lambda: doctor.figures(R),
        lambda: connections.figures(R, hosts),
        lambda: up.figures(R),
        lambda: memory.figures(R),
        lambda: image.delta_figures(R),
        lambda: image.transfer_figures(R, image_size),
        lambda: monitoring.figures(R),
        lambda: supervisor.figures(R),
        lambda: recovery.figures(R),
        lambda: compile_restarts.figures(R),
        lambda: gateway.figures(R),
        lambda: status.figures(R),
    ]
    out: list[Figure] = []
    for family in rows:
        try:
            out += family()
        except (KeyError, ValueError, IndexError):
            if not partial:
                raise
    return out


def tree() -> str:
    """The checkout's commit, short, with " + changes" when its tracked files differ from it."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()

    dirty = git("status", "--porcelain", "--untracked-files=no")
    return (git("rev-parse", "--short", "HEAD") or "?") + (" + changes" if dirty else "")


def table_of(d: dict) -> str:
    """perf.run's table from its record (perf/results.json's contents)."""
    figs = figures(d["raw"], d["details"]["image"]["size_bytes"])
    return render(figs, d["details"], d["when"], d.get("reps", REPS), d.get("cpus"))


def rerender() -> None:
    """`python -m perf.run --render`: perf/results.md again from the records (no testbed): the whole
    run's, as make bench's last step writes it (perf.collect), so a render never drops the other
    families' tables."""
    from perf import collect  # collect reads this module's record and table: imported here, not above

    collect.main([])


def executors_only() -> None:
    """`python -m perf.run --executors`: only the ray / mp comparison (issue 28), to perf/executors.md."""
    with testbed.locked():
        started = time.time()
        tb = testbed.connect()
        with tempfile.TemporaryDirectory(prefix="sparkcluster-bench-") as wd:
            raw = executors.measure(tb, CLI(tb, Path(wd)), testbed.HOSTS, memory.containers_pss_bytes, REPS)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started))
    table = executors.render(raw, testbed.HOSTS, when, REPS)
    EXECUTORS_MD.write_text(table)
    print(table)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m perf.run",
        description="sparkcluster's performance figures on the testbed (make bench); method: perf/README.md. "
        "BENCH_REPS sets the repetitions (default 5).",
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument("--render", action="store_true", help="write perf/results.md again from perf/results.json")
    which.add_argument("--executors", action="store_true", help="only the ray / mp comparison, to perf/executors.md")
    which.add_argument(
        "--only",
        default="",
        metavar="FAMILY[,FAMILY]",
        help=f"only these families ({', '.join(FAMILIES)}), to perf/results-<families>.md; "
        "perf/results.md stays the whole run's",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.render:
        return rerender()
    if os.geteuid() != 0:
        die("the testbed needs root (make bench as root, after make testbed-up)")
    if args.executors:
        return executors_only()
    only = tuple(f for f in args.only.split(",") if f) or FAMILIES
    unknown = sorted(set(only) - set(FAMILIES))
    if unknown:
        die(f"--only: no family {', '.join(unknown)} (families: {', '.join(FAMILIES)})")
    partial = only != FAMILIES
    measured = tree()  # what the run measures, named before it starts (a commit made meanwhile is not it)
    with testbed.locked():
        started = time.time()  # the run proper, after any wait for the lock
        tb = testbed.connect()
        with tempfile.TemporaryDirectory(prefix="sparkcluster-bench-") as wd:
            s = Session(tb, Path(wd))
            bench(s, only)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started))
    figs = figures(s.raw, s.details["image"]["size_bytes"], s.hosts, partial)
    details = dict(s.details)
    if "up" in only:
        details["up_down_breakdown"] = up.breakdown(s.raw)
    if "serving" in only:
        details["fanout_single_s"] = s.raw["fanout_single"]
        details["fanout_both_s"] = s.raw["fanout_both"]
    if "transfer" in only:
        details["baseline_wall_s"] = s.raw["xfer_base_wall"]
        details["transfer_image_stage_s"] = s.raw["xfer_sc_stage_s"]
    details["bench_seconds"] = round(time.time() - started, 1)
    details["tree"] = measured
    if partial:
        details["families"] = list(only)
    results_json, results_md = RESULTS_JSON, RESULTS_MD
    if partial:
        results_json = REPO / "perf" / f"results-{'+'.join(only)}.json"
        results_md = REPO / "perf" / f"results-{'+'.join(only)}.md"
    results_json.write_text(
        json.dumps(
            {
                "when": when,
                "reps": REPS,
                "cpus": os.cpu_count(),
                "figures": [f.as_dict() for f in figs],
                "details": details,
                "raw": s.raw,
            },
            indent=2,
        )
    )
    table = render(figs, details, when, REPS)
    if partial:
        table = f"Only the families {', '.join(only)} (python -m perf.run --only {','.join(only)}).\n\n" + table
    results_md.write_text(table)
    print(table)
    wrote = f"{results_json.relative_to(REPO)} and {results_md.relative_to(REPO)}"
    say(f"done in {time.time() - started:.0f}s; wrote {wrote}")


if __name__ == "__main__":
    main()
