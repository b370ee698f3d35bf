"""The node's own metrics in Prometheus' text format, at `/metrics` of the agent's report endpoint
(the node's control IP, `cluster.agent_port`): what only sparkcluster knows about a node and its
engine (the supervisor's state, restarts and verdicts, probe latency, the engine's stall clock, each
rank of an `mp` set, MemAvailable and the headroom above the profile's floor, NVML's power, clock
and temperature where NVML answers, the ConnectX-7's and NVMe drives' temperatures and thresholds
where their drivers expose them (node/hwmon), the last fabric test's bus bandwidth and transport). vLLM's own
series stay at the engine's `/metrics`; host counters (RDMA ports, filesystems) come from
node_exporter. `sparkcluster monitor up` points Prometheus at all three.

Why the standard library rather than prometheus-client: this package runs in the image's Python,
standard library only (agent.py), and what is exported here is a few dozen gauges computed from
what the agent and supervisor already hold: the text format's few rules (HELP, TYPE, escaped label
values) fit in `render`. Every figure is read when Prometheus asks, not on a timer: between scrapes
nothing runs. NVML is asked through ctypes, once loaded; where libnvidia-ml is absent (the testbed)
the GPU series are absent, never zero.

Names and units follow Prometheus' conventions (`_bytes`, `_seconds`, `_total` for counters); every
name begins with `sparkcluster_` (tests/unit/test_monitor_dashboards checks the dashboards' queries
against this list, NAMES)."""

from __future__ import annotations

import ctypes
import math
import os
import shutil
import subprocess
import threading
import time

from . import aer
from .contract import FABRIC_PATH, State
from .journal import read_json
from .readings import meminfo

STATES = tuple(State)  # every state: one series each, 1 for the state the supervisor is in
VERDICT_KINDS = ("dead", "wedged", "not-ready", "memory")

