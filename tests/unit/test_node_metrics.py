"""The agent's `/metrics` (sparkcluster/node/metrics): the text format a real parser reads back (and
`promtool check metrics` accepts where it is installed), figures from captured /proc/meminfo, the
supervisor's state, verdicts and headroom, GPU series absent (never zero) without NVML, and the
endpoint itself answering both the memory report and the metrics."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sparkcluster.node import contract, memreport, metrics, supervisor
from sparkcluster.node.journal import Journal
from sparkcluster.node.verdict import Watch

CAPTURED = Path(__file__).parents[1] / "captured"
CFG = {"node": "spark-head", "role": "head", "ray_argv": ["ray"], "report_port": 8297, "peers": []}


def parsed(text: str) -> dict[str, list]:
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def values(text: str, name: str) -> dict[tuple, float]:
    out = {}
    for f in text_string_to_metric_families(text):
        for s in f.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_node_samples_from_captured_meminfo_render_and_parse_back():
    mem = (CAPTURED / "host-meminfo.txt").read_text()
    gpus = [{"gpu": "0", "power_w": 11.5, "sm_clock_mhz": 208, "temperature_c": 41}]
    fabric = {"busbw_gbps": 22.4, "floor_gbps": 15.0, "transport": "IB", "ts": 1.7e9}
    text = metrics.render(metrics.node_samples(CFG, mem, True, gpus, fabric, {"/data/hf": (10 * 2**30, 100 * 2**30)}))
    avail = next(int(x.split()[1]) for x in mem.splitlines() if x.startswith("MemAvailable:")) * 1024
    assert values(text, "sparkcluster_node_mem_available_bytes") == {(): avail}
    assert values(text, "sparkcluster_gpu_power_watts") == {(("gpu", "0"),): 11.5}
    assert values(text, "sparkcluster_fabric_transport_info") == {(("transport", "IB"),): 1}
    assert values(text, "sparkcluster_node_disk_avail_bytes") == {(("path", "/data/hf"),): 10 * 2**30}
    assert values(text, "sparkcluster_ray_alive") == {(): 1}


def test_gpu_and_fabric_series_are_absent_not_zero_where_unknown():
    text = metrics.render(metrics.node_samples(CFG, "MemAvailable: 1 kB\n", True, [], None, {}))
    assert "sparkcluster_gpu_" not in text and "sparkcluster_fabric_" not in text
    assert metrics.Nvml("libnvidia-ml-does-not-exist.so").readings() == []


def test_label_values_are_escaped():
    text = metrics.render([("sparkcluster_fabric_transport_info", {"transport": 'a"b\\c\nd'}, 1)])
    assert values(text, "sparkcluster_fabric_transport_info") == {(("transport", 'a"b\\c\nd'),): 1}


def test_supervisor_samples_state_verdicts_probe_stall_and_headroom(tmp_path, monkeypatch):
    monkeypatch.setattr(supervisor, "STATE_PATH", str(tmp_path / "state"))
    sup = supervisor.Supervisor(
        {**CFG, "peers": [{"name": "spark-worker", "ip": "198.19.2.2"}]}, Journal(str(tmp_path / "j"))
    )
    sup.set_state(contract.SERVING)
    sup.generation = "g1"
    sup.proc = type("P", (), {"pid": 1, "poll": lambda self: None})()
    sup.watch = Watch(started=0.0, ready=True, progressed_at=100.0)
    sup.last_look = 130.0
    sup.count("verdict:wedged")
    sup.count("restarts")
    sup.restarts = [time.time()]
    sup.last_probe_s, sup.last_probe_ok = 0.25, True
    sup.memory_seen = {"spark-head": 20 * 2**30, "spark-worker": None}
    text = metrics.render(metrics.supervisor_samples(sup, time.time()))
    state = values(text, "sparkcluster_supervisor_state")
    assert state[(("state", "serving"),)] == 1 and sum(state.values()) == 1 and len(state) == len(metrics.STATES)
    assert values(text, "sparkcluster_supervisor_verdicts_total")[(("kind", "wedged"),)] == 1
    assert values(text, "sparkcluster_supervisor_restarts_total") == {(): 1}
    assert values(text, "sparkcluster_supervisor_restarts") == {(): 1}
    assert values(text, "sparkcluster_engine_stalled_seconds") == {(): 30}
    floor = contract.Policy().memory_floor_gib * 2**30
    assert values(text, "sparkcluster_memory_headroom_bytes") == {(("peer", "spark-head"),): 20 * 2**30 - floor}
    assert values(text, "sparkcluster_memory_known") == {(("peer", "spark-head"),): 1, (("peer", "spark-worker"),): 0}
    assert values(text, "sparkcluster_probe_duration_seconds") == {(): 0.25}


def test_every_name_written_is_declared_and_promtool_accepts_the_text():
    sup = supervisor.Supervisor(CFG, Journal("/dev/null"))
    gpus = [{"gpu": "0", "power_w": 1.0, "sm_clock_mhz": 2, "temperature_c": 3}]
    fabric = {"busbw_gbps": 1.0, "floor_gbps": 1.0, "transport": "IB", "ts": 1.0}
    s = metrics.node_samples(CFG, "MemAvailable: 1 kB\nMemTotal: 2 kB\n", True, gpus, fabric, {"/": (1, 2)})
    s += metrics.supervisor_samples(sup, time.time()) + metrics.rank_samples({"rank": 1, "alive": True})
    s += metrics.processes(min_cpu_s=0.0)
    assert {n for n, _, _ in s} <= set(metrics.NAMES)
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian package prometheus)")
    p = subprocess.run(
        [promtool, "check", "metrics"], input=metrics.render(s), capture_output=True, text=True, check=False
    )
    assert p.returncode == 0, p.stdout + p.stderr


def test_the_agent_endpoint_answers_the_report_and_the_metrics():
    import socket

    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    memreport.serve_reports("127.0.0.1", port, lambda: {"mem_available": 5}, lambda: "sparkcluster_ray_alive 1\n")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as r:
        assert json.loads(r.read()) == {"mem_available": 5}
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert r.read() == b"sparkcluster_ray_alive 1\n"


def test_process_cpu_from_a_proc_tree_each_rank_by_pid_and_title(tmp_path):
    tick = __import__("os").sysconf("SC_CLK_TCK")

    def proc(pid: int, comm: str, utime: int, stime: int) -> None:
        d = tmp_path / str(pid)
        d.mkdir()
        # the layout of /proc/PID/stat (proc(5)): pid (comm) state ppid ... utime stime ...
        rest = ["S", "1", "1", "1", "0", "-1", "4194560", "0", "0", "0", "0", str(utime), str(stime), "0", "0"]
        (d / "stat").write_text(f"{pid} ({comm}) " + " ".join(rest) + "\n")

    proc(1, "tini", 0, 1)
    proc(40, "VLLM::Worker_TP1", 30 * tick, 10 * tick)
    proc(41, "ray::Ray (odd) )", 5 * tick, 0)
    proc(42, "python3", 9 * tick, 0)
    (tmp_path / "self").mkdir()
    got = {(lab["pid"], lab["process"]): v for _, lab, v in metrics.processes(str(tmp_path), skip=42)}
    assert got == {("40", "VLLM::Worker_TP1"): 40.0, ("41", "ray::Ray (odd) )"): 5.0}
