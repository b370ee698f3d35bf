"""sparkcluster's Grafana dashboards, written as code and shipped as JSON (grafana/dashboards/), with
the provisioning files that load them (grafana/provisioning/): a serving dashboard (per deployment:
tok/s, TTFT, ITL and end-to-end percentiles, queue, KV cache, preemptions, prefix-cache hits,
spec-decode acceptance) and a Spark-cluster dashboard (per node: UMA MemAvailable and headroom,
GPU power, clock and temperature, RDMA throughput, the supervisor's state, restarts and probes, the
fabric's last figures, disk; the serving figures per deployment beside them; supervisor restarts as
annotations). Grafana itself is not part of sparkcluster: owners point theirs at the Prometheus
`monitor up` starts (README, "Monitoring"); vLLM's upstream dashboards can be imported beside these.

Why code: every panel's query is a string a test can parse with promtool and check against the
series that exist (vLLM 0.32's, node_exporter's, node/metrics'), and the JSON cannot drift from it
(a test regenerates it). Grafana 10.4 or later reads this schema."""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).parent / "grafana"
DS = {"type": "prometheus", "uid": "${datasource}"}
C = 'cluster="$cluster"'
DEP = f'{C}, deployment=~"$deployment"'
NODE = f'{C}, node=~"$node"'
RI = "$__rate_interval"


def _variables(with_node: bool, with_deployment: bool) -> list[dict]:
    out = [
        {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
        {
            "name": "cluster",
            "type": "query",
            "datasource": DS,
            "query": {"query": "label_values(sparkcluster_node_info, cluster)", "refId": "cluster"},
            "refresh": 2,
        },
    ]
    if with_deployment:
        out.append(
            {
                "name": "deployment",
                "type": "query",
                "datasource": DS,
                "query": {"query": f"label_values(vllm:num_requests_running{{{C}}}, deployment)", "refId": "dep"},
                "refresh": 2,
                "multi": True,
                "includeAll": True,
                "allValue": ".*",
            }
        )
    if with_node:
        out.append(
            {
                "name": "node",
                "type": "query",
                "datasource": DS,
                "query": {"query": f"label_values(sparkcluster_node_info{{{C}}}, node)", "refId": "node"},
                "refresh": 2,
                "multi": True,
                "includeAll": True,
                "allValue": ".*",
            }
        )
    return out


class _Layout:
    """Panels placed left to right, three to a row of Grafana's 24-column grid."""

    def __init__(self):
        self.panels: list[dict] = []
        self.x = self.y = 0

    def row(self, title: str) -> None:
        if self.x:
            self.x, self.y = 0, self.y + 8
        self.panels.append(
            {
                "id": len(self.panels) + 1,
                "type": "row",
                "title": title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y},
                "panels": [],
            }
        )
        self.y += 1

    def add(self, title: str, targets: list[tuple[str, str]], unit: str = "short", kind: str = "timeseries") -> None:
        self.panels.append(
            {
                "id": len(self.panels) + 1,
                "type": kind,
                "title": title,
                "datasource": DS,
                "gridPos": {"h": 8, "w": 8, "x": self.x, "y": self.y},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
                "targets": [
                    {"refId": chr(ord("A") + i), "datasource": DS, "expr": expr, "legendFormat": legend}
                    for i, (expr, legend) in enumerate(targets)
                ],
            }
        )
        self.x += 8
        if self.x >= 24:
            self.x, self.y = 0, self.y + 8


def _quantiles(metric: str, sel: str, by: str = "deployment") -> list[tuple[str, str]]:
    return [
        (
            f"histogram_quantile({q}, sum by (le, {by}) (rate({metric}_bucket{{{sel}}}[{RI}])))",
            f"p{int(q * 100)} {{{{{by}}}}}",
        )
        for q in (0.5, 0.95, 0.99)
    ]


def _ratio(num: str, den: str, sel: str) -> str:
    """rate of `num` over rate of `den`, per deployment."""
    rate = "sum by (deployment) (rate({}{{{}}}[{}]))"
    return f"{rate.format(num, sel, RI)} / {rate.format(den, sel, RI)}"


