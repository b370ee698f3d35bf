"""The engine's rendezvous between the nodes (issue 28). With executor "mp" (vLLM's own multi-node
launch) it takes the place of Ray's membership and node-IP checks; its interface half holds for Ray's
ranks too (their torch.distributed group meets over the same gloo/NCCL sockets).

Every node's `vllm serve` gets `--master-addr` = the head's control IP and `--master-port` =
the inventory's `master_port` (free on the head: `ports.free`). torch.distributed's gloo and NCCL pick
their interface from the host name unless told (shared/real-vllm-cpu.md: a host name resolving to
127.0.0.1 gives `Gloo connectFullMesh failed ... remote=[127.0.0.1]`), so `GLOO_SOCKET_IFNAME` and
`NCCL_SOCKET_IFNAME` must name the control interface on every node; a loopback master address makes
every worker wait on itself (sparkrun#249).
"""

from __future__ import annotations

import ipaddress

from sparkcluster.checks.registry import Context, Report, check

IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def master_problem(address: str) -> str:
    """Why `address` cannot be the rendezvous every node reaches ("" when it can)."""
    ip = ipaddress.ip_address(address)
    if ip.is_loopback:
        return f"the master address {address} is loopback: every other node would wait on itself (sparkrun#249)"
    if ip.is_unspecified:
        return f"the master address {address} is no address a node can reach"
    return ""


@check(
    "net.rendezvous", "The ranks' rendezvous: the head's control IP, not loopback; gloo/NCCL on the control interface"
)
def net_rendezvous(ctx: Context, r: Report) -> None:
    mp = ctx.expect.executor == "mp"
    head = ctx.inventory.head
    master = str(head.control_ip)
    why = master_problem(master)
    port = ctx.inventory.cluster.master_port
    for node in ctx.nodes():
        if why:
            r.fail(
                node.name,
                why,
                f"set {head.name}'s control_ip in the inventory to its address on {head.control_if} "
                "(sparkcluster init finds it), then sparkcluster up",
            )
            continue
        planned = ctx.expect.per_host_env.get(node.name, {})
        running = [c.env for c in ctx.ours(node.name) if c.running]
        bad = []
        for var in IFNAME_VARS:
            for where, env in (("the profile", planned), *(("the running container", e) for e in running)):
                if env and env.get(var) != node.control_if:
                    bad.append(
                        f"{var} is {env.get(var) or 'unset'} in {where}, not the control interface {node.control_if}"
                    )
        if bad:
            r.fail(
                node.name,
                "; ".join(sorted(set(bad))),
                "these are set per node by sparkcluster: remove them from the profile's forwarded variables, "
                "then `sparkcluster down && sparkcluster up`",
            )
        else:
            r.ok(
                node.name,
                (f"--master-addr {master} --master-port {port}, " if mp else "") + f"gloo/NCCL on {node.control_if}",
            )
