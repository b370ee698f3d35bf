"""Memory while serving: the proportional set size (PSS, shared pages counted once) of every process
in a docker container of each host (Ray, vLLM's API server, engine core and ranks), summed: what
serving costs the one machine the testbed's hosts share. The executor comparison reads it too.
"""

from __future__ import annotations

from perf.figures import Figure

TARGET_GIB = 6

PSS_OF_CONTAINERS = (
    't=0; for p in /proc/[0-9]*; do grep -qs docker "$p/cgroup" || continue; '
    "k=$(awk '/^Pss:/{print $2}' \"$p/smaps_rollup\" 2>/dev/null); t=$((t + ${k:-0})); done; echo $t"
)


def containers_pss_bytes(tb, host: str) -> int:
    return int(tb.sh(host, PSS_OF_CONTAINERS).stdout.strip() or 0) * 1024


def measure_serving(s) -> None:
    s.rec("serving_pss_gib", sum(containers_pss_bytes(s.tb, h) for h in s.hosts) / 2**30)


def figures(R: dict) -> list[Figure]:
    return [
        Figure(
            "serving_pss",
            "memory of both hosts' containers while serving (PSS)",
            "GiB",
            f"<= {TARGET_GIB}",
            R["serving_pss_gib"],
            all(x <= TARGET_GIB for x in R["serving_pss_gib"]),
        )
    ]
