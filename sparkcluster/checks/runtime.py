"""Runtime checks: the Ray and API ports are free, no stale Ray is left, and the running
containers carry the forwarded and per-host variables and identical docker flags.

`env_verdict` is the one judgement of "the container has the right variables": these checks
apply it to what `docker inspect` says, the probe stage to what `docker exec env` prints in the
new containers, and the plan to decide whether the running containers can be kept."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sparkcluster.checks.registry import Context, Report, check
from sparkcluster.facts.parsers import FLAG_KEYS
from sparkcluster.labels import CLUSTER_LABEL, GATEWAY_ROLE, ROLE_LABEL, SERVER_ROLE, SERVICE_ROLE

# containers of ours that run no engine: a service's two (its own image, its supervisor) and the
# gateway carry none of the engines' flags or variables, so the engines' checks leave them out
NOT_ENGINES = (SERVICE_ROLE, SERVER_ROLE, GATEWAY_ROLE)


def engines_running(ctx: Context, node: str) -> list:
    """The node's running containers of ours that run an engine's rank (a head or a worker)."""
    return [c for c in ctx.ours(node) if c.running and c.labels.get(ROLE_LABEL) not in NOT_ENGINES]


@check("ports.free", "Ray (or vLLM's rendezvous) and API ports free or ours")
def ports_free(ctx: Context, r: Report) -> None:
    c = ctx.inventory.cluster
    for node in ctx.nodes():
        # executor "mp": torch.distributed's rendezvous listens on the head only (issue 28); "uni" (one
        # node, no Ray): neither
        wanted = (
            ({c.master_port: "vLLM's mp rendezvous (master_port)"} if node.role == "head" else {})
            if ctx.expect.executor == "mp"
            else {}
            if ctx.expect.executor == "uni"
            else {c.ray_port: "Ray GCS"}
        )
        wanted[c.api_port] = "vLLM API"
        f = ctx.facts[node.name]
        ours = {c.id for c in ctx.ours(node.name)}
        ours_running = any(c.running for c in ctx.ours(node.name))
        bad = []
        for ls in f.listeners:
            if ls.port not in wanted:
                continue
            if ls.container and ls.container in ours:
                continue
            if ls.pid is None and ours_running:
                # ss names a socket's process only to its owner or root: the SSH user (an ordinary
                # account) sees none for our containers' root processes on the host network
                continue
            who = (
                f"{ls.process} (pid {ls.pid})" if ls.pid else "a process of another account (ss names it only to root)"
            )
            where = f" in container {ls.container[:12]}" if ls.container else ""
            bad.append(f"{ls.port} ({wanted[ls.port]}) is held by {who}{where}")
        if bad:
            r.fail(
                node.name,
                "; ".join(sorted(set(bad))),
                "stop that process or container yourself (sparkcluster never kills what it did not start); "
                "a stale Ray head from an earlier run: sparkcluster down --purge-gcs",
            )
        else:
            r.ok(node.name, ", ".join(str(p) for p in wanted))


@check("ray.stale", "No stale Ray containers or sessions")
def ray_stale(ctx: Context, r: Report) -> None:
    for node in ctx.nodes():
        f = ctx.facts[node.name]
        ours = {c.id for c in ctx.ours(node.name)}
        foreign = [
            c
            for c in f.containers
            if c.state == "running" and c.id not in ours and "ray start" in c.command and CLUSTER_LABEL not in c.labels
        ]
        exited = [c.name for c in ctx.ours(node.name) if not c.running]
        if foreign:
            r.fail(
                node.name,
                f"Ray runs in a container sparkcluster did not start: {', '.join(c.name for c in foreign)}",
                f"stop it if it is yours to stop (docker rm -f {foreign[0].name}); "
                "two Ray heads cannot share port 6379",
            )
        elif exited:
            r.warn(
                node.name,
                f"stopped sparkcluster container(s) left behind: {', '.join(exited)}",
                "sparkcluster down --purge-gcs",
            )
        elif f.ray_sessions and not any(c.running for c in ctx.ours(node.name)):
            r.warn(
                node.name,
                f"{len(f.ray_sessions)} Ray session dir(s) in /tmp/ray with no Ray running",
                "sparkcluster down --purge-gcs removes them",
            )
        else:
            r.ok(node.name)


# --- running containers -------------------------------------------------------------------------


@dataclass(frozen=True)
class EnvVerdict:
    """What a container's environment lacks of what it must carry from its start: the names that
    must be equal everywhere and are missing or different, and the node's own values that are
    wrong (`NAME=got (want value)`)."""

    missing: tuple[str, ...] = ()
    different: tuple[str, ...] = ()
    per_host: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not (self.missing or self.different or self.per_host)

    def reason(self) -> str:
        return "; ".join(
            x
            for x in (
                f"missing {', '.join(self.missing)}" if self.missing else "",
                f"different {', '.join(self.different)}" if self.different else "",
                *self.per_host,
            )
            if x
        )


def env_verdict(
    env: Mapping[str, str], same: Mapping[str, str], per_host: Mapping[str, str] | None = None
) -> EnvVerdict:
    """`env` (a container's) against `same` (what every node's container carries alike) and
    `per_host` (this node's own values, from the inventory)."""
    return EnvVerdict(
        tuple(k for k in same if k not in env),
        tuple(k for k, v in same.items() if k in env and env[k] != v),
        tuple(f"{k}={env.get(k, '(unset)')} (want {v})" for k, v in (per_host or {}).items() if env.get(k) != v),
    )


@check("containers.forwarded_env", "Forwarded variables present and equal in every container")
def containers_forwarded_env(ctx: Context, r: Report) -> None:
    want = ctx.expect.forwarded_env
    for node in ctx.nodes():
        running = engines_running(ctx, node.name)
        if not running or not want:
            continue
        v = env_verdict(running[0].env, want)
        if not v.ok:
            r.fail(
                node.name,
                v.reason() + " in the container (set at its start)",
                "these must be in every container at start; docker exec -e reaches rank 0 only: "
                "sparkcluster down && sparkcluster up",
            )
        else:
            r.ok(node.name, f"{len(want)} variables")


@check("containers.per_host_env", "Per-host variables right for each node")
def containers_per_host_env(ctx: Context, r: Report) -> None:
    for node in ctx.nodes():
        running = engines_running(ctx, node.name)
        want = ctx.expect.per_host_env.get(node.name, {})
        if not running or not want:
            continue
        # VLLM_HOST_IP is judged by net.vllm_host_ip (with its own fix); not reported twice
        v = env_verdict(running[0].env, {}, {k: x for k, x in want.items() if k != "VLLM_HOST_IP"})
        if not v.ok:
            r.fail(
                node.name,
                v.reason(),
                "per-host values come from the inventory; fix it, then sparkcluster down && sparkcluster up",
            )
        else:
            r.ok(node.name, f"{len(want)} variables")


@check("containers.flags", "Docker flags identical on every node")
def containers_flags(ctx: Context, r: Report) -> None:
    per_node = {}
    for node in ctx.nodes():
        running = engines_running(ctx, node.name)
        if running:
            per_node[node.name] = running[0].flags
    if not per_node:
        return
    head = ctx.inventory.head.name
    ref = per_node.get(head) or next(iter(per_node.values()))
    want = ctx.expect.container_flags
    for n, flags in per_node.items():
        # a --memory cap is judged on each node by itself: one on the head must not fail the worker
        diff = [k for k in FLAG_KEYS if k != "Memory" and flags.get(k) != ref.get(k)]
        unexpected = [k for k, v in want.items() if flags.get(k) != v]
        if flags.get("Memory"):
            r.fail(
                n,
                f"the container has a --memory cap ({flags['Memory']} bytes)",
                "never cap memory on unified-memory Sparks: sparkcluster down && sparkcluster up",
            )
        elif diff or unexpected:
            keys = sorted(set(diff + unexpected))
            r.fail(
                n,
                f"{', '.join(keys)} differ from {head if diff else 'what the profile needs'}",
                "the worker once lacked --device/--cap-add/--ulimit and NCCL fell back to TCP silently: "
                "sparkcluster down && sparkcluster up recreates both with identical flags",
            )
        else:
            r.ok(n, "identical")
