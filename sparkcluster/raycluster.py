"""Ray membership as Ray itself reports it, read from inside the head container."""

from __future__ import annotations

import json
from dataclasses import dataclass

from .inventory import Inventory

# Runs inside the head container; prints one JSON line. Ray is only importable there.
MEMBERSHIP_SNIPPET = (
    "import json, ray\n"
    "ray.init(address='auto', logging_level='ERROR', log_to_driver=False)\n"
    "print('@@nodes ' + json.dumps([{'ip': n['NodeManagerAddress'], 'alive': n['Alive'], "
    "'gpus': n.get('Resources', {}).get('GPU', 0), 'host': n.get('NodeManagerHostname', '')} for n in ray.nodes()]))\n"
)


@dataclass(frozen=True)
class RayNode:
    ip: str
    alive: bool
    gpus: float
    host: str


def parse_membership(output: str) -> list[RayNode] | None:
    for line in output.splitlines():
        if line.startswith("@@nodes "):
            return [RayNode(d["ip"], bool(d["alive"]), float(d["gpus"]), d.get("host", ""))
                    for d in json.loads(line[len("@@nodes "):])]
    return None


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
        problems.append(f"Ray has node(s) at {', '.join(strangers)}, which is no inventory control IP "
                        "(a link-local, docker-bridge or LAN address registered instead)")
    return problems