def _serving_panels(lay: _Layout, sel: str) -> None:
    """The engine's figures per deployment (vLLM's own series, labelled by the scrape config)."""
    lay.add(
        "Tokens per second",
        [
            (f"sum by (deployment) (rate(vllm:generation_tokens_total{{{sel}}}[{RI}]))", "generated {{deployment}}"),
            (f"sum by (deployment) (rate(vllm:prompt_tokens_total{{{sel}}}[{RI}]))", "prompt {{deployment}}"),
        ],
        "tokens/s",
    )
    lay.add("Time to first token", _quantiles("vllm:time_to_first_token_seconds", sel), "s")
    lay.add("Inter-token latency", _quantiles("vllm:inter_token_latency_seconds", sel), "s")
    lay.add("End-to-end request latency", _quantiles("vllm:e2e_request_latency_seconds", sel), "s")
    lay.add(
        "Requests running and waiting",
        [
            (f"sum by (deployment) (vllm:num_requests_running{{{sel}}})", "running {{deployment}}"),
            (f"sum by (deployment) (vllm:num_requests_waiting{{{sel}}})", "waiting {{deployment}}"),
        ],
    )
    lay.add(
        "KV cache usage",
        [(f"max by (deployment) (vllm:kv_cache_usage_perc{{{sel}}})", "{{deployment}}")],
        "percentunit",
    )
    lay.add(
        "Preemptions per second",
        [(f"sum by (deployment) (rate(vllm:num_preemptions_total{{{sel}}}[{RI}]))", "{{deployment}}")],
        "ops",
    )
    lay.add(
        "Prefix cache hit rate",
        [(_ratio("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total", sel), "{{deployment}}")],
        "percentunit",
    )
    lay.add(
        "Speculative decoding: acceptance and mean accepted length",
        [
            (
                _ratio("vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_draft_tokens_total", sel),
                "acceptance {{deployment}}",
            ),
            (
                "1 + " + _ratio("vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_drafts_total", sel),
                "mean length {{deployment}}",
            ),
        ],
    )
    lay.add(
        "Requests finished per second",
        [
            (
                f"sum by (deployment, finished_reason) (rate(vllm:request_success_total{{{sel}}}[{RI}]))",
                "{{deployment}} {{finished_reason}}",
            )
        ],
        "reqps",
    )
    lay.add("Queue time", _quantiles("vllm:request_queue_time_seconds", sel), "s")