# name -> (type, help): every series this module can write
NAMES: dict[str, tuple[str, str]] = {
    "sparkcluster_node_info": ("gauge", "This node's role and executor (value 1)."),
    "sparkcluster_node_mem_available_bytes": ("gauge", "MemAvailable of /proc/meminfo (unified memory: CPU and GPU)."),
    "sparkcluster_node_mem_total_bytes": ("gauge", "MemTotal of /proc/meminfo."),
    "sparkcluster_node_disk_avail_bytes": ("gauge", "Bytes free to the container's user where the path lives."),
    "sparkcluster_node_disk_size_bytes": ("gauge", "Size of the filesystem where the path lives."),
    "sparkcluster_ray_alive": ("gauge", "1 while this node's `ray start --block` runs (0 without Ray)."),
    "sparkcluster_gpu_power_watts": ("gauge", "GPU power draw from NVML."),
    "sparkcluster_gpu_sm_clock_mhz": ("gauge", "GPU SM clock from NVML."),
    "sparkcluster_gpu_temperature_celsius": ("gauge", "GPU temperature from NVML."),
    "sparkcluster_device_temperature_celsius": (
        "gauge",
        "A ConnectX-7 (kind cx7, mlx5 hwmon) or NVMe (kind nvme) sensor's temperature (node/hwmon).",
    ),
    "sparkcluster_device_temperature_max_celsius": (
        "gauge",
        "The sensor's warning threshold: the device's own (source device) or its vendor's figure (source vendor).",
    ),
    "sparkcluster_device_temperature_crit_celsius": (
        "gauge",
        "The sensor's critical threshold: the device's own (source device) or its vendor's figure (source vendor).",
    ),
    "sparkcluster_fabric_busbw_gbps": ("gauge", "The last fabric test's all_gather bus bandwidth at its largest size."),
    "sparkcluster_fabric_floor_gbps": ("gauge", "The bus bandwidth below which the fabric test fails."),
    "sparkcluster_fabric_transport_info": ("gauge", "The transport NCCL chose in the last fabric test (value 1)."),
    "sparkcluster_fabric_measured_timestamp_seconds": ("gauge", "When the last fabric test ran."),
    "sparkcluster_cx7_aer_errors_total": (
        "counter",
        "PCIe AER errors since boot on a ConnectX-7 PCI function or the port above it (sysfs aer_dev_*).",
    ),
    "sparkcluster_kernel_events_total": (
        "counter",
        "Kernel log events this agent read, by kind (xid, oom, mlx5, link, aer) and code (node/kernel_log).",
    ),
    "sparkcluster_kernel_log_readable": ("gauge", "1 while the agent reads the kernel's log (/dev/kmsg), else 0."),
    "sparkcluster_rank_alive": ("gauge", "Executor mp: 1 while this node's rank of the head's set runs."),
    "sparkcluster_process_cpu_seconds_total": (
        "counter",
        "CPU time of each process in this node's container (the ranks among them): a stopped rank's stands still.",
    ),
    "sparkcluster_supervisor_state": ("gauge", "1 for the supervisor's current state, 0 for the others."),
    "sparkcluster_supervisor_state_since_timestamp_seconds": ("gauge", "When the supervisor entered its state."),
    "sparkcluster_supervisor_restarts": ("gauge", "Restarts within the restart window."),
    "sparkcluster_supervisor_restart_limit": ("gauge", "Restarts allowed within the window (the profile's bound)."),
    "sparkcluster_supervisor_restarts_total": ("counter", "Restarts this supervisor made since its container started."),
    "sparkcluster_supervisor_verdicts_total": ("counter", "Verdicts the supervisor reached, by kind."),
    "sparkcluster_supervisor_desired": ("gauge", "1 while `up` asks for a server (0 after `down`)."),
    "sparkcluster_probe_duration_seconds": ("gauge", "How long the last one-token completion took."),
    "sparkcluster_probe_success": ("gauge", "1 when the last one-token completion returned in time."),
    "sparkcluster_probes_total": ("counter", "One-token completions sent, by outcome."),
    "sparkcluster_engine_stalled_seconds": (
        "gauge",
        "Seconds with work running or waiting and no progress series moving.",
    ),
    "sparkcluster_engine_stall_bound_seconds": ("gauge", "The profile's stall bound: a stall this long is a wedge."),
    "sparkcluster_engine_tokens_per_second": ("gauge", "Generated tokens per second over the supervisor's last look."),
    "sparkcluster_deployment_power_watts": (
        "gauge",
        "GPU power of every node of the deployment, summed (NVML; absent while any node's is unknown).",
    ),
    "sparkcluster_energy_joules_per_1k_tokens": (
        "gauge",
        "The deployment's GPU energy per 1,000 generated tokens over the supervisor's last look.",
    ),
    "sparkcluster_fabric_hold": (
        "gauge",
        "1 while the supervisor holds the deployment out of rotation for its fabric (engine left running).",
    ),
    "sparkcluster_engine_busy_low_power": (
        "gauge",
        "1 while requests run and every GPU of the deployment draws under the low-power bound (a wedge signal).",
    ),
    "sparkcluster_memory_floor_bytes": ("gauge", "The profile's memory floor: below it on any node the server stops."),
    "sparkcluster_memory_headroom_bytes": ("gauge", "MemAvailable above the floor, per node the head reads."),
    "sparkcluster_memory_known": (
        "gauge",
        "1 when the head reads the node's memory report, 0 when it does not answer.",
    ),
    "sparkcluster_peer_rank_alive": ("gauge", "Executor mp: 1 while the peer's rank of this epoch runs (head's view)."),
}


def _escape(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _value(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if v in (float("inf"), float("-inf")):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v)) if not float(v).is_integer() else str(int(v))


def render(samples: list[tuple[str, dict, float]]) -> str:
    """The text exposition format (version 0.0.4) of `samples`: (name, labels, value), grouped by
    name with one HELP and TYPE each, names in NAMES' order."""
    by: dict[str, list[tuple[dict, float]]] = {}
    for name, labels, value in samples:
        if value is None:
            continue
        by.setdefault(name, []).append((labels, float(value)))
    out = []
    for name in sorted(by, key=lambda n: list(NAMES).index(n)):
        kind, text = NAMES[name]
        out.append(f"# HELP {name} {text}")
        out.append(f"# TYPE {name} {kind}")
        for labels, value in by[name]:
            lab = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            out.append(f"{name}{{{lab}}} {_value(value)}" if lab else f"{name} {_value(value)}")
    return "\n".join(out) + "\n"


# ---- NVML through ctypes ---------------------------------------------------------------------


