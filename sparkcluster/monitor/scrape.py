"""prometheus.yml, generated from the inventory and what runs: every node's agent (`/metrics` beside
its memory report, node/metrics), node_exporter on every node, each running deployment's vLLM
`/metrics` on its head, and the gateway where one runs. Pure: the caller found the deployments.

The gateway's `/metrics` takes a client key (gateway/app): its job carries `authorization` with
the key in a file of its own (GATEWAY_KEY_FILE, 0600 and Prometheus' own in its container, written
by `monitor up`: stack.specs), so prometheus.yml itself holds no secret and stays 0644.

Every target carries `cluster` and `node` labels (vLLM's also `deployment` and `profile`): the
rules (rules/) and the dashboards join on them. The file is JSON, which is YAML: no YAML library
in the controller, and Prometheus reads it as it reads any prometheus.yml."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from sparkcluster.config.inventory import Inventory
from sparkcluster.errors import InputError
from sparkcluster.labels import SERVICE_ROLE

RULES_DIR = "/etc/prometheus/rules"  # where stack.py puts rules/*.yml in the container
GATEWAY_KEY_FILE = "/etc/prometheus/gateway.key"  # the key Prometheus shows the gateway (stack.py writes it)
AGENT_JOB, NODE_EXPORTER_JOB, VLLM_JOB, GATEWAY_JOB = "sparkcluster-node", "node-exporter", "vllm", "gateway"


@dataclass(frozen=True)
class Served:
    """One running deployment's engine: its profile, node set and API port (its head serves it)."""

    profile: str
    nodes: tuple[str, ...]
    port: int
    slot: int = 0  # its slot on its nodes (issue 60): a later slot's agents report on its own port
    service: bool = False  # a service (issue 60): its agent is scraped, it has no vLLM /metrics

    @property
    def key(self) -> str:
        return f"{self.profile}@{'+'.join(self.nodes)}"


def served(inv: Inventory, found) -> list[Served]:
    """The running deployments (deployment/deployments) with their API ports (the profile's, else the
    inventory's when this controller has no such profile)."""
    from sparkcluster.config import profile as profiles  # the profiles' models only where a port is needed

    out = []
    for d in found:
        slot = getattr(d, "slot", 0)
        api = inv.at_slot(slot).cluster.api_port  # its own port block where it shares its nodes (issue 60)
        if getattr(d, "service", False):
            out.append(Served(d.profile, tuple(d.nodes), d.port or 0, slot, service=True))
            continue
        try:
            port = profiles.load_profile(d.profile).serve.port or api
        except InputError:
            port = api
        out.append(Served(d.profile, tuple(d.nodes), port, slot))
    return out


@dataclass(frozen=True)
class Target:
    job: str
    address: str
    labels: dict[str, str] = field(default_factory=dict)


def listen_ip(inv: Inventory, node: str) -> str:
    """Where a monitoring process on `node` listens: its control IP unless the owner chose an address."""
    s = inv.monitor.listen
    return str(inv.node(node).control_ip) if s == "control" else s


def reach_ip(inv: Inventory, node: str) -> str:
    """Where Prometheus reaches a monitoring process on `node` (0.0.0.0 listens on the control IP too)."""
    ip = listen_ip(inv, node)
    return str(inv.node(node).control_ip) if ip == "0.0.0.0" else ip


def targets(inv: Inventory, served: list[Served], gateways: dict[str, int] | None = None) -> list[Target]:
    """Every scrape target, in inventory order within each job."""
    base = {"cluster": inv.cluster.name}
    out = [
        Target(AGENT_JOB, f"{n.control_ip}:{inv.cluster.agent_port}", {**base, "node": n.name, "role": n.role})
        for n in inv.nodes
    ]
    if inv.monitor.node_exporter:
        out += [
            Target(
                NODE_EXPORTER_JOB, f"{reach_ip(inv, n.name)}:{inv.monitor.node_exporter_port}", {**base, "node": n.name}
            )
            for n in inv.nodes
        ]
    # a deployment in a later slot (issue 60) has agents of its own, on its own report port
    for s in served:
        if s.slot:
            port = inv.at_slot(s.slot).cluster.agent_port
            out += [
                Target(
                    AGENT_JOB,
                    f"{n.control_ip}:{port}",
                    {
                        **base,
                        "node": n.name,
                        "role": SERVICE_ROLE if s.service else n.role,
                        "deployment": s.key,
                        "slot": str(s.slot),
                    },
                )
                for n in inv.nodes
                if n.name in s.nodes
            ]
    for s in served:
        if s.service:  # its supervisor's series come from its agent, above; the service has no vLLM /metrics
            continue
        head = next((n for n in inv.nodes if n.name in s.nodes and n.role == "head"), None) or inv.node(s.nodes[0])
        labels = {**base, "node": head.name, "deployment": s.key, "profile": s.profile}
        # where the engine listens: loopback on a one-node cluster, Prometheus beside it (engines_listen)
        out.append(Target(VLLM_JOB, f"{inv.engine_address(head)}:{s.port}", labels))
    for node, port in sorted((gateways or {}).items()):
        out.append(Target(GATEWAY_JOB, f"{inv.node(node).control_ip}:{port}", {**base, "node": node}))
    return out


def prometheus_config(inv: Inventory, found: list[Target]) -> dict:
    m = inv.monitor
    interval = f"{m.scrape_interval_s:g}s"
    jobs: dict[str, list[Target]] = {}
    for t in found:
        jobs.setdefault(t.job, []).append(t)
    return {
        "global": {
            "scrape_interval": interval,
            # the rules see a sample as soon as it is scraped: a wedge waits at most one interval here
            "evaluation_interval": interval,
            "scrape_timeout": f"{min(m.scrape_interval_s, 5.0):g}s",
            "external_labels": {"cluster": inv.cluster.name},
        },
        "rule_files": [f"{RULES_DIR}/*.yml"],
        "alerting": {
            "alertmanagers": [
                {"static_configs": [{"targets": [f"{reach_ip(inv, inv.head.name)}:{m.alertmanager_port}"]}]}
            ]
        },
        "scrape_configs": [
            {
                "job_name": job,
                "metrics_path": "/metrics",
                **(
                    {"authorization": {"type": "Bearer", "credentials_file": GATEWAY_KEY_FILE}}
                    if job == GATEWAY_JOB
                    else {}
                ),
                "static_configs": [{"targets": [t.address], "labels": t.labels} for t in ts],
            }
            for job, ts in jobs.items()
        ],
    }


def render(doc: dict) -> str:
    return "# written by `sparkcluster monitor up` (JSON is YAML); regenerated on every monitor up\n" + json.dumps(
        doc, indent=2
    )
