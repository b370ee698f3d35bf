"""The testbed's nvidia-smi stand-in reads power as a GPU does: following the work. The testbed's "GPU
work" is the CPU engine's compute, so power.draw is the CPU time the processes the stand-in sees used
since its previous reading, between a GB10's idle and busy figures (sources in the stand-in), unless
the testbed pins it (Testbed.set_gpu_power). An engine at work must read above the supervisor's "busy
but low power" bound, or that signal would stand on every load the testbed serves."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from sparkcluster.node import metrics
from sparkcluster.node.energy import LOW_POWER_W

SMI = Path(__file__).resolve().parents[1] / "testbed" / "standin_bin" / "nvidia-smi"


@pytest.fixture
def smi(tmp_path, monkeypatch):
    loader = importlib.machinery.SourceFileLoader("testbed_nvidia_smi", str(SMI))
    spec = importlib.util.spec_from_loader("testbed_nvidia_smi", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    monkeypatch.setattr(mod, "STATE", str(tmp_path / "state"))  # no pinned power, no driver file
    monkeypatch.setattr(mod, "LAST", str(tmp_path / "last"))
    return mod


def stat(proc: Path, pid: int, name: str, utime: int, stime: int) -> None:
    """/proc/<pid>/stat as proc(5) lays it out: utime and stime are fields 14 and 15, in clock ticks."""
    (proc / str(pid)).mkdir(parents=True, exist_ok=True)
    fields = ["S", "1", "1", "1", "0", "-1", "4194560", "10", "0", "0", "0", str(utime), str(stime), "7", "3"]
    (proc / str(pid) / "stat").write_text(f"{pid} ({name}) {' '.join(fields)} 20 0 1 0 55 0 0\n")


def test_power_runs_from_the_idle_figure_to_the_busy_one_with_the_work(smi):
    assert smi.watts(0.0, 2.0) == smi.IDLE_W
    assert smi.watts(smi.FULL_CPUS * 2.0, 2.0) == smi.BUSY_W
    assert smi.watts(5.0, 2.0) == smi.BUSY_W  # more than the full scale: the busy figure
    half = smi.watts(smi.FULL_CPUS, 2.0)
    assert half == round((smi.IDLE_W + smi.BUSY_W) / 2, 2)
    assert smi.watts(1.0, 0.0) == smi.IDLE_W  # no time passed: no work to show
    # what the scale must satisfy: an engine at work reads above the "busy but low power" bound, from
    # a tenth of a core on (a crowded testbed's rank gets more), and a GPU at rest reads below it
    assert smi.IDLE_W < LOW_POWER_W < smi.BUSY_W
    assert smi.watts(0.1, 1.0) > LOW_POWER_W
    assert smi.watts(0.02, 1.0) < LOW_POWER_W


def test_cpu_times_read_each_process_stat_and_leave_out_the_reading_itself(smi, tmp_path):
    proc = tmp_path / "proc"
    tick = os.sysconf("SC_CLK_TCK")
    stat(proc, 7, "ray::RayWorkerWrapper.execute_method", 3 * tick, tick)
    stat(proc, 8, "VLLM::Worker TP0 (x)", tick, 0)  # a name with spaces and a parenthesis
    stat(proc, os.getpid(), "nvidia-smi", 50 * tick, 0)
    (proc / "self").mkdir()
    (proc / "9").mkdir()  # gone between the listing and the read
    assert smi.cpu_times(str(proc)) == {"7": 4.0, "8": 1.0}


def test_work_is_each_process_rise_and_all_of_a_new_one(smi):
    before = {"7": 4.0, "8": 1.0, "9": 2.0}
    now = {"7": 4.5, "8": 1.0, "10": 0.25, "11": 0.0}  # 9 gone, 10 new; a pid reused reads lower: none
    assert smi.work(before, now) == 0.75
    assert smi.work(before, {"7": 3.0}) == 0.0


def test_power_draw_pinned_unmeasured_then_since_the_previous_reading(smi, tmp_path):
    clock = SimpleNamespace(now=100.0)
    used = {"7": 1.0}
    slept = []

    def sleep(s):
        slept.append(s)
        clock.now += s
        used["7"] += s * smi.FULL_CPUS  # a quarter of a core while the stand-in waits

    def read(proc="/proc"):
        return dict(used)

    smi.cpu_times = read
    kw = {"clock": lambda: clock.now, "sleep": sleep}
    assert smi.power_draw(12.5, **kw) == 12.5 and slept == []  # pinned: nothing measured
    assert not (tmp_path / "last").exists()
    assert smi.power_draw(**kw) == smi.BUSY_W and slept == [smi.SAMPLE_S]  # no previous reading: a fresh window
    clock.now += 2.0  # two seconds of rest
    assert smi.power_draw(**kw) == smi.IDLE_W and slept == [smi.SAMPLE_S]
    clock.now += 2.0
    used["7"] += 0.1  # a twentieth of a core over two seconds
    assert smi.power_draw(**kw) == smi.watts(0.1, 2.0) and len(slept) == 1
    clock.now += smi.WINDOW_MAX_S + 1  # too long ago to say what the GPU does now: a fresh window
    used["7"] += 100.0
    assert smi.power_draw(**kw) == smi.BUSY_W and len(slept) == 2


def test_the_query_gives_the_reading_as_sparkclusters_reader_parses_it(smi, tmp_path, capsys):
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "power_draw_w").write_text("7.5\n")
    assert smi.main(["--query-gpu=index,power.draw,clocks.sm,temperature.gpu", "--format=csv,noheader,nounits"]) == 0
    out = capsys.readouterr().out
    assert metrics.smi_readings(out) == [{"gpu": "0", "power_w": 7.5, "sm_clock_mhz": 208.0, "temperature_c": 41.0}]
    assert smi.main([]) == 0 and "  8W /  N/A  |" in capsys.readouterr().out  # the table rounds it


def test_a_process_burning_cpu_shows_as_work_in_the_real_proc(smi):
    """A child that uses a third of a CPU-second (measured by its own clock) is that much work."""
    burn = "import sys, time\nt = time.process_time()\nwhile time.process_time() - t < 0.34: pass\nprint(1, flush=True)\nsys.stdin.read()\n"
    before = smi.cpu_times()
    child = subprocess.Popen([sys.executable, "-c", burn], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "1"
        assert smi.work(before, smi.cpu_times()) >= 0.33
    finally:
        child.stdin.close()
        child.wait(10)