class Nvml:
    """Power, SM clock and temperature per GPU; [] when NVML is absent or fails (never zeros)."""

    CLOCK_SM, TEMPERATURE_GPU = 1, 0

    def __init__(self, libname: str = "libnvidia-ml.so.1"):
        self.lib = None
        try:
            lib = ctypes.CDLL(libname)
            if lib.nvmlInit_v2() == 0:
                self.lib = lib
        except (OSError, AttributeError):
            self.lib = None

    def readings(self) -> list[dict]:
        if self.lib is None:
            return []
        count = ctypes.c_uint(0)
        if self.lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            return []
        out = []
        for i in range(count.value):
            handle = ctypes.c_void_p()
            if self.lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle)) != 0:
                continue
            got: dict = {"gpu": str(i)}
            mw, mhz, temp = ctypes.c_uint(0), ctypes.c_uint(0), ctypes.c_uint(0)
            if self.lib.nvmlDeviceGetPowerUsage(handle, ctypes.byref(mw)) == 0:
                got["power_w"] = mw.value / 1000
            if self.lib.nvmlDeviceGetClockInfo(handle, self.CLOCK_SM, ctypes.byref(mhz)) == 0:
                got["sm_clock_mhz"] = mhz.value
            if self.lib.nvmlDeviceGetTemperature(handle, self.TEMPERATURE_GPU, ctypes.byref(temp)) == 0:
                got["temperature_c"] = temp.value
            out.append(got)
        return out


