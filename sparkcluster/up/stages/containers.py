"""The containers stage: remove what the plan replaces (each container by ID, the server in the
head's first), drop the page cache when the profile asks, create the head's container, wait for
its Ray head, then create the workers' containers at once."""

from __future__ import annotations

import shlex
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import docker.errors

from sparkcluster import log
from sparkcluster.config import compile_cache
from sparkcluster.container.spec import ContainerSpec, create_and_start, spec_for
from sparkcluster.deployment import compile_caches, teardown
from sparkcluster.errors import EngineUnreachable, SparkError
from sparkcluster.labels import ROLE_LABEL
from sparkcluster.remote.fanout import Background
from sparkcluster.steps.base import Step, fail
from sparkcluster.up.stages import image as image_stage
from sparkcluster.up.stages import ray

if TYPE_CHECKING:
    from sparkcluster.up.execute import UpRun
    from sparkcluster.up.plan import Plan

STAGE = "containers"
_log = log.get(__name__)


def drop_caches_command(image: str) -> str:
    """The page cache dropped through Docker, which a member of `docker` may do without sudo (the
    SSH user of a Spark is an ordinary account): a throwaway container of the cluster image (on
    every node by this stage), root inside, writes the host's drop_caches bind-mounted into it
    (Docker mounts /proc/sys read-only in containers); `sync` is global. Where a security module
    refuses that write, the same as a privileged container, which Docker grants any member of docker."""

    def run(*extra: str) -> str:
        return shlex.join(
            [
                "docker",
                "run",
                "--rm",
                *extra,
                "--network",
                "none",
                "-v",
                "/proc/sys/vm/drop_caches:/run/drop_caches",
                "--entrypoint",
                "sh",
                image,
                "-c",
                "sync && echo 3 > /run/drop_caches",
            ]
        )

    return f"{run()} || {run('--privileged')}"


SETTLE_S = 30.0  # how long a rollback waits for creates still in flight to name their container


@dataclass
class Created:
    """The containers this run created (the containers stage's state): what the rollback removes.

    A create runs on a thread of its own (`creating`), so a Ctrl-C interrupts the wait for it, never
    the Engine API call: the engine's answer, the new container's ID, still arrives, and the
    rollback waits for it (`settle`) before it removes what this run created. Interrupting the call
    itself lost the ID of a container the engine had made, which stayed behind. Once the rollback
    has begun, no other create starts."""

    containers: dict[str, set[str]] = field(default_factory=dict)  # node -> container ids
    _pending: set[object] = field(default_factory=set, repr=False)  # creates that have not named theirs
    _closed: bool = field(default=False, repr=False)
    _cond: threading.Condition = field(default_factory=threading.Condition, repr=False)

    def add(self, node: str, cid: str) -> None:
        with self._cond:
            self.containers.setdefault(node, set()).add(cid)

    def creating(self, node: str, create: Callable[[Callable[[str], None]], str]) -> str:
        """`create(heard)` on its own thread; `heard(cid)` records the ID as soon as the engine gives it."""
        token = object()
        with self._cond:
            if self._closed:
                raise SparkError(f"{node}: not created: this run is rolling back")
            self._pending.add(token)

        def settled() -> None:
            with self._cond:
                self._pending.discard(token)
                self._cond.notify_all()

        def heard(cid: str) -> None:
            self.add(node, cid)
            settled()

        def run() -> str:
            try:
                return create(heard)
            finally:
                settled()

        return Background(run).result()

    def settle(self, within: float = SETTLE_S) -> bool:
        """No create starts from now on; wait until those in flight have named their container or
        ended. False if some had not within `within` seconds (the engine did not answer)."""
        with self._cond:
            self._closed = True
            return self._cond.wait_for(lambda: not self._pending, timeout=within)


def steps(plan: Plan) -> list[Step]:
    inv = plan.inventory
    out = []
    # workers before the head, as `down` does: a worker's raylet outlives no head it waits for
    for node in [*(w.name for w in inv.workers), inv.head.name]:
        for c in plan.facts[node].ours:
            name = c.name
            if name not in plan.remove.get(node, []):
                continue
            is_head = c.labels.get(ROLE_LABEL) == "head"
            how = "stop vllm serve by its PID (TERM, then KILL after 30s), then " if is_head else ""
            out.append(
                Step(
                    STAGE,
                    node,
                    f"remove-{name}",
                    f"remove {name}",
                    f"{how}Engine API: docker rm -f {(c.id or name)[:12]} (this container only, by ID)",
                    run=lambda r, node=node, cid=c.id or name, h=is_head: remove(r, node, cid, h),
                    parallel="" if is_head else "remove-workers",
                )
            )
    if plan.containers and plan.profile.drop_page_cache:
        for n in inv.nodes:
            out.append(
                Step(
                    STAGE,
                    n.name,
                    "drop-page-cache",
                    "drop the page cache",
                    drop_caches_command(plan.image),
                    run=lambda r, n=n.name: drop_page_cache(r, n),
                    parallel="drop-page-cache",
                )
            )
    head_facts = plan.facts.get(inv.head.name)
    key = compile_cache.key(
        plan.profile, plan.image, head_facts.image_id if head_facts and plan.build is None else None
    )
    for spec in [] if compile_cache.in_place(plan.profile) else plan.containers:
        root = inv.compile_cache(spec.node)
        where = (
            compile_cache.key_dir(root, key)
            if key
            else f"{root}/KEY, KEY pending: a hash of the image's ID, known once the image stage has built it, "
            "with the model and the compiling flags"
        )
        out.append(
            Step(
                STAGE,
                spec.node,
                "compile-cache",
                "make the compile cache ready",
                f"as the SSH user: mkdir {where} (key of image ID, model and compiling "
                f"flags) and its tools' folders, stamp its start, remove the oldest other keys no running "
                f"container uses while {root} holds over {inv.cluster.compile_cache_max_gb:g} GiB",
                run=lambda r, node=spec.node: prepare_cache(r, node, cache_key(r)),
                parallel="compile-cache",
            )
        )
    for spec in plan.containers:
        files = ", ".join(spec.files) or "none"
        out.append(
            Step(
                STAGE,
                spec.node,
                "create",
                f"create {spec.name}",
                f"Engine API create+start (files: {files}): {spec.docker_run_equivalent()}",
                run=lambda r, spec=spec: create(r, spec),
                parallel="" if spec.role == "head" else "create-workers",
            )
        )
        if spec.role == "head" and spec.command:
            out.append(
                Step(
                    STAGE,
                    spec.node,
                    "ray-head",
                    "wait for the Ray head",
                    f"`ray start --head` says its runtime started (or Ray's state API answers) on {spec.node} "
                    f"within {ray.RAY_HEAD_TIMEOUT_S:g}s, "
                    f"while {spec.name} keeps running",
                    run=lambda r, spec=spec: ray.wait_head(r, spec),
                )
            )
    return out


