"""The testbed's per-host memory view (standin_bin/testbed-meminfo-view, issue 52): MemTotal as asked,
MemFree and MemAvailable shifted by the same amount, set_cma's lines put in, the rest kept."""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path

BIN = Path(__file__).resolve().parents[1] / "testbed" / "standin_bin" / "testbed-meminfo-view"
REAL = "MemTotal:       24000000 kB\nMemFree:         3000000 kB\nMemAvailable:   15000000 kB\nCmaTotal: 0 kB\n"


def _view():
    loader = importlib.machinery.SourceFileLoader("testbed_meminfo_view", str(BIN))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def _vals(text: str) -> dict[str, int]:
    return {ln.split(":")[0]: int(ln.split()[1]) for ln in text.splitlines()}


def test_the_view_reads_as_the_size_asked_with_live_values_shifted():
    got = _vals(_view().render(REAL, 62500000, {}))
    assert got == {"MemTotal": 62500000, "MemFree": 41500000, "MemAvailable": 53500000, "CmaTotal": 0}
    got = _vals(_view().render(REAL, 10000000, {"CmaTotal": "1024 kB", "CmaFree": "0 kB"}))
    assert got == {"MemTotal": 10000000, "MemFree": 0, "MemAvailable": 1000000, "CmaTotal": 1024, "CmaFree": 0}
