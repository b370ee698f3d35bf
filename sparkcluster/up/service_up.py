"""`up --profile NAME` of a service (issue 60 item 2: a profile of kind "service"): on one node, in a
slot of its own beside what serves there (`--beside`, bringup.placement), admitted by the one memory
arithmetic (bringup.admit_beside: its reservation beside the engines' shares and the floor), its
ports found free on the node (`ports_refused`: a pure check on who listens there), its image pulled
where the node lacks it, its two containers made (container/service_container: the service's own,
created and left to its supervisor to start; its supervisor, started) and waited on until the
supervisor says serving. Again with nothing changed: nothing is recreated. A failed start removes
what this run made and says why, with the supervisor's last lines. Its secrets are files written
into its container; no step, `--dry-run` or `--json` shows them.

No build, no weights, no Ray, no fabric: the image is the service's own, as its owner runs it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import docker.errors

from sparkcluster import redact
from sparkcluster.config.inventory import Inventory
from sparkcluster.config.service_profile import ServiceProfile
from sparkcluster.container.service_container import server_spec, service_spec
from sparkcluster.container.spec import ContainerSpec, create_and_start
from sparkcluster.deployment import deployments, server, supervision, teardown
from sparkcluster.errors import InputError, SparkError, StageError, StepFailure
from sparkcluster.facts import parsers, probes
from sparkcluster.labels import CLUSTER_LABEL, CONFIG_LABEL
from sparkcluster.node import contract, memory_fit
from sparkcluster.remote.fanout import connect_reachable
from sparkcluster.remote.lock import NodeLocks
from sparkcluster.steps import walk
from sparkcluster.steps.base import Step, render_steps
from sparkcluster.steps.walk import CommandRun, StageProgress
from sparkcluster.up.bringup import Monitoring, UpSummary, admit_beside, all_reachable, placement

STAGE = "service"
WAIT_LOOK_S = 0.2  # how often `up` reads the supervisor's state while the service starts


@dataclass
class ServicePlan:
    """A service's `up`: its steps on its node (admitted, its container left alone or replaced, its
    image pulled, made, waited on), what `--dry-run` prints and the walk runs; `docker_run` is the
    container as the `docker run` a person would type."""

    node: str
    slot: int
    docker_run: str
    notes: list[str]
    _steps: list[Step] = field(default_factory=list, repr=False)

    def steps(self) -> list[Step]:
        return list(self._steps)

    def render(self) -> str:
        lines = [f"service on {self.node}, slot {self.slot}:", *[f"  note: {n}" for n in self.notes]]
        return redact.mask("\n".join(lines + render_steps(self._steps)))

    def as_json(self) -> str:
        return redact.mask(json.dumps([s.public() for s in self._steps], indent=2))


@dataclass
class Current:
    """The service's container as the walk found it: left alone when it serves this configuration."""

    kept: contract.Supervised | None = None


@dataclass
class Made:
    """What this run created: removed again when a later step fails."""

    ids: list[str] = field(default_factory=list)


LEAVES = (Current, Made)  # the state a service's steps leave in their run, as a stage's `leaves` says


@dataclass
class ServiceRun(CommandRun):
    """What a service's steps share: its node's connection and Docker API, and when it began."""

    host: Any = None
    t0: float = 0.0

    @property
    def api(self):
        return self.host.docker().api


def _kept(r: ServiceRun) -> str | None:
    return "the same configuration already serves" if (r.find(Current) or Current()).kept else None


def admit_step(inv: Inventory, svc: ServiceProfile, others: list) -> Step:
    """Its reservation beside the engines' shares and the floor, in the node's memory."""

    def run(r: ServiceRun) -> None:
        total = parsers.meminfo(r.host.run("cat /proc/meminfo", timeout=10).stdout).total
        floor = int(svc.supervisor.memory_floor_gib * memory_fit.GiB)
        want = memory_fit.Held(f"'{svc.name}'", None, int(svc.memory_gb * memory_fit.GB))
        admit_beside(inv, svc.name, want, floor, {inv.head.name: total}, others, "memory_gb")

    what = f"admit '{svc.name}' ({svc.memory_gb:g} GB) beside what the node's memory already holds and its floor"
    return Step(STAGE, inv.head.name, "admit", what, "cat /proc/meminfo", run=run)


