"""`doctor`'s figures: the fan-out (the doctor's work on every node at once against the slowest node
alone, in-process), the CLI's wall time, and that wall time as a ratio to what `doctor` cannot avoid
(perf/floors.py). `perf.nodes` takes the same fan-out on four hosts.

Why in-process for the fan-out: the inventory needs distinct SSH targets, so "one node alone" is the
same work on one node's own connection: connect, the facts script, the path-MTU pings, close.
"""

from __future__ import annotations

import time

from perf.figures import Figure, at_most_median, info

FANOUT_TARGET = 1.25
RATIO_TARGET = 1.5


def fanout(inv, prof, i: int = 0) -> tuple[float, dict[str, float]]:
    """(all nodes through preflight.run, {node: that node alone}), in seconds. Repetition i
    alternates the order: even, all nodes first then each in inventory order; odd, each in reverse
    order then all nodes. A first, unmeasured preflight gives the facts the path-MTU probes need."""
    from sparkcluster import facts
    from sparkcluster.checks import preflight
    from sparkcluster.remote.fanout import connect_all

    expect = preflight.expectations(inv, prof)

    def every() -> tuple[float, dict]:
        t = time.time()
        rep, cluster = preflight.run(inv, prof)
        if cluster:
            cluster.close()
        return time.time() - t, rep.facts

    def alone(node, ref) -> float:
        t = time.time()
        h = connect_all(inv, [node]).values_or_raise("connect")[node.name]
        try:
            facts.gather(h, inv, expect.image)
            facts.gather_path_mtu(h, facts.path_mtu_probes(node, ref))
        finally:
            h.close()
        return time.time() - t

    _, ref = every()  # the facts the path-MTU probes need, and a warm start
    single: dict[str, float] = {}
    order = list(inv.nodes) if i % 2 == 0 else list(reversed(inv.nodes))
    if i % 2 == 0:
        t_all, _ = every()
    for node in order:
        single[node.name] = alone(node, ref)
    if i % 2 == 1:
        t_all, _ = every()
    return t_all, single


def measure_fanout(s, i: int) -> tuple[float, dict[str, float]]:
    t_all, single = fanout(s.inv, s.prof, i)
    s.rec("fanout_both", t_all)
    s.rec("fanout_single", single)
    s.rec("fanout_ratio", t_all / max(single.values()))
    return t_all, single


def measure_cli(s) -> None:
    """One `doctor` on the serving cluster: its wall time and the SSH connections it made."""
    r = s.sc("doctor", check=False)
    if r.rc not in (0, 1):
        raise SystemExit(f"bench: doctor exited {r.rc}\n{r.stderr}")
    s.rec("doctor_cli_wall", r.wall)
    s.rec("conns_doctor", r.conns)


def figures(R: dict) -> list[Figure]:
    F = [
        at_most_median(
            "doctor_fanout",
            "doctor fan-out: both nodes / slower node alone (in-process)",
            FANOUT_TARGET,
            R["fanout_ratio"],
        ),
        info("doctor_cli_wall", "doctor wall time, CLI, both nodes", "s", R["doctor_cli_wall"]),
    ]
    if R.get("doctor_floor_ratio"):
        F.append(
            at_most_median(
                "doctor_floor_ratio",
                "  ... doctor / (start-up with its imports + connect and facts script on the slowest host)",
                RATIO_TARGET,
                R["doctor_floor_ratio"],
            )
        )
    return F
