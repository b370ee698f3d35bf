"""A figure of `make bench` and the table they make: every family module (doctor, up, image, ...)
turns its raw repetitions into `Figure`s, and `render` writes perf/results.md from them.

Kept apart from the measuring so that the table can be written again from results.json with no
testbed (`python -m perf.run --render`) and checked by unit tests on made-up figures.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from dataclasses import dataclass


def say(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def die(msg: str) -> None:
    print(f"bench: {msg}", file=sys.stderr)
    sys.exit(2)


@dataclass
class Figure:
    key: str
    title: str
    unit: str
    target: str  # human text
    values: list[float]
    ok: bool | None  # None: informational
    note: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    def as_dict(self) -> dict:
        return {
            "key": self.key,
            "title": self.title,
            "unit": self.unit,
            "target": self.target,
            "median": self.median,
            "min": min(self.values),
            "max": max(self.values),
            "n": len(self.values),
            "values": self.values,
            "met": self.ok,
            "note": self.note,
        }


def info(key: str, title: str, unit: str, values: list[float]) -> Figure:
    """A figure shown for understanding, with no target."""
    return Figure(key, title, unit, "-", values, None)


def at_most_median(key: str, title: str, bound: float, values: list[float], note: str = "") -> Figure:
    """A ratio judged on its median: `<= bound`."""
    return Figure(key, title, "ratio", f"<= {bound:.2f}", values, statistics.median(values) <= bound, note=note)


def at_least_median(key: str, title: str, bound: float, values: list[float], note: str = "") -> Figure:
    """A ratio judged on its median: `>= bound`."""
    return Figure(key, title, "ratio", f">= {bound:.2f}", values, statistics.median(values) >= bound, note=note)


def fmt(x: float, unit: str) -> str:
    if unit == "bytes":
        return f"{x:,.0f}"
    if unit == "MB/s":
        return f"{x:.1f}"
    if unit == "count":
        return f"{x:g}"
    if unit in ("s",):
        return f"{x:.2f}"
    return f"{x:.3f}"


def median_dicts(rows: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


def render(figures: list[Figure], details: dict, when: str, reps: int, cpus: int | None = None) -> str:
    """perf/results.md: one row per figure, then where `up` from down spends its time."""
    out = [
        f"sparkcluster bench, {when} (testbed, {cpus or os.cpu_count()} CPUs; median of {reps} repetitions, min-max)",
        "",
        "| figure | median | min | max | unit | target | met |",
        "|---|---:|---:|---:|---|---|---|",
    ]
    for f in figures:
        met = "-" if f.ok is None else ("yes" if f.ok else "**no**")
        out.append(
            f"| {f.title} | {fmt(f.median, f.unit)} | {fmt(min(f.values), f.unit)} | {fmt(max(f.values), f.unit)} "
            f"| {f.unit} | {f.target} | {met} |"
        )
    if "up_down_breakdown" in details:
        b = details["up_down_breakdown"]
        out += [
            "",
            "Where `up` from down spends its time (medians, seconds; the critical path's segments are",
            "from the hosts' own timestamps, the rest is sparkcluster's overhead):",
            "",
            "| part | s |",
            "|---|---:|",
        ]
        for k, v in b["critical_path"].items():
            out.append(f"| critical path: {k} | {v:.2f} |")
        for k, v in b["overhead"].items():
            out.append(f"| overhead: {k} | {v:.2f} |")
    return "\n".join(out) + "\n"