def start_steps(inv: Inventory, svc: ServiceProfile, spec: ContainerSpec, server: ContainerSpec) -> list[Step]:
    """Its two containers: the same configuration serving is left alone; else both replaced, the
    images pulled where the node lacks them, the service's own made (its supervisor starts it), its
    supervisor made and started, and waited on until it says serving."""
    node = inv.head.name

    def look(r: ServiceRun) -> str:
        there = _running(r.api, spec)
        if there is None:
            _remove_named(r, server)  # a service's container left without its supervisor
            return "none yet"
        same = (there.get("Labels") or {}).get(CONFIG_LABEL) == spec.config_hash() and there.get("State") == "running"
        state = supervision.state(r.api, there["Id"]) if same else None
        if state and state.availability().up:
            r.put(Current(state))
            return "serving: left alone"
        r.progress.info(f"{spec.name} is replaced ({'not serving' if same else 'its configuration changed'})")
        teardown.remove_container(r.host, there["Id"])  # its supervisor stops the service as it goes
        _remove_named(r, server)
        return "replaced"

    def lacks(image: str):
        def skip(r: ServiceRun) -> str | None:
            if _kept(r):
                return _kept(r)
            try:
                r.api.inspect_image(image)
                return "the node has it"
            except docker.errors.ImageNotFound:
                return None

        return skip

    def pull(image: str):
        def run(r: ServiceRun) -> None:
            r.progress.info(f"pulling {image} on {node}")
            r.api.pull(image)

        return run

    def create_server(r: ServiceRun) -> str:
        return create_and_start(r.api, server, r.put(Made()).ids.append, start=False)

    def create(r: ServiceRun) -> str:
        return create_and_start(r.api, spec, (r.find(Made) or r.put(Made())).ids.append)

    def wait(r: ServiceRun) -> contract.Supervised:
        made = r.find(Made).ids
        try:
            return _wait(r.api, made[-1], svc, made[0] if len(made) > 1 else None)
        except SparkError as e:  # its last lines shown under the step, the service's own last
            tail = "\n".join(e.details)
            failure = StepFailure(
                node, "wait until its supervisor says serving", e.message, output_tail=tail, fix=e.fix
            )
            raise StageError(STAGE, [failure], e.fix) from None

    images = list(dict.fromkeys([server.image, spec.image]))  # the supervisor's: the cluster's own, usually there
    return [
        Step(STAGE, node, "look", f"find {spec.name}: left alone where it serves this configuration, else removed "
             f"with {server.name}", run=look),
        *[Step(STAGE, node, "pull" if i == server.image else "pull-supervisor", f"pull {i}", when="the node lacks it",
               skip=lacks(i), run=pull(i)) for i in images],
        Step(STAGE, node, "create-server", f"create {server.name} (its image's entrypoint kept; its secrets written as "
             "files; its supervisor starts it)", server.docker_run_equivalent(), skip=_kept, run=create_server),
        Step(STAGE, node, "create-supervisor", f"create and start {spec.name}, its supervisor (the node's Docker "
             "socket mounted)", spec.docker_run_equivalent(), skip=_kept, run=create),
        Step(STAGE, node, "wait", "wait until its supervisor says serving", skip=_kept, run=wait),
    ]  # fmt: skip


def _remove_named(r: ServiceRun, spec: ContainerSpec) -> None:
    there = _running(r.api, spec)
    if there is not None:
        teardown.remove_container(r.host, there["Id"])


def ports_refused(svc: ServiceProfile, listening: list[parsers.Listener], node: str) -> InputError | None:
    """Pure: the refusal when something on the node already listens on a port the service declares
    (host networking: the service would never bind it), naming the holder; None when all are free."""
    held = [lst for lst in listening if lst.port in svc.all_ports]
    if not held:
        return None
    who = "; ".join(
        f":{lst.port} held by {lst.process}"
        + (f" (pid {lst.pid})" if lst.pid else "")
        + (f" in container {lst.container[:12]}" if lst.container else "")
        for lst in sorted(held, key=lambda x: x.port)
    )
    return InputError(
        f"{node}: port(s) '{svc.name}' declares are in use: {who}",
        f"stop what holds them, or give '{svc.name}' other ports (its profile's port/ports and its args), "
        f"then sparkcluster up --profile {svc.name} --node {node} --beside",
    )


