"""The Ray waits: the head's runtime has started (in the containers stage, before any worker
container is created, so workers never race a head still starting), then every node is a member
at its control IP with its GPUs. A container that exits meanwhile fails at once with its logs."""

from __future__ import annotations

import shlex
import time
from typing import TYPE_CHECKING

from sparkcluster import redact
from sparkcluster.container.spec import ContainerSpec
from sparkcluster.deployment import ray_members
from sparkcluster.errors import StageError
from sparkcluster.facts.parsers import container_inspect
from sparkcluster.remote import retry
from sparkcluster.steps.base import Step, fail

if TYPE_CHECKING:
    from sparkcluster.up.execute import UpRun
    from sparkcluster.up.plan import Plan

STAGE = "ray"
RAY_HEAD_TIMEOUT_S = 60.0
RAY_JOIN_TIMEOUT_S = 90.0
POLL_S = 0.25
# what `ray start --head` prints once its GCS and raylet run (ray/scripts/scripts.py): all a worker
# joins. The state API (the dashboard) answers most of a second later; it is asked too, as a fallback
RAY_STARTED = "Ray runtime started."
RAY_STARTED_GRACE_S = 15.0


def steps(plan: Plan) -> list[Step]:
    if not plan.containers or not plan.containers[0].command:  # none created, or no Ray (one node)
        return []
    return [
        Step(
            STAGE,
            plan.inventory.head.name,
            "membership",
            "wait for Ray membership",
            f"every node at its control IP with its GPUs, within {RAY_JOIN_TIMEOUT_S:g}s",
            run=wait_membership,
        )
    ]


def summary(done: list[tuple[Step, object]]) -> str:
    return next((v for s, v in done if s.action == "membership"), "")


def container_failed(r: UpRun, spec: ContainerSpec) -> StageError | None:
    host = r.cluster.hosts[spec.node]
    api = host.docker().api
    info = container_inspect(api.inspect_container(spec.name))
    # created by this run: a restart (the restart policy) means its process died during bring-up
    restarted = info.restart_count
    if info.running and not restarted:
        return None
    logs = redact.mask(api.logs(spec.name, tail=15).decode(errors="replace"))
    fix = None
    if "already" in logs and ("6379" in logs or "running" in logs):
        fix = "a stale Ray head holds the GCS port: sparkcluster down --purge-gcs, then sparkcluster up"
    return fail(
        STAGE,
        host.name,
        f"{spec.role} container {spec.name}",
        f"the container exited ({info.exit_code})"
        if not restarted
        else f"the container exited and Docker restarted it ({restarted} time(s))",
        shlex.join(spec.command),
        logs,
        fix
        or f"read the container's last lines above (exit 137: killed, e.g. out of memory on {host.name}); "
        "sparkcluster doctor, then sparkcluster up",
    )


def membership(r: UpRun) -> list[ray_members.RayNode] | None:
    """Ray's nodes, or None while its state API does not answer yet (not answering is expected)."""
    res = r.cluster.head.run(ray_members.state_api_command(r.inv), timeout=10, warn=True)
    return ray_members.nodes_from_state_api(res.stdout) if res.ok else None


def wait_head(r: UpRun, spec: ContainerSpec) -> None:
    def answered() -> bool | None:
        err = container_failed(r, spec)
        if err:
            raise err
        logs = r.cluster.head.docker().api.logs(spec.name, tail=100).decode(errors="replace")
        if RAY_STARTED in logs:
            return True
        # the state API only once the line is overdue: a dashboard still starting can hold the
        # request for its whole 2 s bound, long after the runtime has said it started
        return True if time.monotonic() - began > RAY_STARTED_GRACE_S and membership(r) else None

    began = time.monotonic()

    if retry.poll(answered, timeout=RAY_HEAD_TIMEOUT_S, interval=POLL_S, what="the Ray head") is None:
        logs = r.cluster.head.docker().api.logs(spec.name, tail=15).decode(errors="replace")
        raise fail(
            STAGE,
            r.cluster.head.name,
            "Ray head",
            f"Ray did not answer within {RAY_HEAD_TIMEOUT_S:g}s",
            shlex.join(spec.command),
            redact.mask(logs),
        )


def wait_membership(r: UpRun) -> str:
    problems = ["no answer from Ray yet"]

    def formed() -> str | None:
        nonlocal problems
        for spec in r.plan.containers:
            err = container_failed(r, spec)
            if err:
                raise err
        nodes = membership(r)
        if nodes is not None:
            problems = ray_members.membership_problems(r.inv, nodes)
            if not problems:
                return f"{len(r.inv.nodes)} nodes, {r.inv.gpu_count} GPUs"
        return None

    got = retry.poll(formed, timeout=RAY_JOIN_TIMEOUT_S, interval=POLL_S, what="Ray membership")
    if got is None:
        raise fail(
            STAGE,
            r.inv.head.name,
            "wait for Ray membership",
            f"not formed within {RAY_JOIN_TIMEOUT_S:g}s: {'; '.join(problems)}",
            fix="check the control link between the nodes (sparkcluster doctor), then sparkcluster up",
        )
    return got
