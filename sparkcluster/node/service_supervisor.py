"""A service's supervisor: the foreground process of a service's supervisor container (a profile of
kind "service": config/service_profile; container/service_container), where an engine's head
container runs the node agent and its Supervisor.

Where it runs, and why there: beside the service, not in it. The service's own container runs its
image as its owner runs it (its entrypoint, its command; no `python3` needed in it); this one runs
from an image that has `python3` (the cluster's own), with the node's Docker socket, and asks Docker
for one container only, the service's, by name (node/docker_socket: inspect, start, stop). It needs
no controller: Docker brings it back after a reboot (`unless-stopped`), and it starts the service
again; `down --profile` of the service removes both containers; a stop of any other deployment on
the node touches neither.

It starts the service's container, asks its health URL every look (`interval_s`; host networking:
the node's loopback is the service's), and after `health_failures` failed answers in a row, or an
exit, stops the container and starts it again, at most `max_restarts` in `restart_window_s` (the
engine's bounds: a profile's `[supervisor]`), with the engine's backoff; past the bound it stops for
good ("restart limit reached") until `up`. A first start that never answers healthy within
`ready_timeout_s`, or exits first, is "failed to start" and is not retried: a wrong argument stays
visible. Before a restart the node's MemAvailable must cover the service's reservation and the floor
(verdict.memory_for_restart, the engine's restart gate), so a restart of one never starves another
deployment on the node.

It publishes what the engine's supervisor publishes, in the same files: its state (STATE_PATH: the
gateway and `status` judge it as they judge an engine's), the child's record (RECORD_PATH), the
journal (`events --profile`), and through the agent's report endpoint `/`, `/metrics` (the
supervisor's series: the alerts apply as they are) and `/status`.

Standard library only: shipped into the container with the rest of node/.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
import urllib.request

from . import container_status, docker_socket
from .contract import (
    FAILED,
    FINAL,
    LIMIT,
    NO_MEMORY,
    RECORD_PATH,
    RESTARTING,
    SERVING,
    STARTING,
    STATE_PATH,
    VERDICT_EVENT,
    Policy,
    Supervised,
)
from .journal import Journal, read_json, write_json
from .lifecycle import Lifecycle
from .memreport import node_report, serve_reports
from .metrics import Exporter
from .readings import mem_available, mem_total
from .verdict import memory_for_restart

MEMINFO = "/proc/meminfo"  # the node's (host networking, the host's /proc/meminfo as every container reads it)
HEALTH_TIMEOUT_S = 3.0  # one health answer: a service that takes longer is failing it
BACKOFF_MAX_S = 60.0
BUSY_LOOK_S = 0.25  # while it starts: `up` waits on what the look says


def healthy(url: str, timeout: float = HEALTH_TIMEOUT_S) -> tuple[bool, str]:
    """One health question: (200, "") or (False, why)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return (r.status == 200, "" if r.status == 200 else f"{url} answered {r.status}")
    except Exception as e:  # refused, timed out, reset, an HTTP error status: all "not healthy"
        return False, f"{url}: {type(e).__name__}: {e}"


class Container:
    """The service's container as the supervisor's child: what a process child offers the
    lifecycle (its PID on the node, `poll()`: None while it runs, else its exit status)."""

    def __init__(self, docker: docker_socket.Docker, name: str, pid: int | None):
        self.docker, self.name, self.pid = docker, name, pid

    def poll(self) -> int | None:
        running, _, code = docker_socket.state_of(self.docker.inspect(self.name))
        if running:
            return None
        return code if code is not None else -1  # gone: removed under it


