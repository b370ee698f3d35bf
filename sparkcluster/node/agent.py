"""The node agent: the foreground process of every sparkcluster container, and on the head the
supervisor that keeps `vllm serve` serving without the controller.

Why it lives here: the container is what Docker restarts (restart policy `unless-stopped`), so a
reboot of a node brings back Ray and this agent together, with no unit file on the host and nothing
to install beside the image. On every node it owns `ray start --block` (when Ray exits, the agent
exits and Docker restarts the container, which re-joins Ray at the node's control IP), reports the
node's MemAvailable on a read-only HTTP endpoint at the node's control IP (and its metrics for
Prometheus at `/metrics` there, node/metrics; to the node itself, what `status` reads in the
container at `/status`, node/container_status), and removes the
/dev/shm segments its container's processes mapped once none of them maps them any more. On the
head it also supervises the engine: it starts `vllm serve` when `up` asks (desired state in
DESIRED_PATH, secrets in a 0600 file beside it), waits until every node is a Ray member before
any (re)start, watches progress rather than liveness, restarts within bounds, and stops the engine
for good when a node runs short of memory. What it sees and does goes to a journal (JOURNAL_PATH).

Why not Ray for the worker's memory: Ray reports a container's cgroup usage, not the node's
MemAvailable (ray/_private/utils.py `get_used_memory`), and asking Ray anything else needs a driver
of a few hundred MB in this process. To its peers the endpoint answers only figures (but see on
demand below); `/status` (the journal's last lines among it) only to the node itself. On the
head it also carries the supervisor's state file, which the gateway (sparkcluster/gateway) reads to
take a deployment out of rotation on the supervisor's verdict, and on the head of an on-demand
deployment its one input: `POST /wake` with the deployment's wake token (a file `up` wrote, 0600),
which asks the supervisor to start the engine on standby (node/supervisor).

This package runs inside the image's own Python: standard library only. Its files are shipped into
every container (node/ under contract.AGENT_DIR, with launcher.py as its __main__.py), so a change
here changes the container's configuration hash.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time

from . import console_calls, container_status, service_supervisor
from .compile_reading import CacheOwner, hold, seed
from .contract import CONFIG_PATH, DESIRED_PATH, SERVICE_ROLE, STARTING, STATE_PATH, WAITING
from .energy import power_report
from .fabric_watch import FabricWatch
from .hwmon import Temperatures
from .journal import Journal, read_json
from .kernel_log import KernelWatch
from .memreport import node_report, serve_reports
from .metrics import Exporter, NvidiaSmi, Nvml, gpu_reader
from .ranks import RankKeeper
from .shm import ShmJanitor
from .supervisor import Supervisor

BUSY_LOOK_S = 0.25  # the supervisor's look while a server starts: `up` is waiting for it to say serving
WAKE_S = 0.1  # how often a wait looks whether the controller changed the desired state


def _changed() -> int | None:
    try:
        return os.stat(DESIRED_PATH).st_mtime_ns
    except OSError:
        return None


def wait_or_wake(stopping: threading.Event, seconds: float, woken: threading.Event | None = None) -> None:
    """Wait `seconds`, or less: until the container stops, the controller writes or removes the
    desired state (`up` asking for a server, `down` for none), or a caller wakes a server on standby
    (`woken`), which is then acted on at once rather than at the next look. A stat of one file ten
    times a second costs nothing measurable."""
    seen, end = _changed(), time.monotonic() + seconds
    while not stopping.wait(max(0.0, min(WAKE_S, end - time.monotonic()))):
        if time.monotonic() >= end or _changed() != seen or (woken is not None and woken.is_set()):
            return


def report(
    cfg: dict,
    ray: subprocess.Popen,
    started: float,
    sup: Supervisor | None,
    keeper: RankKeeper | None,
    kernel: KernelWatch | None = None,
    nvml: Nvml | NvidiaSmi | None = None,
    fabric: FabricWatch | None = None,
    temperatures: Temperatures | None = None,
) -> dict:
    """What this node's report endpoint answers: its memory, Ray and when this agent started; on the
    head also the supervisor's published state (as `status` reads it), from which the gateway takes a
    deployment out of rotation; with executor "mp" the head's set and each worker's rank. Every node's
    also carries its kernel's events (node/kernel_log) and its GPUs' power (issue 75), which the head's
    supervisor reads: a verdict names a peer's fresh Xid, the energy per token counts every node's; and
    its ConnectX-7 and NVMe temperatures with their thresholds (node/hwmon), for the console."""
    extra = {"set": sup.set_report()} if sup is not None and sup.mp else {}
    if sup is not None:
        extra["supervisor"] = read_json(STATE_PATH)
        extra["peers"] = peer_figures(sup.reports)  # the console's nodes: each peer as the supervisor last read it
    if kernel is not None:
        extra["kernel"] = kernel.report()
    if nvml is not None:
        extra.update(power_report(nvml.readings()))
    if fabric is not None:  # this node's ports and AER as its last look judged them (node/fabric_watch)
        extra["fabric_health"] = fabric.last
    if temperatures is not None:  # kept READ_EVERY_S: a report asked often reads sysfs no more often
        extra["temperatures"] = temperatures.readings()
    return {**node_report(cfg["node"], ray, started), **extra, **({"rank": keeper.report()} if keeper else {})}


def watch_fabric(fabric: FabricWatch, journal: Journal, node: str) -> None:
    """This node's data-plane ports and AER, judged at each look; journalled when the judgement changes."""
    before = fabric.last.get("problems") or []
    now = fabric.look()["problems"]
    if now != before:
        journal.write("fabric unhealthy" if now else "fabric healthy again", node=node, problems=now or before)


