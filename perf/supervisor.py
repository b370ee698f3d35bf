"""Supervisor figures for `make bench` (issue 19): the supervisor's own CPU and memory on the head
while serving; then (perf/recovery.py, issue 40 item 4) a wedge and a worker reboot to serving
again, each against the parts that are not ours.
"""

from __future__ import annotations

import time

from perf import recovery
from perf.figures import Figure, say

CPU_WINDOW_S = 60.0
AGENT = "^python3 /opt/sparkcluster "  # the agent, not tini in front of it


def agent_pid(tb, host: str) -> str:
    pid = tb.sh(host, f"pgrep -f '{AGENT}' | head -1").stdout.strip()
    if not pid:
        raise SystemExit(f"bench: no sparkcluster agent on {host}")
    return pid


def cpu_ticks(tb, host: str, pids: list[str]) -> int:
    """utime + stime of the processes `pids` on `host` (fields 14 and 15 of /proc/PID/stat), in ticks."""
    out = tb.sh(host, " ".join(f"cat /proc/{int(p)}/stat;" for p in pids)).stdout
    fields = [line.rsplit(")", 1)[1].split() for line in out.splitlines() if ")" in line]
    return sum(int(f[11]) + int(f[12]) for f in fields)


def rss_kb(tb, host: str, pids: list[str]) -> int:
    """The resident set of the processes `pids` on `host` (VmRSS), in kB."""
    out = tb.sh(host, " ".join(f"awk '/^VmRSS/ {{print $2}}' /proc/{int(p)}/status;" for p in pids)).stdout
    return sum(int(x) for x in out.split())


def clock_ticks(tb, host: str) -> int:
    return int(tb.sh(host, "getconf CLK_TCK").stdout.strip() or 100)


def agent_cost(tb) -> tuple[float, float]:
    """(percent of one core over CPU_WINDOW_S, RSS in MB) of the head's agent while serving idle."""
    pid, hz = [agent_pid(tb, "spark-head")], clock_ticks(tb, "spark-head")
    a, t0 = cpu_ticks(tb, "spark-head", pid), time.monotonic()
    time.sleep(CPU_WINDOW_S)
    b, t1 = cpu_ticks(tb, "spark-head", pid), time.monotonic()
    return 100.0 * (b - a) / hz / (t1 - t0), rss_kb(tb, "spark-head", pid) / 1024


def measure(s) -> None:
    """On the serving cluster of session `s`: the agent's cost, then a wedge and a worker reboot to
    serving again, against the parts not ours (perf/recovery.py)."""
    cpu, rss = agent_cost(s.tb)
    s.rec("agent_cpu_pct", cpu)
    s.rec("agent_rss_mb", rss)
    say(f"  agent {cpu:.2f}% of a core, {rss:.0f} MB")
    recovery.measure(s)


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
    ]