class ServiceSupervisor(Lifecycle):
    """One service's supervisor. What node/metrics' supervisor_samples reads of an engine's
    Supervisor is here under the same names (state, since, restarts, counts, the last health answer
    as the last probe), so the agent's `/metrics` and the alerts treat both alike."""

    child_name = "service"

    def __init__(self, cfg: dict, journal: Journal, clock=time.time, docker: docker_socket.Docker | None = None):
        self.clock = clock
        super().__init__(cfg, journal, STATE_PATH, RECORD_PATH)
        # what an engine's Supervisor carries and a service has not: no ranks, no progress series
        # (health is the whole verdict), no token rate
        self.mp, self.watch, self.rate, self.reports, self.epoch = False, None, None, {}, None
        svc = cfg["service"]
        self.container: str = svc["container"]
        self.docker = docker or docker_socket.Docker(svc.get("socket") or docker_socket.SOCKET)
        self.url: str = svc["health_url"]
        self.reserved: int = int(svc["reserved_bytes"])
        self.generation = svc.get("generation") or "service"
        self._policy = Policy.of(svc.get("policy"))
        self.failures = 0  # consecutive failed health answers
        self.started_at = 0.0
        self.served = False  # this start answered healthy once
        self.unserved = 0  # restarts in a row whose start never answered healthy: the backoff doubles
        self.resume(Supervised.of(read_json(self.state_path)))

    def policy(self) -> Policy:
        return self._policy

    def state_fields(self, policy: Policy) -> dict:
        """What a service's state file holds beside the fields every supervisor's holds."""
        return {
            "policy": policy.doc(),
            "memory_unknown": {},
            "service": {"health": self.url, "failures": self.failures},
        }

    # -- the child: the service's container
    def start(self) -> None:
        self.docker.start(self.container)  # already running (this supervisor came back): adopted as it is
        _, pid, _ = docker_socket.state_of(self.docker.inspect(self.container))
        self.proc = Container(self.docker, self.container, pid)
        self.started_at, self.failures, self.served = self.clock(), 0, False
        write_json(self.record_path, {"pid": pid, "generation": self.generation, "started_at": self.started_at})
        self.journal.write(f"{self.child_name} started", pid=pid, container=self.container)
        self.set_state(STARTING)

    def running(self) -> bool:
        """Whether the service's container runs now (one the supervisor finds running when it comes
        back, after its own container restarted, is adopted with no wait for memory it holds)."""
        running, _, _ = docker_socket.state_of(self.docker.inspect(self.container))
        return running

    def halt(self, grace: float) -> int | None:
        """The container stopped through Docker (SIGTERM to its main process, SIGKILL after `grace`)."""
        self.docker.stop(self.container, grace)
        _, _, code = docker_socket.state_of(self.docker.inspect(self.container))
        return code

    # -- looks
    def tick(self) -> None:
        now = self.last_look = self.clock()
        if self.state in FINAL:
            return
        if self.proc is None:
            if now >= self.next_start and (self.running() or not self.memory_before_restart()):
                self.start()
            return
        code = self.proc.poll()
        if code is not None:
            self.verdict("dead", f"the service exited with status {code}")
            return
        t0 = time.monotonic()
        ok, why = healthy(self.url)
        if ok or self.served:  # as an engine's probe: a start that is not ready yet fails no check
            self.last_probe_s, self.last_probe_ok = time.monotonic() - t0, ok
            self.count(f"probe:{'ok' if ok else 'failed'}")
        if ok:
            self.failures, self.served = 0, True
            self.set_state(SERVING)
            return
        if not self.served:
            if now - self.started_at > self._policy.ready_timeout_s:
                self.verdict("not-ready", f"no healthy answer within {self._policy.ready_timeout_s:g}s: {why}")
            else:
                self.save()
            return
        self.failures += 1
        if self.failures >= self._policy.health_failures:
            self.verdict("unhealthy", f"{self.failures} failed health checks in a row: {why}")
        else:
            self.save()

    def verdict(self, kind: str, cause: str) -> None:
        """A dead or failing service: stopped, then restarted within the bounds (or not at all)."""
        now = self.clock()
        self.count(f"verdict:{kind}")
        self.causes.append({"ts": now, "kind": kind, "cause": cause})
        self.journal.write(VERDICT_EVENT, kind=kind, cause=cause)
        if not self._policy.act:  # `[supervisor] enabled = false`: watched and journalled only
            self.save()
            return
        self.stop(cause, verdict=True)
        if self.first_start and not self.served:
            self.set_state(FAILED, cause=cause, fix="see its log: sparkcluster logs; fix the profile, then up")
            return
        self.first_start = False
        window = [t for t in self.restarts if now - t < self._policy.restart_window_s]
        if len(window) >= self._policy.max_restarts:
            self.set_state(LIMIT, cause=cause, restarts=len(window))
            return
        self.unserved = 0 if self.served else self.unserved + 1
        self.next_start = now + min(self._policy.backoff_s * 2**self.unserved, BACKOFF_MAX_S)
        self.restarts.append(now)
        self.count("restarts")
        self.set_state(RESTARTING, cause=cause, restarts=len(window) + 1)

    def memory_before_restart(self) -> bool:
        """True while a restart waits for the node's memory to cover the reservation and the floor;
        past memory_wait_s, stopped for good with what was seen."""
        if self.first_start:
            return False  # `up`'s admission counted it beside the others
        with open(MEMINFO) as f:
            text = f.read()
        total, avail = mem_total(text), mem_available(text)
        node = self.cfg["node"]
        self.memory_seen = {node: avail}
        fraction = self.reserved / total if total else 0.0
        gate = Policy.of({**self._policy.doc(), "memory_need_fraction": fraction})
        covered, seen = memory_for_restart({node: (total, avail)}, gate)
        now = self.clock()
        step = self.memory_wait_step(covered, seen, gate, now)
        if step == "give-up":
            cause = f"memory did not come back within {gate.memory_wait_s:g}s: {seen[node]}"
            self.causes.append({"ts": now, "kind": "memory-wait", "cause": cause})
            self.set_state(NO_MEMORY, cause=cause)
        return step != "go"


def run(cfg: dict, journal: Journal, started: float) -> int:
    """The service container's foreground process: its supervisor's loop, and the agent's report
    endpoint on the slot's report port (its state for the gateway, `/metrics`, `/status`)."""
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    sup = ServiceSupervisor(cfg, journal)
    alive = subprocess.Popen(["sleep", "infinity"])  # the report's "Ray" stand-in, as on a one-node engine
    try:
        serve_reports(
            cfg["report_ip"],
            cfg["report_port"],
            lambda: {**node_report(cfg["node"], alive, started), "supervisor": read_json(sup.state_path)},
            Exporter(cfg, alive, sup).text,
            status=lambda: container_status.read(head=True),
        )
    except OSError as e:  # the gateway then reads no verdict: it says so; the service is still kept
        journal.write("report not served", address=f"{cfg['report_ip']}:{cfg['report_port']}", error=str(e))
    while not stopping.is_set():
        try:
            sup.tick()
        except Exception as e:  # a bug here must not take the service down with it
            journal.write("supervisor error", error=f"{type(e).__name__}: {e}")
        stopping.wait(BUSY_LOOK_S if sup.state == STARTING else sup.policy().interval_s)
    sup.stop("the container is stopping")
    alive.kill()
    return 0
