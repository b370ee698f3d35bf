"""perf/ (the `make bench` harness) without a testbed: every module imports, only perf/testbed.py
reaches into `tests`, and the tables are written right from made-up repetitions (the figures
themselves are measured by `make bench`, never here)."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import perf
from perf import executors, figures, floors, run

PERF = Path(perf.__file__).resolve().parent
MODULES = sorted(m.name for m in pkgutil.iter_modules([str(PERF)]))
HOSTS = ("spark-head", "spark-worker")


@pytest.mark.parametrize("name", MODULES)
def test_every_perf_module_imports(name):
    importlib.import_module(f"perf.{name}")


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_only_perf_testbed_reaches_the_testbed():
    reaching = {p.name for p in PERF.glob("*.py") if any(m.split(".")[0] == "tests" for m in _imports(p))}
    assert reaching == {"testbed.py"}
    assert "testbed" in MODULES and {"run", "nodes", "doctor", "up", "image", "status", "floors"} <= set(MODULES)


def _raw(reps: int = 3, with_floors: bool = True) -> dict:
    """Made-up repetitions with every key perf.run.figures reads."""

    def each(*xs):
        return [xs[i % len(xs)] for i in range(reps)]

    conns = each({h: 1 for h in HOSTS})
    raw = {
        "fanout_ratio": each(1.1, 1.2, 1.3),
        "doctor_cli_wall": each(0.8, 0.9),
        "conns_doctor": conns,
        "conns_up_serving": conns,
        "conns_up_down": conns,
        "conns_status": conns,
        "up_down_ratio": each(1.04, 1.05),
        "up_down_wall": each(39.0, 40.0),
        "up_down_cp": each(37.5),
        "up_serving_wall": each(1.3),
        "up_serving_unchanged": each(1.0),
        "serving_pss_gib": each(5.0),
        "xfer_sc_lan_bytes": each(45_000),
        "xfer_sc_link_bytes": each(2_946_000_000),
        "delta_ratio": each(1.001),
        "delta_link_bytes": each(274_167_978),
        "delta_lacking_bytes": each(273_775_104),
        "delta_stage_s": each(24.8),
        "delta_load_s": each(4.1),
        "delta_vs_load": each(6.05, 1.3, 1.4),
        "xfer_ratio": each(1.08),
        "xfer_sc_s": each(38.8),
        "xfer_base_s": each(42.8),
        "xfer_sc_link_s": each(10.2),
        "xfer_base_link_s": each(14.5),
        "image_same_s": each(0.0),
        "image_same_link_bytes": each(0),
        "agent_cpu_pct": [0.4],
        "agent_rss_mb": [22.1],
        "wedge_to_serving_s": [63.8],
        "reboot_to_serving_s": [43.2],
        "status_wall": each(0.76),
        "status_inprocess": each(0.54),
    }
    if with_floors:
        raw |= {"doctor_floor_ratio": each(1.2), "status_floor_ratio": each(1.6), "up_serving_floor_ratio": each(1.4)}
    return raw


def _rows(table: str) -> dict[str, list[str]]:
    rows = {}
    for line in table.splitlines():
        if line.startswith("| ") and not line.startswith("| figure") and not line.startswith("| part"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[cells[0]] = cells[1:]
    return rows


def test_results_table_from_made_up_figures():
    figs = run.figures(_raw(), 2_881_727_000)
    keys = [f.key for f in figs]
    assert len(keys) == len(set(keys))
    assert keys[0] == "doctor_fanout" and keys[-1] == "status_inprocess"
    table = figures.render(figs, {}, "2026-11-25 10:00 UTC", reps=3, cpus=2)
    assert table.startswith("sparkcluster bench, 2026-11-25 10:00 UTC (testbed, 2 CPUs; median of 3 repetitions")
    rows = _rows(table)
    assert len(rows) == len(figs)
    assert rows["doctor fan-out: both nodes / slower node alone (in-process)"] == [
        "1.200",
        "1.100",
        "1.300",
        "ratio",
        "<= 1.25",
        "yes",
    ]
    status_ratio = next(t for t in rows if t.startswith("... status / (start-up"))
    assert rows[status_ratio][4:] == ["<= 1.50", "**no**"]  # 1.6 > 1.5
    up_ratio = next(t for t in rows if t.startswith("... up / (start-up"))
    assert rows[up_ratio][4:] == ["<= 1.50", "yes"]
    # short commands' wall times are shown, judged only as ratios (issue 40 item 6)
    assert rows["status --json on a serving cluster: wall time"][4:] == ["-", "-"]
    assert rows["up on a cluster already serving: wall time"][4:] == ["-", "-"]
    assert rows["image transfer: bytes on the head-worker control link"][0] == "2,946,000,000"
    assert rows["SSH connections to spark-worker: up from down"] == ["1", "1", "1", "count", "1", "yes"]
    # issue 40 item 7: the image stage for a delta against docker load alone of the same bytes
    assert rows["image transfer, base on both: image stage / docker load of the same bytes alone"] == [
        "1.400",
        "1.300",
        "6.050",
        "ratio",
        "<= 1.50",
        "yes",
    ]


def test_results_json_from_before_the_floors_still_renders():
    figs = run.figures(_raw(with_floors=False), 2_881_727_000)
    assert not [f for f in figs if "floor" in f.key]


def test_breakdown_rendered_under_the_table():
    details = {
        "up_down_breakdown": {
            "critical_path": {"server: exec -> answers a completion": 26.2},
            "overhead": {"exit": 0.03},
        }
    }
    table = figures.render([figures.info("x", "x", "s", [1.0])], details, "now", reps=1, cpus=2)
    assert "| critical path: server: exec -> answers a completion | 26.20 |" in table
    assert "| overhead: exit | 0.03 |" in table


def test_executors_table():
    raw = {
        e: {"up_wall_s": [w, w + 1], **{f"pss_gib_{h}": [2.5, 2.5] for h in HOSTS}}
        | {f"idle_cpu_pct_{h}": [3.0, 4.0] for h in HOSTS}
        for e, w in (("ray", 40.0), ("mp", 36.0))
    }
    table = executors.render(raw, HOSTS, "now", 2)
    assert "| up from down: wall time | 40.5 | 36.5 | s |" in table
    assert table.rstrip().endswith("up from down, mp / ray: 0.901 (min 0.900, max 0.902)")


IMPORTTIME = """\
import time: self [us] | cumulative | imported package
import time:       120 |        120 |   _io
import time:       300 |        900 |     paramiko.util
import time:       400 |       1300 |   paramiko
import time:        50 |         50 | sparkcluster.__main__
import time:       200 |       1500 | sparkcluster.cli.main
import time:        10 |         10 |   paramiko
warning: not an importtime line
"""


def test_imported_modules_from_importtime():
    assert floors.imported_modules(IMPORTTIME) == ["_io", "paramiko.util", "paramiko", "sparkcluster.cli.main"]


def test_floors_add_start_up_and_the_slowest_host():
    startup = {"doctor": 0.3, "status": 0.25, "up_serving": 0.35}
    hosts = {
        "spark-head": {"connect": 0.10, "round_trip": 0.01, "facts": 0.20},
        "spark-worker": {"connect": 0.12, "round_trip": 0.02, "facts": 0.15},
    }
    fl = floors.floors(startup, hosts)
    assert fl == pytest.approx({"doctor": 0.3 + 0.30, "status": 0.25 + 0.14, "up_serving": 0.35 + 0.30})
    assert set(fl) == set(floors.COMMANDS)


def test_run_arguments():
    assert run.parse_args([]).render is False
    assert run.parse_args(["--render"]).render is True
    assert run.parse_args(["--executors"]).executors is True
    with pytest.raises(SystemExit):
        run.parse_args(["--render", "--executors"])
    with pytest.raises(SystemExit):
        run.parse_args(["--bogus"])


def test_floors_measure_records_each_command_against_its_floor(monkeypatch):
    """floors.measure on a made-up session: the imports are learnt once per command (under
    -X importtime), then each repetition records the floors and wall / floor."""
    from types import SimpleNamespace

    learnt = []

    def sc(*args, check=True, python_flags=()):
        assert python_flags == ("-X", "importtime") and not check
        learnt.append(args)
        return SimpleNamespace(stderr=IMPORTTIME)

    sc.env = {}
    raw: dict = {}
    s = SimpleNamespace(sc=sc, inv=None, prof=None, floor_imports={}, details={}, raw=raw)
    s.rec = lambda k, v: raw.setdefault(k, []).append(v)
    monkeypatch.setattr(floors, "startup_s", lambda modules, env: 0.25)
    monkeypatch.setattr(
        floors, "per_host", lambda inv, prof: {"spark-head": {"connect": 0.1, "round_trip": 0.05, "facts": 0.25}}
    )
    for _ in range(2):
        ratios = floors.measure(s, {"doctor": 0.9, "status": 0.8, "up_serving": 1.2})
    assert learnt == list(floors.COMMANDS.values())  # once each, not per repetition
    assert ratios == pytest.approx({"doctor": 0.9 / 0.6, "status": 0.8 / 0.4, "up_serving": 1.2 / 0.6})
    assert raw["status_floor_ratio"] == pytest.approx([2.0, 2.0])
    assert s.details["floor_modules_imported"] == {k: 4 for k in floors.COMMANDS}