def _dashboard(uid: str, title: str, lay: _Layout, variables: list[dict], annotations: list[dict]) -> dict:
    return {
        "uid": uid,
        "title": title,
        "tags": ["sparkcluster"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": variables},
        "annotations": {"list": annotations},
        "panels": lay.panels,
    }


def _supervisor_state(lay: _Layout) -> None:
    """The supervisor's state over time, on the serving and the cluster dashboards alike."""
    lay.add(
        "Supervisor state",
        [(f"sparkcluster_supervisor_state{{{C}}} == 1", "{{node}}: {{state}}")],
        kind="state-timeline",
    )


def _restart_annotation(sel: str) -> dict:
    return {
        "name": "supervisor restarts",
        "datasource": DS,
        "enable": True,
        "iconColor": "red",
        "expr": f"changes(sparkcluster_supervisor_restarts_total{{{sel}}}[1m]) > 0",
        "titleFormat": "restart on {{node}}",
        "step": "30s",
    }


def serving() -> dict:
    lay = _Layout()
    lay.row("Serving")
    _serving_panels(lay, DEP)
    lay.row("Supervisor")
    _supervisor_state(lay)
    lay.add(
        "One-token probe latency",
        [(f"sparkcluster_probe_duration_seconds{{{C}}}", "{{node}}")],
        "s",
    )
    lay.add(
        "Stall clock and its bound",
        [
            (f"sparkcluster_engine_stalled_seconds{{{C}}}", "stalled {{node}}"),
            (f"sparkcluster_engine_stall_bound_seconds{{{C}}}", "bound {{node}}"),
        ],
        "s",
    )
    return _dashboard(
        "sparkcluster-serving", "sparkcluster: serving", lay, _variables(False, True), [_restart_annotation(C)]
    )


def cluster() -> dict:
    lay = _Layout()
    lay.row("Memory (unified: CPU and GPU share it)")
    lay.add(
        "MemAvailable",
        [
            (f"sparkcluster_node_mem_available_bytes{{{NODE}}}", "{{node}} (agent)"),
            (f"node_memory_MemAvailable_bytes{{{NODE}}}", "{{node}} (node_exporter)"),
        ],
        "bytes",
    )
    lay.add(
        "Headroom above the profile's floor",
        [(f"sparkcluster_memory_headroom_bytes{{{C}}}", "{{peer}}")],
        "bytes",
    )
    lay.add(
        "Disk free",
        [
            (
                f"sparkcluster_node_disk_avail_bytes{{{NODE}}} / sparkcluster_node_disk_size_bytes{{{NODE}}}",
                "{{node}} {{path}}",
            )
        ],
        "percentunit",
    )
    lay.row("GPU (NVML; absent where NVML is)")
    lay.add("Power", [(f"sparkcluster_gpu_power_watts{{{NODE}}}", "{{node}} gpu{{gpu}}")], "watt")
    lay.add("SM clock (MHz)", [(f"sparkcluster_gpu_sm_clock_mhz{{{NODE}}}", "{{node}} gpu{{gpu}}")], "none")
    lay.add("Temperature", [(f"sparkcluster_gpu_temperature_celsius{{{NODE}}}", "{{node}} gpu{{gpu}}")], "celsius")
    lay.add(
        "ConnectX-7 and NVMe temperatures, and their warning thresholds",
        [
            (f"sparkcluster_device_temperature_celsius{{{NODE}}}", "{{node}} {{device}} {{sensor}}"),
            (f"sparkcluster_device_temperature_max_celsius{{{NODE}}}", "warning {{node}} {{device}} {{sensor}}"),
        ],
        "celsius",
    )
    lay.row("Fabric")
    lay.add(
        "RDMA throughput",
        [
            (
                f"sum by (node, device) (rate(node_infiniband_port_data_received_bytes_total{{{NODE}}}[{RI}]))",
                "rx {{node}} {{device}}",
            ),
            (
                f"sum by (node, device) (rate(node_infiniband_port_data_transmitted_bytes_total{{{NODE}}}[{RI}]))",
                "tx {{node}} {{device}}",
            ),
        ],
        "Bps",
    )
    lay.add(
        "Last fabric test: bus bandwidth and floor",
        [
            (f"sparkcluster_fabric_busbw_gbps{{{NODE}}}", "busbw {{node}}"),
            (f"sparkcluster_fabric_floor_gbps{{{NODE}}}", "floor {{node}}"),
        ],
    )
    lay.add(
        "Last fabric test: transport",
        [(f"sparkcluster_fabric_transport_info{{{NODE}}}", "{{node}}: {{transport}}")],
        kind="table",
    )
    lay.row("Supervisor and targets")
    _supervisor_state(lay)
    lay.add(
        "Restarts and verdicts",
        [
            (f"sparkcluster_supervisor_restarts{{{C}}}", "restarts in window {{node}}"),
            (f"sum by (node, kind) (increase(sparkcluster_supervisor_verdicts_total{{{C}}}[1h]))", "{{kind}} {{node}}"),
        ],
    )
    lay.add(
        "CPU per process (each rank's progress)",
        [(f"rate(sparkcluster_process_cpu_seconds_total{{{NODE}}}[{RI}])", "{{node}} {{process}} {{pid}}")],
        "percentunit",
    )
    lay.add(
        "Targets up",
        [(f"up{{{C}}}", "{{job}} {{node}}")],
        kind="state-timeline",
    )
    lay.row("Deployments")
    _serving_panels(lay, C)
    return _dashboard(
        "sparkcluster-cluster", "sparkcluster: Spark cluster", lay, _variables(True, False), [_restart_annotation(C)]
    )


def provisioning() -> dict[str, str]:
    """Grafana's provisioning files (YAML; JSON is YAML), by path under grafana/provisioning/."""
    datasource = {
        "apiVersion": 1,
        "datasources": [
            {"name": "sparkcluster", "type": "prometheus", "access": "proxy", "url": "http://HEAD_CONTROL_IP:9090"}
        ],
    }
    provider = {
        "apiVersion": 1,
        "providers": [
            {
                "name": "sparkcluster",
                "folder": "sparkcluster",
                "type": "file",
                "options": {"path": "/var/lib/grafana/dashboards/sparkcluster"},
            }
        ],
    }
    return {
        "datasources/sparkcluster.yml": json.dumps(datasource, indent=2) + "\n",
        "dashboards/sparkcluster.yml": json.dumps(provider, indent=2) + "\n",
    }


def files() -> dict[str, str]:
    """Every shipped file under grafana/, by relative path."""
    return {
        "dashboards/sparkcluster-serving.json": json.dumps(serving(), indent=2) + "\n",
        "dashboards/sparkcluster-cluster.json": json.dumps(cluster(), indent=2) + "\n",
        **{f"provisioning/{p}": t for p, t in provisioning().items()},
    }


def queries(dashboard: dict) -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target, template variable query and annotation."""
    out = [(f"{p['title']} {t['refId']}", t["expr"]) for p in dashboard["panels"] for t in p.get("targets", [])]
    out += [(f"annotation {a['name']}", a["expr"]) for a in dashboard["annotations"]["list"]]
    return out


def write(root: Path = HERE) -> None:
    """Regenerate the shipped files (`python -m sparkcluster.monitor.dashboards`)."""
    for rel, text in files().items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


if __name__ == "__main__":
    write()