def supervisor_image(svc: ServiceProfile, api, cluster: str, node: str) -> str:
    """The image of the service's supervisor: `[supervisor] image`, else the cluster's own as a
    model's container on the node runs it."""
    image = svc.supervisor.image or deployments.engine_image(api, cluster)
    if image is None:
        raise InputError(
            f"{node}: no model's container to take the cluster's image from, for '{svc.name}'s supervisor",
            f"bring a model up on {node} first, or set [supervisor] image = \"IMAGE\" in '{svc.name}'s profile "
            "(any image with python3 3.8 or newer)",
        )
    return image


def service_node(inv: Inventory, svc: ServiceProfile, node: tuple[str, ...] | str | None) -> Inventory:
    """The one node a service runs on: the one named, or the inventory's only node."""
    named = [node] if isinstance(node, str) else list(node or ())
    if len(named) == 1:
        return inv.only(named)
    if not named and len(inv.nodes) == 1:
        return inv
    raise InputError(
        f"service '{svc.name}' runs on one node; {'several were' if named else 'none was'} named",
        f"sparkcluster up --profile {svc.name} --node {'|'.join(n.name for n in inv.nodes)}",
    )


def run(
    full: Inventory,
    svc: ServiceProfile,
    progress: StageProgress,
    *,
    monitoring: Monitoring,
    node: tuple[str, ...] | str | None = None,
    dry_run: bool = False,
    beside: bool = False,
    replace: bool = False,
    command: str = "up",
    secrets: dict[str, str] | None = None,
) -> UpSummary | ServicePlan:
    if replace:
        raise InputError(
            f"--replace is for a model's profile; '{svc.name}' is a service, started beside what serves",
            f"sparkcluster down --profile NAME for what should go, then sparkcluster up --profile {svc.name} --beside",
        )
    inv = service_node(full, svc, node)
    t0 = time.monotonic()
    progress.stage(STAGE)
    everyone, unreachable = connect_reachable(full)
    with everyone:
        all_reachable(inv, unreachable)
        found, unread = deployments.on(everyone, full)
        if inv.head.name in unread:
            raise SparkError(f"{inv.head.name}: its containers could not be read: {unread[inv.head.name]}")
        others = deployments.conflicts(found, inv, svc.name)
        mine = (inv.head.name,)
        slot, _, beside = placement(found, others, mine, svc.name, False, beside)
        if others and not beside:
            what = "; ".join(d.describe() for d in others)
            raise InputError(
                f"{what} runs on the node service '{svc.name}' needs; they would share its memory",
                f"sparkcluster up --profile {svc.name} --node {inv.head.name} --beside (admitted when the "
                "node's memory holds all of them)",
            )
        clash = [d for d in others if d.service and d.port == svc.port]
        if clash:  # host networking: two services on one port of one node, the second never binds
            raise InputError(
                f"service {clash[0].describe()} answers on port {svc.port}, which '{svc.name}' asks for",
                f"give '{svc.name}' another port (its profile's port and its args), or sparkcluster down "
                f"--profile {clash[0].profile} first",
            )
        inv = inv.at_slot(slot)
        host = everyone.hosts[inv.head.name]
        again = any(d.profile == svc.name and inv.head.name in d.nodes for d in found)
        if not again:  # a service already here holds its own ports: `look` decides whether it is replaced
            probe = probes.listeners(svc.all_ports)
            refused = ports_refused(svc, probe.parse(host.run(probe.command, timeout=10, warn=True).stdout), mine[0])
            if refused is not None:
                raise refused
        server = server_spec(inv, svc, inv.head, secrets or {})
        image = supervisor_image(svc, host.docker().api, full.cluster.name, mine[0])
        spec = service_spec(inv, svc, inv.head, image, server.config_hash())
        beside_note = f"admitted beside {', '.join(d.describe() for d in others)} when MemTotal holds them"
        notes = [
            *([beside_note] if others else []),
            f"port(s) {', '.join(str(p) for p in svc.all_ports)}: "
            + ("its own (already here)" if again else "free on the node"),
            f"supervised from {spec.name} ({spec.image}), which holds the node's Docker socket: root on the node",
            *([f"secret(s) {', '.join(s.name for s in svc.secrets)} written as files into {server.name}"]
              if svc.secrets else []),
        ]  # fmt: skip
        steps = [admit_step(inv, svc, others), *start_steps(inv, svc, spec, server)]
        plan = ServicePlan(inv.head.name, slot, server.docker_run_equivalent(), notes, steps)
        if dry_run:
            return plan
        with (
            NodeLocks(everyone, inv, command),
            monitoring(everyone.hosts, full, [inv.head.name], f"sparkcluster {command}"),
        ):
            return execute(plan.steps(), host, inv, svc, progress, t0)


