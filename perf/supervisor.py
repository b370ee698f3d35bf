"""Supervisor figures for `make bench` (issue 19): time from a wedge to serving again, time from a
worker reboot to serving again, and the supervisor's own CPU and memory on the head while serving.

The wedge is rank 1's worker stopped with SIGSTOP (as in tests/integration/test_supervisor.py); a
reboot is the testbed's knob (the worker's dockerd and everything under it stopped and started).
"serving again" is the supervisor saying so and a completion answering, polled every 0.5 s.
Once each whatever BENCH_REPS: the testbed profile allows two restarts an hour.
"""

from __future__ import annotations

import json
import time

from perf import testbed
from perf.figures import Figure, info, say

HEAD_C = "sparkcluster-testbed-head"
BASE = f"http://{testbed.lan_ip('spark-head')}:8000"
CPU_WINDOW_S = 60.0
AGENT = "^python3 /opt/sparkcluster "  # the agent, not tini in front of it


def _state(tb) -> dict:
    res = tb.sh("spark-head", f"docker exec {HEAD_C} cat /run/sparkcluster/supervisor.json", check=False)
    return json.loads(res.stdout) if res.returncode == 0 and res.stdout.strip() else {}


def _answers(api_key: str) -> bool:
    return testbed.answers(BASE, "testbed-tiny", api_key=api_key)


def _serving_again(tb, since: float, api_key: str, timeout: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        st = _state(tb)
        if st.get("state") == "serving" and st.get("since", 0) > since and _answers(api_key):
            return time.monotonic() - t0
        time.sleep(0.5)
    raise SystemExit(f"bench: not serving again within {timeout:.0f}s; supervisor: {_state(tb)}")


def wedge_to_serving(tb, api_key: str) -> float:
    pids = tb.sh("spark-worker", "pgrep -f RayWorkerProc || true").stdout.split()
    if not pids:
        raise SystemExit("bench: no rank-1 worker process on spark-worker")
    t = time.time()
    try:
        tb.sh("spark-worker", "kill -STOP " + " ".join(pids))
        return _serving_again(tb, t, api_key, 300)
    finally:
        tb.sh("spark-worker", "kill -CONT " + " ".join(pids) + " 2>/dev/null || true", check=False)


def worker_reboot_to_serving(tb, api_key: str) -> float:
    t, t0 = time.time(), time.monotonic()
    tb.reboot("spark-worker")
    _serving_again(tb, t, api_key, 600)
    return time.monotonic() - t0


def agent_cost(tb) -> tuple[float, float]:
    """(percent of one core over CPU_WINDOW_S, RSS in MB) of the head's agent while serving idle."""
    pid = tb.sh("spark-head", f"pgrep -f '{AGENT}' | head -1").stdout.strip()
    hz = int(tb.sh("spark-head", "getconf CLK_TCK").stdout.strip() or 100)

    def ticks() -> int:
        fields = tb.sh("spark-head", f"cat /proc/{pid}/stat").stdout.rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)

    a, t0 = ticks(), time.monotonic()
    time.sleep(CPU_WINDOW_S)
    b, t1 = ticks(), time.monotonic()
    rss_kb = int(tb.sh("spark-head", f"awk '/^VmRSS/ {{print $2}}' /proc/{pid}/status").stdout.strip())
    return 100.0 * (b - a) / hz / (t1 - t0), rss_kb / 1024


def measure(s) -> None:
    """On the serving cluster of session `s`: the agent's cost, then a wedge, then a worker reboot."""
    cpu, rss = agent_cost(s.tb)
    s.rec("agent_cpu_pct", cpu)
    s.rec("agent_rss_mb", rss)
    s.rec("wedge_to_serving_s", wedge_to_serving(s.tb, testbed.API_KEY))
    s.rec("reboot_to_serving_s", worker_reboot_to_serving(s.tb, testbed.API_KEY))
    say(
        f"  agent {cpu:.2f}% of a core, {rss:.0f} MB; wedge to serving {s.last('wedge_to_serving_s'):.0f}s, "
        f"worker reboot to serving {s.last('reboot_to_serving_s'):.0f}s"
    )


def figures(R: dict) -> list[Figure]:
    if not R.get("agent_cpu_pct"):
        return []
    return [
        Figure(
            "agent_cpu",
            "supervisor on the head, serving idle: CPU",
            "% of a core",
            "< 1",
            R["agent_cpu_pct"],
            max(R["agent_cpu_pct"]) < 1,
        ),
        Figure(
            "agent_rss",
            "supervisor on the head: memory (RSS)",
            "MB",
            "< 100",
            R["agent_rss_mb"],
            max(R["agent_rss_mb"]) < 100,
        ),
        info(
            "wedge_to_serving",
            "rank 1 stopped (SIGSTOP) to serving again, no controller",
            "s",
            R["wedge_to_serving_s"],
        ),
        info("reboot_to_serving", "worker reboot to serving again, no controller", "s", R["reboot_to_serving_s"]),
    ]
