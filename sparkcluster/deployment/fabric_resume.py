"""`sparkcluster fabric resume`'s plan: bring a deployment the fabric holds out of the gateway's
rotation back now, rather than after the profile's healthy looks. The head's supervisor holds a
serving deployment out when a data port goes down, its GID is lost, its speed drops or an AER storm
hits any of its nodes (node/fabric_watch); its engine keeps running the whole time (or is stopped,
where the profile chose `fabric_stop`). A step per deployment headed on the node leaves a mark in its
head container (contract.FABRIC_RESUME_PATH) that its supervisor reads at its next look: a hold older
than the mark ends there, journalled as `fabric resumed`. A fabric still unhealthy at that look is
held again at once: the mark ends a hold, it does not silence one."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from sparkcluster.config.inventory import Inventory
from sparkcluster.deployment.supervision import journals
from sparkcluster.errors import InputError
from sparkcluster.node.contract import FABRIC_RESUME_PATH
from sparkcluster.remote.dockerapi import run_in
from sparkcluster.remote.fanout import ConnectedHosts
from sparkcluster.steps import walk
from sparkcluster.steps.base import Step

STAGE = "fabric resume"
MARK_ARGV = ["sh", "-c", f"date +%s > {FABRIC_RESUME_PATH}"]


def resume_steps(api, node: str, containers: list[tuple[str, str]]) -> list[Step]:
    """One step per deployment headed on `node` (its container, its profile): the mark its supervisor
    reads, written through `api` (the node's Docker engine)."""

    def mark(container: str):
        return lambda r: run_in(api, container, MARK_ARGV).stdout

    return [
        Step(
            STAGE,
            node,
            f"mark-{profile or container}",
            f"mark the fabric hold of {profile or container} resumed (its supervisor ends it at its next look)",
            detail=f"docker exec {container} {shlex.join(MARK_ARGV)}",
            run=mark(container),
        )
        for container, profile in containers
    ]


@dataclass
class Resume:
    """The deployments headed on one node and a step for each; closes its connection on exit."""

    cluster: ConnectedHosts
    heads: list[tuple[str, str]]
    steps: list[Step]

    def walk(self) -> list[str]:
        """Every step walked: the deployments marked (their profiles, else their containers)."""
        walk.walk(walk.CommandRun(stage=STAGE), self.steps)
        return [p or c for c, p in self.heads]

    def __enter__(self) -> Resume:
        return self

    def __exit__(self, *exc) -> None:
        self.cluster.close()


def resume(inv: Inventory, node: str | None, profile: str | None) -> Resume:
    """Connect to the deployments' head node (the inventory's head unless `node`), find the
    deployments headed there (of `profile` alone when given) and plan a mark for each."""
    head = inv.node(node) if node else inv.head
    cluster = ConnectedHosts.connect(inv, [head])
    try:
        api = cluster.hosts[head.name].docker().api
        heads = journals(api, inv.cluster.name, head.name, profile)
        if not heads:
            raise InputError(
                f"no deployment{f' of profile {profile!r}' if profile else ''} is headed on {head.name}",
                "sparkcluster status",
            )
    except BaseException:
        cluster.close()
        raise
    return Resume(cluster, heads, resume_steps(api, head.name, heads))