def _running(api, spec) -> dict | None:
    """Our container of this name, as the Engine API lists it, if any."""
    listed = api.containers(all=True, filters={"name": f"^/{spec.name}$", "label": f"{CLUSTER_LABEL}"})
    return listed[0] if listed else None


def execute(steps: list[Step], host, inv: Inventory, svc: ServiceProfile, progress: StageProgress, t0: float):
    """Walk the service's steps (exactly those its dry run prints); a failure removes what this run
    created and raises. Its summary: left alone, or serving since the run began."""
    r = ServiceRun(stage=STAGE, progress=progress, host=host, t0=t0)
    endpoint = f"http://{host.address}:{svc.port}"
    try:
        done = walk.walk(r, steps)
    except BaseException:
        made = r.find(Made)
        if made is not None and made.ids:
            progress.info("rolling back what this run created")
            for cid in made.ids:
                teardown.remove_container(host, cid)
        raise
    kept = (r.find(Current) or Current()).kept
    if kept is not None:
        return UpSummary(True, endpoint, svc.served_model_name, kept.pid, {}, inv.slot)
    state = next((v for s, v in done if s.action == "wait"), None)
    seconds = time.monotonic() - t0
    progress.done(STAGE, seconds, f"{svc.name} serving on {inv.head.name}:{svc.port}")
    return UpSummary(False, endpoint, svc.served_model_name, state.pid if state else None, {STAGE: seconds}, inv.slot)


def _start(host, inv: Inventory, svc: ServiceProfile, spec, server, progress: StageProgress, t0: float) -> UpSummary:
    """Its containers' steps alone, walked (the admission left out: the caller's)."""
    return execute(start_steps(inv, svc, spec, server), host, inv, svc, progress, t0)


def _wait(api, cid: str, svc: ServiceProfile, server_cid: str | None = None) -> contract.Supervised:
    """Until its supervisor says serving, as the gateway judges it (contract.Supervised.availability); a
    final state (failed to start, the restart limit) or the service's ready bound (and a margin for the
    agent's start) passed first is the failure, with why."""
    deadline = time.monotonic() + svc.ready_timeout_s + 30
    state = None
    while time.monotonic() < deadline:
        state = supervision.state(api, cid)
        judged = state.availability() if state else None  # the gateway's judgement of it
        if judged is not None and judged.up:
            return state
        if judged is not None and judged.final:
            break
        time.sleep(WAIT_LOOK_S)
    why = (
        state.last_cause if state else ""
    ) or f"its supervisor says {(state.state if state else '') or 'nothing yet'}"
    raise SparkError(
        f"service '{svc.name}' did not serve: {why}",
        f"see its journal and log: sparkcluster events --profile {svc.name}; fix the profile, then up again",
        details=[server.supervisor_tail(api, cid), *([_service_tail(api, server_cid)] if server_cid else [])],
    )


SERVICE_TAIL_LINES = 8  # the plan shows a failed step's last 10 lines: the service's own come last


def _service_tail(api, cid: str) -> str:
    """The service's own last lines (its container's log: a server that refused to start says why there)."""
    try:
        text = api.logs(cid, tail=SERVICE_TAIL_LINES).decode(errors="replace").rstrip()
    except docker.errors.APIError as e:
        return f"its own log could not be read: {e}"
    return "its own log's last lines:\n" + redact.mask(text) if text else "its own log is empty"
