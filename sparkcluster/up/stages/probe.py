"""The probe: the variables each rank needs are in each container's own environment, as the
profile and the inventory say. `docker exec -e` would reach rank 0 only, so they must be there
from the container's start. And what each container got from its image's start-up (NGC's forward
compatibility, facts/image_nccl.judge_boot), read from its output since it started: an image whose
start-up refused ("compatibility mode is UNAVAILABLE") fails here, before `vllm serve`."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from sparkcluster.checks.runtime import env_verdict
from sparkcluster.config import profile as profiles
from sparkcluster.facts import image_nccl
from sparkcluster.remote import retry
from sparkcluster.remote.dockerapi import run_in
from sparkcluster.steps.base import Step, fail

if TYPE_CHECKING:
    from sparkcluster.up.execute import UpRun
    from sparkcluster.up.plan import Plan

STAGE = "probe"
BOOT_WAIT_S = 60.0  # the image's start-up before the agent's first line


def steps(plan: Plan) -> list[Step]:
    out = []
    for spec in plan.containers:
        out.append(
            Step(
                STAGE,
                spec.node,
                "env",
                "variables in the container",
                f"docker exec {spec.name} env",
                run=lambda r, spec=spec: check_env(r, spec.node, spec.name),
                parallel="probe",
            )
        )
        out.append(
            Step(
                STAGE,
                spec.node,
                "boot",
                "what the image's start-up gave the container",
                f"docker logs --since <its start> {spec.name}: the driver banner and the agent's "
                "_CUDA_COMPAT_STATUS, against the node's driver"
                + ("" if spec.image_entrypoint else " (entrypoint emptied: a vllm-openai image)"),
                run=lambda r, spec=spec: check_boot(r, spec.node, spec.name, spec.image_entrypoint),
                parallel="probe",
            )
        )
    return out


def summary(done: list[tuple[Step, object]]) -> str:
    counts = [v for s, v in done if s.action == "env"]
    boots = sorted({v for s, v in done if s.action == "boot"})
    return f"{sum(counts)} variables right on {len(counts)} nodes" + (
        f"; start-up: {', '.join(boots)}" if boots else ""
    )


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


def since_start(api, container: str) -> tuple[float, dict[str, str]]:
    """When the container last started (Docker keeps every start's output) and its configured
    environment (the image's and ours), from one inspect."""
    c = api.inspect_container(container)
    started = c["State"]["StartedAt"]  # RFC 3339 with nanoseconds: microseconds leave earlier starts out
    head, _, frac = started.rstrip("Z").partition(".")
    stamp = datetime.fromisoformat(head + (f".{frac[:6]}" if frac else "") + "+00:00")
    return stamp.timestamp(), dict(e.split("=", 1) for e in c["Config"].get("Env") or [] if "=" in e)


def check_boot(r: UpRun, node: str, container: str, image_entrypoint: bool) -> str:
    api = r.cluster.hosts[node].docker().api
    facts = r.plan.facts.get(node)
    driver = facts.gpus[0].driver if facts is not None and facts.gpus else ""
    started, env = since_start(api, container)

    def read() -> image_nccl.Boot:
        return image_nccl.read_boot(
            api.logs(container, stdout=True, stderr=True, since=started).decode(errors="replace")
        )

    # the agent prints its line once the start-up has exec'd it: until then the banner may be half
    # written (NGC's refusal sleeps 2 s, its shinit_v2 costs seconds more); a container whose agent
    # never says is judged by what its start-up printed
    boot = (
        retry.poll(
            lambda: b if (b := read()).compat is not None else None,
            timeout=BOOT_WAIT_S,
            interval=0.5,
            what="the container's start-up",
        )
        or read()
    )
    v = image_nccl.judge_boot(boot, env, driver, image_entrypoint)
    if v.status == "fail":
        raise fail(
            STAGE,
            node,
            "what the image's start-up gave the container",
            v.detail,
            f"docker logs {container}",
            boot.banner,
            v.fix,
        )
    if v.status == "warn":
        r.progress.info(f"warning: the start-up on {node}: {v.detail}" + (f" (fix: {v.fix})" if v.fix else ""))
    return v.case
