"""Runtime checks: the Ray and API ports are free, no stale Ray is left, and the running
containers carry the forwarded and per-host variables and identical docker flags."""

from __future__ import annotations

from sparkcluster.checks.registry import Context, Report, check, inspect_env, is_running
from sparkcluster.labels import CLUSTER_LABEL


@check("ports.free", "Ray (or vLLM's rendezvous) and API ports free or ours")
def ports_free(ctx: Context, r: Report) -> None:
    c = ctx.inventory.cluster
    for node in ctx.nodes():
        # executor "mp": torch.distributed's rendezvous listens on the head only (issue 28)
        wanted = (
            ({c.master_port: "vLLM's mp rendezvous (master_port)"} if node.role == "head" else {})
            if ctx.expect.executor == "mp"
            else {c.ray_port: "Ray GCS"}
        )
        wanted[c.api_port] = "vLLM API"
        f = ctx.facts[node.name]
        ours = {c.get("Id", "") for c in ctx.ours(node.name)}
        ours_running = any(is_running(c) for c in ctx.ours(node.name))
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
        ours = {c.get("Id", "") for c in ctx.ours(node.name)}
        foreign = [
            c
            for c in f.containers
            if c.state == "running" and c.id not in ours and "ray start" in c.command and CLUSTER_LABEL not in c.labels
        ]
        exited = [c.get("Name", "").lstrip("/") for c in ctx.ours(node.name) if not is_running(c)]
        if foreign:
            r.fail(
                node.name,
                f"Ray runs in a container sparkcluster did not start: {', '.join(c.name for c in foreign)}",
                f"stop it if it is yours to stop (docker rm -f {foreign[0].name}); two Ray heads cannot share port 6379",
            )
        elif exited:
            r.warn(
                node.name,
                f"stopped sparkcluster container(s) left behind: {', '.join(exited)}",
                "sparkcluster down --purge-gcs",
            )
        elif f.ray_sessions and not any(is_running(c) for c in ctx.ours(node.name)):
            r.warn(
                node.name,
                f"{len(f.ray_sessions)} Ray session dir(s) in /tmp/ray with no Ray running",
                "sparkcluster down --purge-gcs removes them",
            )
        else:
            r.ok(node.name)


# --- running containers -------------------------------------------------------------------------


@check("containers.forwarded_env", "Forwarded variables present and equal in every container")
def containers_forwarded_env(ctx: Context, r: Report) -> None:
    want = ctx.expect.forwarded_env
    for node in ctx.nodes():
        running = [c for c in ctx.ours(node.name) if is_running(c)]
        if not running or not want:
            continue
        env = inspect_env(running[0])
        missing = [k for k in want if k not in env]
        wrong = [k for k in want if k in env and env[k] != want[k]]
        if missing or wrong:
            detail = "; ".join(
                x
                for x in (
                    f"missing {', '.join(missing)}" if missing else "",
                    f"different {', '.join(wrong)}" if wrong else "",
                )
                if x
            )
            r.fail(
                node.name,
                detail + " in the container (set at its start)",
                "these must be in every container at start; docker exec -e reaches rank 0 only: "
                "sparkcluster down && sparkcluster up",
            )
        else:
            r.ok(node.name, f"{len(want)} variables")


@check("containers.per_host_env", "Per-host variables right for each node")
def containers_per_host_env(ctx: Context, r: Report) -> None:
    for node in ctx.nodes():
        running = [c for c in ctx.ours(node.name) if is_running(c)]
        want = ctx.expect.per_host_env.get(node.name, {})
        if not running or not want:
            continue
        env = inspect_env(running[0])
        # VLLM_HOST_IP is judged by net.vllm_host_ip (with its own fix); not reported twice
        wrong = [
            f"{k}={env.get(k, '(unset)')} (want {v})"
            for k, v in want.items()
            if k != "VLLM_HOST_IP" and env.get(k) != v
        ]
        if wrong:
            r.fail(
                node.name,
                "; ".join(wrong),
                "per-host values come from the inventory; fix it, then sparkcluster down && sparkcluster up",
            )
        else:
            r.ok(node.name, f"{len(want)} variables")


FLAG_KEYS = (
    "Devices",
    "CapAdd",
    "Ulimits",
    "NetworkMode",
    "IpcMode",
    "ShmSize",
    "DeviceRequests",
    "Memory",
    "Privileged",
)


def container_flags(c: dict) -> dict[str, object]:
    hc = c.get("HostConfig", {}) or {}
    flags = {k: hc.get(k) for k in FLAG_KEYS}
    flags["Devices"] = sorted((d.get("PathOnHost"), d.get("PathInContainer")) for d in (flags["Devices"] or []))
    # the docker CLI stores --cap-add=IPC_LOCK as "CAP_IPC_LOCK", the Engine API as given: same flag
    flags["CapAdd"] = sorted(c.upper().removeprefix("CAP_") for c in (flags["CapAdd"] or []))
    flags["Ulimits"] = sorted((u.get("Name"), u.get("Soft"), u.get("Hard")) for u in (flags["Ulimits"] or []))
    flags["DeviceRequests"] = sorted(
        str(sorted((k, str(v)) for k, v in d.items())) for d in (flags["DeviceRequests"] or [])
    )
    return flags


@check("containers.flags", "Docker flags identical on every node")
def containers_flags(ctx: Context, r: Report) -> None:
    per_node = {}
    for node in ctx.nodes():
        running = [c for c in ctx.ours(node.name) if is_running(c)]
        if running:
            per_node[node.name] = container_flags(running[0])
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
