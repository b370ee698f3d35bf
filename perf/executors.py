"""Executor comparison for `make bench` (issue 28): the same testbed serving the same tiny model with
TP=2 over Ray (`testbed`) and with vLLM's own multi-node launch (`testbed-mp`).

Per executor, REPS times: `up` from down (wall time, the CLI's), then, serving idle (no request),
the memory of both hosts' containers (PSS, shared pages counted once: memory.PSS_OF_CONTAINERS) and their
CPU over IDLE_WINDOW_S (the CPU time of every process in a docker container of the host, from
/proc/<pid>/stat). Figures: up(mp) / up(ray), and each executor's memory and idle CPU per host.
`python -m perf.run --executors` runs this alone and writes perf/executors.md.
"""

from __future__ import annotations

import statistics
import time

IDLE_WINDOW_S = 30.0
SETTLE_S = 10.0  # after `up` returns: the warm-up request's tail and the first supervisor looks
PROFILES = {"ray": "testbed", "mp": "testbed-mp"}
# CPU ticks (utime + stime) of every process in a docker container of the host
CPU_OF_CONTAINERS = (
    't=0; for p in /proc/[0-9]*; do grep -qs docker "$p/cgroup" || continue; '
    "s=$(cut -d')' -f2- \"$p/stat\" 2>/dev/null) || continue; set -- $s; "
    "t=$((t + ${12:-0} + ${13:-0})); done; echo $t"
)


def containers_cpu_ticks(tb, host: str) -> int:
    return int(tb.sh(host, CPU_OF_CONTAINERS).stdout.strip() or 0)


def idle_cpu_pct(tb, hosts) -> dict[str, float]:
    """Percent of one core each host's containers use over IDLE_WINDOW_S with no request."""
    hz = int(tb.sh(hosts[0], "getconf CLK_TCK").stdout.strip() or 100)
    a, t0 = {h: containers_cpu_ticks(tb, h) for h in hosts}, time.monotonic()
    time.sleep(IDLE_WINDOW_S)
    b, t1 = {h: containers_cpu_ticks(tb, h) for h in hosts}, time.monotonic()
    return {h: 100.0 * (b[h] - a[h]) / hz / (t1 - t0) for h in hosts}


def measure(tb, sc, hosts, pss, reps: int) -> dict[str, dict[str, list[float]]]:
    """{executor: {figure: [value per repetition]}}; leaves the cluster down."""
    raw: dict[str, dict[str, list[float]]] = {e: {} for e in PROFILES}
    for _ in range(reps):
        for executor, profile in PROFILES.items():
            sc("down", timeout=180)
            r = sc("up", "--profile", profile, timeout=900)
            raw[executor].setdefault("up_wall_s", []).append(r.wall)
            time.sleep(SETTLE_S)
            for h in hosts:
                raw[executor].setdefault(f"pss_gib_{h}", []).append(pss(tb, h) / 2**30)
            for h, pct in idle_cpu_pct(tb, hosts).items():
                raw[executor].setdefault(f"idle_cpu_pct_{h}", []).append(pct)
    sc("down", timeout=180)
    return raw


def render(raw: dict, hosts, when: str, reps: int) -> str:
    med = {e: {k: statistics.median(v) for k, v in figs.items()} for e, figs in raw.items()}
    ratio = [m / r for m, r in zip(raw["mp"]["up_wall_s"], raw["ray"]["up_wall_s"])]
    out = [
        f"Executor comparison (issue 28), {when}: the testbed, real vLLM 0.32 CPU build, tiny Llama, TP=2 "
        f"across both hosts; median of {reps} repetition(s) (min-max)",
        "",
        "| figure | ray (`testbed`) | mp (`testbed-mp`) | unit |",
        "|---|---:|---:|---|",
        f"| up from down: wall time | {med['ray']['up_wall_s']:.1f} | {med['mp']['up_wall_s']:.1f} | s |",
    ]
    for h in hosts:
        out.append(
            f"| memory of {h}'s containers, serving idle (PSS) | {med['ray'][f'pss_gib_{h}']:.2f} | "
            f"{med['mp'][f'pss_gib_{h}']:.2f} | GiB |"
        )
    for h in hosts:
        out.append(
            f"| CPU of {h}'s containers, serving idle ({IDLE_WINDOW_S:.0f} s) | "
            f"{med['ray'][f'idle_cpu_pct_{h}']:.1f} | {med['mp'][f'idle_cpu_pct_{h}']:.1f} | % of a core |"
        )
    out += ["", f"up from down, mp / ray: {statistics.median(ratio):.3f} (min {min(ratio):.3f}, max {max(ratio):.3f})"]
    return "\n".join(out) + "\n"
