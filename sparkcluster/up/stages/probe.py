"""The probe: the variables each rank needs are in each container's own environment, as the
profile and the inventory say. `docker exec -e` would reach rank 0 only, so they must be there
from the container's start."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sparkcluster.checks.runtime import env_verdict
from sparkcluster.config import profile as profiles
from sparkcluster.remote.dockerapi import run_in
from sparkcluster.steps.base import Step, fail

if TYPE_CHECKING:
    from sparkcluster.up.execute import UpRun
    from sparkcluster.up.plan import Plan

STAGE = "probe"


def steps(plan: Plan) -> list[Step]:
    return [
        Step(
            STAGE,
            spec.node,
            "env",
            "variables in the container",
            f"docker exec {spec.name} env",
            run=lambda r, spec=spec: check_env(r, spec.node, spec.name),
            parallel="probe",
        )
        for spec in plan.containers
    ]


def summary(done: list[tuple[Step, object]]) -> str:
    counts = [v for s, v in done if s.action == "env"]
    return f"{sum(counts)} variables right on {len(counts)} nodes"


def env_in_container(r: UpRun, node: str, container: str) -> dict[str, str]:
    """The variables the container's processes see, read with `docker exec env`."""
    # a failed exec (no such container, the engine refusing) fails the step as what it is: never
    # read as a container missing its variables
    api = r.cluster.hosts[node].docker().api
    for _ in range(2):
        out = run_in(api, container, ["env"]).stdout
        env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
        if env:
            return env
    # `env` always prints PATH and HOSTNAME: an empty answer is output lost on the way (seen on four
    # hosts under load), never a container without its variables
    raise fail(
        STAGE,
        node,
        "variables in the container",
        "`docker exec env` exited 0 twice and printed nothing",
        f"docker exec {container} env",
        out[-500:],
        "run sparkcluster up again; if it repeats, check the node's Docker engine (`docker exec CONTAINER env` there)",
    )


def check_env(r: UpRun, node: str, container: str) -> int:
    want = r.plan.profile.forwarded_env()
    per_host = profiles.per_host_env(r.plan.profile, r.inv, node)
    v = env_verdict(env_in_container(r, node, container), want, per_host)
    if not v.ok:
        raise fail(
            STAGE,
            node,
            "variables in the container",
            v.reason(),
            f"docker exec {container} env",
            "",
            "these must be in the container at its start on every node (docker exec -e reaches rank 0 "
            "only): sparkcluster down, then sparkcluster up recreates both containers",
        )
    return len(want) + len(per_host)
