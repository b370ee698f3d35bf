"""Ray membership as Ray itself reports it, read from inside the head container."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from sparkcluster.config.inventory import Inventory
from sparkcluster.node import readings
from sparkcluster.node.contract import DASHBOARD_PORT, state_api_url


def state_api_command(inv: Inventory | None = None) -> str:
    """Shell on the head host: the state API's answer. curl, never through an owner's proxy; Python
    only where the host has no curl (not after a curl that found nothing listening: every worker
    asks, and a Python start costs 50-100 ms there)."""
    port = inv.ray_ports().get("dashboard-port", DASHBOARD_PORT) if inv is not None else DASHBOARD_PORT
    url = shlex.quote(state_api_url(port))  # the deployment's own dashboard (issue 60: one per slot)
    return (
        f"if command -v curl >/dev/null; then curl -s --noproxy '*' -m 2 {url}; else python3 -c "
        "'import sys,urllib.request; urllib.request.install_opener(urllib.request.build_opener("
        "urllib.request.ProxyHandler({}))); "
        f"sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=2).read().decode())' {url}; fi"
    )


def parse_state_api(text: str) -> list[dict]:
    """Ray state API `/api/v0/nodes` rows (node/readings.py: the agent reads them the same way)."""
    return readings.ray_rows(text)


def nodes_from_state_api(text: str) -> list[RayNode] | None:
    """None when the API did not answer (dashboard not up yet), else Ray's nodes."""
    if not text.strip().startswith("{"):
        return None
    return [
        RayNode(
            r.get("node_ip", ""),
            r.get("state") == "ALIVE",
            float(r.get("resources_total", {}).get("GPU", 0)),
            r.get("node_name", ""),
        )
        for r in parse_state_api(text)
    ]


@dataclass(frozen=True)
class RayNode:
    ip: str
    alive: bool
    gpus: float
    host: str


def membership_problems(inv: Inventory, nodes: list[RayNode]) -> list[str]:
    """What differs between Ray's view and the inventory; empty when the cluster is as expected."""
    alive = [n for n in nodes if n.alive]
    want = {str(n.control_ip): n for n in inv.nodes}
    problems = []
    for ip, node in want.items():
        got = [n for n in alive if n.ip == ip]
        if not got:
            problems.append(f"{node.name} has not joined at {ip}")
        elif sum(n.gpus for n in got) != node.gpus:
            problems.append(f"{node.name} reports {sum(n.gpus for n in got):g} GPU(s), expected {node.gpus}")
    strangers = [n.ip for n in alive if n.ip not in want]
    if strangers:
        problems.append(
            f"Ray has node(s) at {', '.join(strangers)}, which is no inventory control IP "
            "(a link-local, docker-bridge or LAN address registered instead)"
        )
    return problems
