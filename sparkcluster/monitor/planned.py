"""Planned work (`up`, `down`) as monitoring sees it, when `monitor up` runs on the head: the nodes
it touches are silenced in Alertmanager while it runs and GRACE_S after (what it stops and starts is
not news), and afterwards Prometheus is pointed at the deployments that run then (prometheus.yml
rewritten in its container, then SIGHUP, Prometheus' own reload). Where monitoring does not run,
nothing happens beyond one container listing on the head. A failure here is logged, never the
command's: monitoring never stands in the way of the work it watches."""

from __future__ import annotations

import time
from contextlib import contextmanager

from sparkcluster import log
from sparkcluster.config.inventory import Inventory
from sparkcluster.deployment import deployments, gateway_registry
from sparkcluster.monitor import alerting, scrape, stack
from sparkcluster.remote.fanout import ConnectedHosts

GRACE_S = 120.0  # after planned work: the longest `for` of the rules, a group wait, and margin
BOUND_S = 3600.0  # a planned run's silence ends by itself after this, were the run killed

_log = log.get(__name__)


def retarget(hosts: dict, inv: Inventory) -> None:
    """prometheus.yml made again from the deployments running now, and Prometheus told to reload."""
    found, _ = deployments.on(ConnectedHosts(inv, hosts), inv)
    gateways = gateway_registry.ports(hosts, inv.cluster.name)
    text = scrape.render(scrape.prometheus_config(inv, scrape.targets(inv, scrape.served(inv, found), gateways)))
    api = hosts[inv.head.name].docker().api
    name = stack.container(inv, stack.PROMETHEUS)
    api.put_archive(name, "/", stack.files_tar({stack.PROM_CONFIG: (text, 0o644)}, stack.NOBODY))
    api.kill(name, signal="SIGHUP")


@contextmanager
def planned(hosts: dict, inv: Inventory, nodes: list[str], why: str):
    """`hosts`: the connected hosts by name (the head among them, else nothing is done); `inv` the
    whole inventory; `nodes` those the work touches."""
    head = hosts.get(inv.head.name)
    silence, on = None, False
    try:
        if head is not None:
            api = head.docker().api
            on = stack.running(api, inv, stack.ALERTMANAGER)
            if on:
                argv = alerting.silence_argv(inv, nodes, why, time.time() + BOUND_S)
                res = stack.exec_in(api, inv, stack.ALERTMANAGER, argv)
                silence = res.stdout.strip().splitlines()[-1] if res.ok and res.stdout.strip() else None
                _log.info("planned work silenced", silence=silence, nodes=nodes, why=why)
    except Exception as e:  # noqa: BLE001 - see the module's docstring
        _log.warning("could not silence alerts for planned work", error=str(e))
    try:
        yield silence
    finally:
        if on:
            try:
                if silence:
                    end = time.time() + GRACE_S
                    stack.exec_in(head.docker().api, inv, stack.ALERTMANAGER, alerting.end_argv(inv, silence, end))
                if stack.running(head.docker().api, inv, stack.PROMETHEUS):
                    retarget(hosts, inv)
            except Exception as e:  # noqa: BLE001 - the silence ends by itself after BOUND_S
                _log.warning("monitoring not updated after planned work", silence=silence, error=str(e))
