"""Supervisor figures for `make bench` (issue 19): time from a wedge to serving again, time from a
worker reboot to serving again, and the supervisor's own CPU and memory on the head while serving.

The wedge is rank 1's worker stopped with SIGSTOP (as in tests/integration/test_supervisor.py); a
reboot is the testbed's knob (the worker's dockerd and everything under it stopped and started).
"serving again" is the supervisor saying so and a completion answering, polled every 0.5 s.
"""

from __future__ import annotations

import json
import time

from tests.integration.helpers import answers

HEAD_C = "sparkcluster-testbed-head"
BASE = "http://198.18.0.2:8000"
CPU_WINDOW_S = 60.0
AGENT = "^python3 /opt/sparkcluster "  # the agent, not tini in front of it


def _state(tb) -> dict:
    res = tb.sh("spark-head", f"docker exec {HEAD_C} cat /run/sparkcluster/supervisor.json", check=False)
    return json.loads(res.stdout) if res.returncode == 0 and res.stdout.strip() else {}


def _answers(api_key: str) -> bool:
    return answers(BASE, "testbed-tiny", api_key=api_key)


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