def watch_kernel(kernel: KernelWatch, journal: Journal, node: str) -> None:
    """The kernel's new events, each journalled (`events` shows them)."""
    for ev in kernel.look():
        # the kernel's time of it as `at` (the journal's own `ts` is when it was read)
        journal.write("kernel event", node=node, **{("at" if k == "ts" else k): v for k, v in ev.items()})


PEER_FIGURES = ("mem_available", "mem_total", "ray_alive", "ts", "temperatures")


def peer_figures(reports: dict) -> dict:
    """Each peer's figures from its last report the supervisor read (None: it did not answer)."""
    return {n: ({k: r.get(k) for k in PEER_FIGURES} if isinstance(r, dict) else None) for n, r in reports.items()}


def main(config_path: str = CONFIG_PATH) -> int:
    started = time.time()  # before Ray: a Ray node at this IP that started earlier is not this container's
    with open(config_path) as f:
        cfg = json.load(f)
    journal = Journal()
    # what the image's start-up gave this process, and so everything it spawns (Ray, every rank, vllm
    # serve): NGC's forward-compatibility probe exports its result (container/spec.keeps_entrypoint).
    # Printed after the start-up's own banner, where `up` reads both (facts/image_nccl.read_boot)
    compat = os.environ.get("_CUDA_COMPAT_STATUS", "")
    print(f"sparkcluster agent: _CUDA_COMPAT_STATUS={compat}", flush=True)
    journal.write("agent started", node=cfg["node"], role=cfg["role"], cuda_compat=compat)
    if cfg["role"] == SERVICE_ROLE:  # a service's container (issue 60): its own supervisor, no Ray, no engine
        return service_supervisor.run(cfg, journal, started)
    # the compile cache's key: held while this container lives (eviction spares it), and seeded from
    # the image's own caches on the key's first start, before any engine starts (node/compile_reading)
    in_use = hold(cfg.get("compile_cache"))  # noqa: F841 - the lock lives as long as this file is open
    seed(cfg.get("compile_cache"), journal)
    # no Ray (a one-node deployment): a stand-in that never exits, so the loop below reads the same
    ray = subprocess.Popen(cfg["ray_argv"]) if cfg.get("ray_argv") else subprocess.Popen(["sleep", "infinity"])
    stopping = threading.Event()

    def on_term(signum, frame):
        stopping.set()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    sup = Supervisor(cfg, journal, started) if cfg["role"] == "head" else None
    kernel, nvml = KernelWatch(), gpu_reader()  # the kernel's log (/dev/kmsg) and NVML, read by every node (issue 75)
    temperatures = Temperatures()  # the CX7's and NVMe drives' hwmon sensors, read-only /sys (issue 75)
    spec = cfg.get("fabric") or {}
    fabric = FabricWatch(spec.get("hcas") or [], spec.get("gid_index")) if spec.get("hcas") else None
    if sup is not None:
        sup.kernel, sup.nvml, sup.fabric = kernel, nvml, fabric
    # executor "mp" across nodes: a worker runs its own rank(s) for the head's set (node/ranks)
    keeper = RankKeeper(cfg, journal) if sup is None and cfg.get("executor") == "mp" else None

    try:
        serve_reports(
            cfg["report_ip"],
            cfg["report_port"],
            lambda: report(cfg, ray, started, sup, keeper, kernel, nvml, fabric, temperatures),
            Exporter(cfg, ray, sup, keeper, nvml=nvml, kernel=kernel, temperatures=temperatures).text,
            wake=sup.wake if sup is not None else None,  # on demand: the head's one input
            yield_=sup.yield_ if sup is not None else None,  # ... and its stop for another (issue 60)
            status=lambda: container_status.read(head=sup is not None),  # what `status` reads here
            console=console_calls.read if sup is not None else None,  # the gateway's console: journal, log
            ask=sup.ask if sup is not None else None,  # ... and its actions: restart, back to standby
        )
    except OSError as e:  # the head then judges this node's memory blind: say so, keep Ray and the server
        journal.write("memory report not served", address=f"{cfg['report_ip']}:{cfg['report_port']}", error=str(e))
    janitor = ShmJanitor(journal)
    cache_owner = CacheOwner(cfg.get("compile_cache"), journal)  # the engine's cache files, the user's
    last_janitor = 0.0
    while not stopping.is_set():
        if ray.poll() is not None:
            journal.write("ray exited", code=ray.returncode)
            break
        try:  # before the supervisor's look: a verdict at this look names what the kernel just said
            watch_kernel(kernel, journal, cfg["node"])
            if fabric is not None:
                watch_fabric(fabric, journal, cfg["node"])
        except Exception as e:  # as the supervisor's below: the container stays
            journal.write("kernel or fabric reading error", error=f"{type(e).__name__}: {e}")
        if sup is not None:
            try:
                sup.tick()
            except Exception as e:  # a bug here must not take Ray and the container down with it
                journal.write("supervisor error", error=f"{type(e).__name__}: {e}")
        if keeper is not None:
            try:
                keeper.tick()
            except Exception as e:  # as above: the container stays
                journal.write("rank keeper error", error=f"{type(e).__name__}: {e}")
        if time.time() - last_janitor >= 10:
            last_janitor = time.time()
            janitor.look()
        cache_owner.look()
        interval = sup.policy().interval_s if sup else 2.0 if keeper else 5.0
        if sup is not None and sup.state in (WAITING, STARTING):
            interval = min(interval, BUSY_LOOK_S)  # `up` waits on what this look says (not a restart's backoff)
        wait_or_wake(stopping, interval, sup.woken if sup is not None else None)
    if sup is not None:
        sup.stop("the container is stopping")
    if keeper is not None:
        keeper.stop("the container is stopping")
    cache_owner.look(force=True)
    if ray.poll() is None:
        ray.terminate()
        try:
            ray.wait(30)
        except subprocess.TimeoutExpired:
            ray.kill()
    return 1 if ray.returncode not in (0, None) or not stopping.is_set() else 0