def summary(done: list[tuple[Step, object]]) -> str:
    return f"{sum(1 for s, _ in done if s.action == 'create')} created"


def remove(r: UpRun, node: str, cid: str, is_head: bool) -> None:
    host = r.cluster.hosts[node]
    if is_head:
        teardown.stop_server(host, cid)
    teardown.remove_container(host, cid)


def drop_page_cache(r: UpRun, node: str) -> None:
    # a failure fails the stage in one line: the profile asked for the memory this frees before the
    # load, so it is never skipped quietly
    res = r.cluster.hosts[node].run(drop_caches_command(r.plan.image), timeout=120, warn=True)
    if not res.ok:
        lines = [ln.strip() for ln in (res.stderr or res.stdout).splitlines() if ln.strip()]
        why = next(
            (ln for ln in lines if "rror" in ln or "denied" in ln or "not permitted" in ln), lines[-1] if lines else ""
        )
        raise fail(
            STAGE,
            node,
            "drop the page cache",
            f"could not drop the page cache through Docker (a container of {r.plan.image}): "
            f"{why or f'exit {res.exit_code}'}",
            res.command,
            res.tail(),
            "set drop_page_cache = false in the profile (drop it yourself first if you like: "
            f"`sync; echo 3 | sudo tee /proc/sys/vm/drop_caches` on {node}), then sparkcluster up",
        )


def image_id(r: UpRun) -> str:
    """The head's image ID now: the built image's after a build, else the one the facts read."""
    if r.plan.build is None and r.plan.facts.get(r.inv.head.name) and r.plan.facts[r.inv.head.name].image_id:
        return r.plan.facts[r.inv.head.name].image_id
    return image_stage.head_image(r)["Id"]


def cache_key(r: UpRun) -> str:
    """The compile cache's key, computed once the image is known (config/compile_cache)."""
    k = compile_cache.key(r.plan.profile, r.plan.image, image_id(r))
    if k is None:  # pragma: no cover - the image stage has made the image or failed
        raise fail(STAGE, r.inv.head.name, "make the compile cache ready", f"no image ID for {r.plan.image}")
    return k


def ready_spec(r: UpRun, spec: ContainerSpec) -> ContainerSpec:
    """The spec to create: the plan's, or, where its compile cache's key was pending on the image's
    ID, the same spec made again with the built image's ID."""
    if not any(compile_cache.pending(h) for h in spec.binds):
        return spec
    return spec_for(r.inv, r.plan.profile, r.inv.node(spec.node), spec.image, image_id(r))


def prepare_cache(r: UpRun, node: str, key: str) -> dict:
    """The key's folders made as the SSH user before Docker would make them root's, and the cap kept."""
    root = r.inv.compile_cache(node)
    about = compile_cache.factors(r.plan.profile, r.plan.image, image_id(r))
    cmd = compile_caches.prepare_command(root, key, compile_cache.max_bytes(r.inv), about)
    res = r.cluster.hosts[node].run(cmd, timeout=600, warn=True)
    try:
        done = compile_caches.parse_result(res.stdout) if res.ok else None
    except (ValueError, IndexError):
        done = None
    if done is None:
        raise fail(
            STAGE,
            node,
            "make the compile cache ready",
            f"could not make {compile_cache.key_dir(root, key)} as the SSH user: "
            f"{res.tail(1) or f'exit {res.exit_code}'}",
            res.command,
            res.tail(),
            f"on {node}: make {root} the SSH user's (or set cluster.compile_cache in the inventory), "
            "then sparkcluster up",
        )
    for e in done.get("evicted", []):
        _log.info("compile cache removed: over the cap", host=node, key=e["key"], gib=round(e["bytes"] / 2**30, 2))
    return done


def create(r: UpRun, spec: ContainerSpec) -> str:
    spec = ready_spec(r, spec)
    host = r.cluster.hosts[spec.node]
    created = r.find(Created) or r.put(Created())
    try:
        cid = created.creating(host.name, lambda heard: create_and_start(host.docker().api, spec, heard))
    except (
        docker.errors.APIError,
        EngineUnreachable,
    ) as e:  # the engine refused or did not answer: name the node and the call
        raise fail(STAGE, host.name, f"create {spec.name}", str(e), spec.docker_run_equivalent()) from None
    return cid
