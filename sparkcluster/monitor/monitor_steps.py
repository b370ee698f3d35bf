"""`monitor up` and `monitor down` as steps: connect, read what runs (the deployments to scrape, the
monitoring containers there now), make one step per container to start or node to clean, each with
its run; `--dry-run` prints them and the command walks the same ones. A step that fails on one node
says so in its value and the others still run (what each node ended as is the command's report).
The CLI parses, loads the secrets and prints."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import docker.errors

from sparkcluster.config.inventory import Inventory
from sparkcluster.deployment import deployments, gateway_registry
from sparkcluster.errors import ConnectError, SparkError
from sparkcluster.remote.fanout import ConnectedHosts, connect_reachable
from sparkcluster.steps import walk
from sparkcluster.steps.base import Step
from sparkcluster.steps.walk import CommandRun

from . import alerting, scrape, stack

STAGE = "monitor"
FAILED = "failed: "  # a step's value when what it did failed on its node (the rest go on)


def configs(inv: Inventory, served: list, webhook: str | None, gateways: dict[str, int]) -> tuple[str, str]:
    """Prometheus' configuration and Alertmanager's, for the deployments served and the gateways."""
    prom = scrape.render(scrape.prometheus_config(inv, scrape.targets(inv, served, gateways)))
    am = alerting.render(alerting.alertmanager_config(inv, webhook))
    return prom, am


def _owners(cluster: ConnectedHosts) -> dict[str, str]:
    got = cluster.each(lambda h: h.run("echo $(id -u):$(id -g)").stdout.strip())
    return {n: o.value for n, o in got.items() if o.ok and o.value}


def _guarded(fn):
    """A step's run whose failure on its node is its value (`FAILED` + why), not the walk's end."""

    def run(r) -> Any:
        try:
            return fn(r)
        except (SparkError, docker.errors.APIError) as e:
            return FAILED + (e.message if isinstance(e, SparkError) else str(e))

    return run


@dataclass
class Monitor:
    """What `monitor up`/`down` read and the steps it makes; the connections, closed with it."""

    inventory: Inventory
    cluster: ConnectedHosts
    unreachable: dict[str, SparkError]
    steps: list[Step] = field(default_factory=list)
    specs: list[stack.Spec] = field(default_factory=list)  # up: the containers to start
    targets: list = field(default_factory=list)  # up: what Prometheus scrapes
    gateways: dict[str, int] = field(default_factory=dict)  # up: node -> gateway port
    unread: dict[str, str] = field(default_factory=dict)  # up: nodes whose deployments could not be read

    def walk(self) -> dict[str, Any]:
        """Every step walked: step id -> its value (what it did, or `FAILED` + why)."""
        done = walk.walk(CommandRun(stage=STAGE), self.steps)
        return {s.id: v for s, v in done}

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc) -> None:
        self.cluster.close()


def up(inv: Inventory, webhook: str | None, key: str | None) -> Monitor:
    """Connect and make `monitor up`'s steps: one per container, each replacing it with the
    configuration made from what runs now. The head out of reach is an error (exit 4)."""
    cluster, unreachable = connect_reachable(inv)
    if inv.head.name not in cluster.hosts:
        cluster.close()
        err = unreachable[inv.head.name]
        # a node out of reach is exit 4 (README, "Exit codes"), not bad input
        raise ConnectError(
            inv.head.name, f"the head does not answer: {err.message.removeprefix(inv.head.name + ': ')}", err.fix
        )
    m = Monitor(inv, cluster, unreachable)
    try:
        found, m.unread = deployments.on(cluster, inv)
        served = scrape.served(inv, found)
        m.gateways = gateway_registry.ports(cluster.hosts, inv.cluster.name)
        prom, am = configs(inv, served, webhook, m.gateways)
        m.specs = stack.specs(inv, prom, am, _owners(cluster), key)
        m.targets = scrape.targets(inv, served, m.gateways)
    except BaseException:
        cluster.close()
        raise
    for s in m.specs:
        if s.node not in cluster.hosts:
            continue  # reported as not reached
        m.steps.append(
            Step(
                STAGE,
                s.node,
                s.component,
                f"replace {s.name} and start it ({s.image}; its data volume stays)",
                s.describe(),
                run=_guarded(lambda r, s=s: stack.start(cluster.hosts[s.node].docker().api, inv, s)),
                parallel="start",
            )
        )
    return m


def down(inv: Inventory, purge_data: bool) -> Monitor:
    """Connect and make `monitor down`'s steps: one per node that runs monitoring containers (the
    head's data volumes too with `purge_data`)."""
    cluster, unreachable = connect_reachable(inv)
    m = Monitor(inv, cluster, unreachable)
    try:
        running = cluster.each(
            lambda h: [(c.get("Names") or ["?"])[0].lstrip("/") for c in stack.ours(h.docker().api, inv)]
        )
    except BaseException:
        cluster.close()
        raise
    for n in inv.nodes:
        o = running.get(n.name)
        if o is None:
            continue
        purge = purge_data and n.name == inv.head.name
        if o.ok and not o.value and not purge:
            continue  # nothing of monitoring's here
        what = "remove " + (", ".join(o.value) if o.ok and o.value else "the monitoring containers")
        if purge:
            what += ", then the data volumes " + ", ".join(
                stack.volume(inv, c) for c in (stack.PROMETHEUS, stack.ALERTMANAGER)
            )
        m.steps.append(
            Step(
                STAGE,
                n.name,
                "remove",
                what,
                run=_guarded(lambda r, n=n.name, purge=purge: stack.down(cluster.hosts[n].docker().api, inv, purge)),
                parallel="remove",
            )
        )
    return m