class NvidiaSmi:
    """The same readings through `nvidia-smi --query-gpu` where libnvidia-ml cannot be loaded in this
    process but the CLI is on PATH (issue 75): the NVIDIA container toolkit injects both into a
    container given GPUs, and the CLI answers from the same NVML, so a container whose Python cannot
    dlopen the library (an image's own library path) still reads its GPUs' power. One run costs tens
    of milliseconds: it is read at most every CACHE_S, whoever asks (the scrape, the head's look)."""

    CACHE_S = 1.5
    QUERY = "index,power.draw,clocks.sm,temperature.gpu"

    def __init__(self, argv0: str = "nvidia-smi"):
        self.argv0 = argv0
        self._at, self._last = float("-inf"), []
        self._lock = threading.Lock()

    def readings(self) -> list[dict]:
        with self._lock:
            if time.monotonic() - self._at >= self.CACHE_S:
                self._at, self._last = time.monotonic(), self._read()
            return list(self._last)

    def _read(self) -> list[dict]:
        try:
            p = subprocess.run(
                [self.argv0, f"--query-gpu={self.QUERY}", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=5,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            return []
        return smi_readings(p.stdout) if p.returncode == 0 else []


def smi_readings(text: str) -> list[dict]:
    """`nvidia-smi --query-gpu=index,power.draw,clocks.sm,temperature.gpu --format=csv,noheader,nounits`
    as Nvml.readings() gives them; a field nvidia-smi cannot read ("[N/A]") is left out (pure)."""
    out = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != 4 or not cells[0].isdigit():
            continue
        got: dict = {"gpu": cells[0]}
        for key, cell in zip(("power_w", "sm_clock_mhz", "temperature_c"), cells[1:]):
            try:
                got[key] = float(cell)
            except ValueError:
                continue
        out.append(got)
    return out


def gpu_reader():
    """NVML where it loads, else nvidia-smi where it is on PATH, else NVML's empty reader."""
    nvml = Nvml()
    if nvml.lib is None and shutil.which("nvidia-smi"):
        return NvidiaSmi()
    return nvml


# ---- the samples ------------------------------------------------------------------------------


def node_samples(
    cfg: dict,
    meminfo_text: str,
    ray_alive: bool,
    gpus: list[dict],
    fabric: dict | None,
    disks: dict,
    aer_counters: dict | None = None,
    kernel: dict | None = None,
    temperatures: list[dict] | None = None,
) -> list[tuple[str, dict, float]]:
    """What every node's agent exports about its node (pure: the readings are passed in)."""
    mem = meminfo(meminfo_text)
    s: list[tuple[str, dict, float]] = [
        ("sparkcluster_node_info", {"role": cfg.get("role", ""), "executor": cfg.get("executor", "ray")}, 1),
        ("sparkcluster_node_mem_available_bytes", {}, mem.get("MemAvailable")),
        ("sparkcluster_node_mem_total_bytes", {}, mem.get("MemTotal")),
        ("sparkcluster_ray_alive", {}, 1 if ray_alive and cfg.get("ray_argv") else 0),
    ]
    for path, (avail, size) in sorted(disks.items()):
        s += [
            ("sparkcluster_node_disk_avail_bytes", {"path": path}, avail),
            ("sparkcluster_node_disk_size_bytes", {"path": path}, size),
        ]
    for g in gpus:
        s += [
            ("sparkcluster_gpu_power_watts", {"gpu": g["gpu"]}, g.get("power_w")),
            ("sparkcluster_gpu_sm_clock_mhz", {"gpu": g["gpu"]}, g.get("sm_clock_mhz")),
            ("sparkcluster_gpu_temperature_celsius", {"gpu": g["gpu"]}, g.get("temperature_c")),
        ]
    s += temperature_samples(temperatures or [])
    if fabric:
        s += [
            ("sparkcluster_fabric_busbw_gbps", {}, fabric.get("busbw_gbps")),
            ("sparkcluster_fabric_floor_gbps", {}, fabric.get("floor_gbps")),
            ("sparkcluster_fabric_measured_timestamp_seconds", {}, fabric.get("ts")),
        ]
        if fabric.get("transport"):
            s.append(("sparkcluster_fabric_transport_info", {"transport": fabric["transport"]}, 1))
    for dev in (aer_counters or {}).values():  # node/aer.read(): absent where no device has the files
        labels = {"hca": dev.get("hca", ""), "pci": dev.get("pci", ""), "role": dev.get("role", "")}
        for severity in ("correctable", "fatal", "nonfatal"):
            if dev.get(severity) is not None:
                s.append(("sparkcluster_cx7_aer_errors_total", {**labels, "kind": severity}, dev[severity]))
    if kernel is not None:  # node/kernel_log.KernelWatch.report()
        s.append(("sparkcluster_kernel_log_readable", {}, 0 if kernel.get("error") else 1))
        for c in kernel.get("counts") or []:
            s.append(("sparkcluster_kernel_events_total", {"kind": c["kind"], "code": c["code"]}, c["count"]))
    return s


def temperature_samples(sensors: list[dict]) -> list[tuple[str, dict, float]]:
    """node/hwmon.sensors(): each temperature, and each threshold it has (absent where none: no alert)."""
    s = []
    for t in sensors:
        labels = {"device": t.get("device", ""), "sensor": t.get("sensor", ""), "kind": t.get("kind", "")}
        s.append(("sparkcluster_device_temperature_celsius", labels, t.get("celsius")))
        for key, name in (("max", "max"), ("crit", "crit")):
            if t.get(f"{key}_c") is not None:
                src = {"source": t.get(f"{key}_from") or "device"}
                s.append((f"sparkcluster_device_temperature_{name}_celsius", {**labels, **src}, t[f"{key}_c"]))
    return s


def rank_samples(report: dict) -> list[tuple[str, dict, float]]:
    """A worker's rank of an `mp` set (RankKeeper.report())."""
    return [("sparkcluster_rank_alive", {"rank": str(report.get("rank", ""))}, 1 if report.get("alive") else 0)]


def supervisor_samples(sup, now: float) -> list[tuple[str, dict, float]]:
    """What the head's supervisor knows: its state, bounds, verdicts, the last probe, the stall
    clock, each node's headroom above the floor. `sup` is a node.supervisor.Supervisor."""
    policy = sup.policy()
    floor = policy.memory_floor_gib * 2**30
    window = policy.restart_window_s
    s: list[tuple[str, dict, float]] = [
        ("sparkcluster_supervisor_state", {"state": st}, 1 if sup.state == st else 0) for st in STATES
    ]
    s += [
        ("sparkcluster_supervisor_state_since_timestamp_seconds", {}, sup.since),
        ("sparkcluster_supervisor_restarts", {}, len([t for t in sup.restarts if now - t < window])),
        ("sparkcluster_supervisor_restart_limit", {}, float(policy.max_restarts)),
        ("sparkcluster_supervisor_restarts_total", {}, sup.counts.get("restarts", 0)),
        ("sparkcluster_supervisor_desired", {}, 1 if sup.generation else 0),
        ("sparkcluster_engine_stall_bound_seconds", {}, policy.stall_s),
        ("sparkcluster_memory_floor_bytes", {}, floor),
    ]
    s += [
        ("sparkcluster_supervisor_verdicts_total", {"kind": k}, sup.counts.get(f"verdict:{k}", 0))
        for k in VERDICT_KINDS
    ]
    for outcome in ("ok", "failed"):
        s.append(("sparkcluster_probes_total", {"outcome": outcome}, sup.counts.get(f"probe:{outcome}", 0)))
    if sup.last_probe_s is not None:
        s += [
            ("sparkcluster_probe_duration_seconds", {}, sup.last_probe_s),
            ("sparkcluster_probe_success", {}, 1 if sup.last_probe_ok else 0),
        ]
    w = sup.watch if sup.proc is not None else None
    if w is not None and w.ready:
        s.append(("sparkcluster_engine_stalled_seconds", {}, max(0.0, (sup.last_look or now) - w.progressed_at)))
    if sup.proc is not None and sup.rate is not None:
        s.append(("sparkcluster_engine_tokens_per_second", {}, sup.rate))
    s.append(("sparkcluster_fabric_hold", {}, 1 if getattr(sup, "fabric_hold", None) else 0))
    energy = getattr(sup, "energy", None)  # node/energy.Energy: this start's power and energy per token
    if sup.proc is not None and energy is not None:
        s += [
            ("sparkcluster_deployment_power_watts", {}, energy.power_w),
            ("sparkcluster_energy_joules_per_1k_tokens", {}, energy.joules_per_1k),
            ("sparkcluster_engine_busy_low_power", {}, 1 if energy.low else 0),
        ]
    for peer, avail in sorted(sup.memory_seen.items()):
        known = avail is not None
        s.append(("sparkcluster_memory_known", {"peer": peer}, 1 if known else 0))
        if known:
            s.append(("sparkcluster_memory_headroom_bytes", {"peer": peer}, avail - floor))
    if sup.mp:
        for peer, rep in sorted(sup.reports.items()):
            rank = (rep or {}).get("rank") or {}
            if rep is not None:
                alive = 1 if rank.get("alive") and rank.get("epoch") == sup.epoch and sup.epoch else 0
                s.append(("sparkcluster_peer_rank_alive", {"peer": peer, "rank": str(rank.get("rank", ""))}, alive))
    return s


def processes(proc: str = "/proc", min_cpu_s: float = 1.0, skip: int | None = None) -> list[tuple[str, dict, float]]:
    """CPU seconds of every process of this container (its own pid namespace: the agent's children,
    Ray's, vLLM's ranks) that has used at least `min_cpu_s`, labelled by pid and its title (comm, as
    vLLM and Ray set it: "VLLM::Worker_TP1", "ray::RayWorkerWr"). Per-rank progress for any executor:
    the rate of a rank that makes no progress (stopped, or blocked in a collective that never
    completes while it spins, which shows as the opposite) tells it apart from its peers."""
    tick = os.sysconf("SC_CLK_TCK")
    out = []
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit() and int(p) != skip]
    except OSError:
        return out
    for pid in pids:
        try:
            with open(f"{proc}/{pid}/stat") as f:
                stat = f.read()
        except OSError:  # gone since the listing
            continue
        title, _, rest = stat.partition(" (")[2].rpartition(") ")
        fields = rest.split()
        if len(fields) < 13:
            continue
        cpu = (int(fields[11]) + int(fields[12])) / tick
        if cpu >= min_cpu_s:
            out.append(("sparkcluster_process_cpu_seconds_total", {"pid": pid, "process": title}, cpu))
    return out


def disks(paths) -> dict[str, tuple[int, int]]:
    """{path: (bytes free to the user, size)} for each path that exists."""
    out = {}
    for p in paths:
        try:
            st = os.statvfs(p)
        except OSError:
            continue
        out[p] = (st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize)
    return out


class Exporter:
    """What the agent's `/metrics` answers: every figure read at the scrape."""

    def __init__(self, cfg: dict, ray, sup=None, keeper=None, nvml: Nvml | None = None, kernel=None, temperatures=None):
        self.cfg, self.ray, self.sup, self.keeper = cfg, ray, sup, keeper
        self.nvml = nvml if nvml is not None else Nvml()
        self.kernel = kernel  # node/kernel_log.KernelWatch (issue 75), None where none reads it
        self.temperatures = temperatures  # node/hwmon.Temperatures (issue 75), None where none reads them
        # the HF cache (weights, the disk that fills) and the container's own root (logs, journal)
        self.paths = [p for p in (os.environ.get("HF_HOME"), "/") if p]

    def text(self) -> str:
        now = time.time()
        with open("/proc/meminfo") as f:
            mem = f.read()
        s = node_samples(
            self.cfg,
            mem,
            self.ray.poll() is None,
            self.nvml.readings(),
            read_json(FABRIC_PATH),
            disks(self.paths),
            aer.read(),
            self.kernel.report() if self.kernel is not None else None,
            self.temperatures.readings() if self.temperatures is not None else None,
        )
        s += processes(skip=os.getpid())
        if self.keeper is not None:
            s += rank_samples(self.keeper.report())
        if self.sup is not None:
            s += supervisor_samples(self.sup, now)
        return render(s)
