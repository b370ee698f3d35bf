"""Four Sparks (issue 27): the figures `make bench` cannot take on the pair, on a four-host testbed
(`make testbed-up HOSTS=4`, then `python -m perf.nodes`; it refuses any other testbed).

- image distribution: the image stage of `up` when three workers lack the cluster image, divided
  by the same when one worker lacks it (the same bytes per worker, the same links). Through a switch
  the profile is `testbed-pp` (TP=2 x PP=2 over Ray: the Ray layer is what travels); on a ring it is
  `testbed-ring` (TP=4 with `mp`, the only layout lint accepts on a ring, issue 35: the base image
  itself travels, as `mp` serves it as it is). Each `up` is stopped with Ctrl-C once its image stage
  is done (nothing else is measured there).
- doctor: the doctor's work in-process on all four nodes (preflight.run, connections in parallel)
  divided by the slowest node alone (its own connection, probe script and path-MTU pings).

Writes perf/nodes-switch.md or perf/nodes-ring.md (SPARKCLUSTER_TESTBED_CABLING=ring at bring-up).
REPS from $BENCH_REPS (default 3).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
from datetime import UTC, datetime
from pathlib import Path

from perf import doctor, testbed
from perf.cli import CLI
from perf.figures import say
from sparkcluster import log
from sparkcluster.config import images
from sparkcluster.config import inventory as inventories
from sparkcluster.config import profile as profiles

PROFILES = {"switch": "testbed-pp", "ring": "testbed-ring"}  # what lint accepts on each cabling
HERE = Path(__file__).resolve().parent


def image_stage(tb: testbed.Testbed, sc: CLI, image: str, lacking: list[str], profile: str) -> float:
    """Seconds of the image stage when the workers in `lacking` lack the cluster image."""
    for w in lacking:
        if tb.image_id(w, image):
            tb.docker(w, f"rmi {image}")

    def stop_after_image(line: str, p) -> None:
        if line.startswith("✓ image"):
            p.send_signal(signal.SIGINT)

    r = sc("up", "--profile", profile, check=False, on_line=stop_after_image, timeout=900)
    t0, t1 = r.at("▸ image"), r.at("✓ image")
    if t1 is None:
        raise SystemExit(f"bench: up did not finish its image stage\n{r.stderr}")
    head = tb.image_id(tb.hosts[0], image)
    if any(tb.image_id(w, image) != head for w in lacking):
        raise SystemExit("bench: a worker's image ID differs from the head's after the stage")
    sc("down", timeout=300, check=False)
    return t1 - t0


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(
        prog="python -m perf.nodes",
        description="Four Sparks (issue 27): image distribution to three workers / one, doctor on four / the "
        "slowest alone, on a four-host testbed; writes perf/nodes-<wiring>.md. BENCH_REPS sets the repetitions.",
    ).parse_args(argv)
    tb = testbed.Testbed()
    if len(tb.hosts) != 4 or tb.problems():
        raise SystemExit("perf.nodes needs a healthy four-host testbed: make testbed-down && make testbed-up HOSTS=4")
    reps = int(os.environ.get("BENCH_REPS", "3"))
    wiring = testbed.wiring(tb)
    out = HERE / f"nodes-{wiring}.md"
    workdir = Path(os.environ.get("BENCH_WORKDIR", "/tmp/sparkcluster-bench-nodes"))
    workdir.mkdir(parents=True, exist_ok=True)
    os.environ["XDG_STATE_HOME"] = str(workdir / "state-inprocess")
    log.configure("warning")
    sc = CLI(tb, workdir, hosts=tuple(tb.hosts))
    profile = PROFILES.get(wiring, PROFILES["switch"])
    inv, prof = inventories.load(tb.inventory), profiles.load_profile(profile)
    image = images.image_ref(inv, prof)
    sc("down", timeout=300, check=False)
    workers = list(tb.hosts[1:])
    one, three, dr = [], [], []
    for i in range(reps):
        one.append(image_stage(tb, sc, image, workers[:1], profile))
        three.append(image_stage(tb, sc, image, workers, profile))
        t_all, alone = doctor.fanout(inv, prof)
        dr.append(t_all / max(alone.values()))
        say(
            f"  #{i}: image stage, one worker lacking {one[-1]:.1f}s, three {three[-1]:.1f}s "
            f"({three[-1] / one[-1]:.2f}); doctor four {t_all:.2f}s, slowest alone {max(alone.values()):.2f}s "
            f"({dr[-1]:.2f})"
        )
    ratio = [t / o for t, o in zip(three, one)]

    def row(name, unit, target, xs, ok=None):
        med = statistics.median(xs)
        verdict = "-" if ok is None else ("yes" if ok(med) else "**no**")
        return f"| {name} | {med:.2f} | {min(xs):.2f} | {max(xs):.2f} | {unit} | {target} | {verdict} |"

    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    text = "\n".join(
        [
            f"Four Sparks, {'a ring' if wiring == 'ring' else 'through a switch'} (issue 27), {when}: the four-host "
            f"testbed (HOSTS=4{', cabling ring' if wiring == 'ring' else ''}), real vLLM 0.32 CPU "
            f"image, profile {profile}, {reps} repetition(s); median, min, max.",
            "",
            "| figure | median | min | max | unit | target | met |",
            "|---|---:|---:|---:|---|---|---|",
            row(
                "image distribution: three workers lacking / one worker lacking (image stage)",
                "ratio",
                "<= 1.2",
                ratio,
                lambda m: m <= 1.2,
            ),
            row("  ... image stage, one worker lacking", "s", "-", one),
            row("  ... image stage, three workers lacking (one stream along the chain)", "s", "-", three),
            row("doctor on four nodes / slowest node alone (in-process)", "ratio", "<= 1.25", dr, lambda m: m <= 1.25),
            "",
            "Weights along the chain: perf/weights_scale.md (a repository of its own; the testbed's model is 1.7 MB).",
            "",
        ]
    )
    out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
