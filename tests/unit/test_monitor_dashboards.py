"""The shipped Grafana dashboards (sparkcluster/monitor/dashboards, grafana/): the JSON is what the
code generates; every panel's, variable's and annotation's query parses under Debian's promtool
(as a recording rule: promtool checks expressions no other way offline); and every metric a query
names exists in vLLM 0.32's /metrics (tests/captured/vllm-0.32-metrics.txt), node_exporter 1.5's
(tests/captured/node-exporter-1.5-metrics-types.txt), node/metrics', or is one of the few named
below with their source (series an engine or host only has with a feature the captures lack)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from sparkcluster.monitor import dashboards
from sparkcluster.node import metrics

CAPTURED = Path(__file__).parents[1] / "captured"
# vLLM's speculative-decoding counters (vllm/v1/spec_decode/metrics.py, vllm-project/vllm): only an
# engine with a draft model or MTP has them; the testbed's profile has neither
SPEC_DECODE = {
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
}
# node_exporter's infiniband collector (collector/infiniband_linux.go): only a host with an HCA has them
INFINIBAND = {"node_infiniband_port_data_received_bytes_total", "node_infiniband_port_data_transmitted_bytes_total"}
# Prometheus' own series for every target
PROMETHEUS = {"up"}

FUNCTIONS_AND_WORDS = {
    "sum", "max", "min", "avg", "count", "rate", "increase", "changes", "histogram_quantile", "by", "without",
    "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "label_values", "le", "offset",
}  # fmt: skip


def _names_in(text: str) -> set[str]:
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            names.add(line.split()[2])
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{\s]", line, maxsplit=1)[0])
    return names


def known() -> set[str]:
    vllm = _names_in((CAPTURED / "vllm-0.32-metrics.txt").read_text())
    node_exporter = _names_in((CAPTURED / "node-exporter-1.5-metrics-types.txt").read_text())
    ours = set(metrics.NAMES)
    histograms = {f"{n}{s}" for n in vllm for s in ("_bucket", "_sum", "_count")}
    return vllm | histograms | node_exporter | ours | SPEC_DECODE | INFINIBAND | PROMETHEUS


def concrete(expr: str) -> str:
    """Grafana's variables replaced by values Prometheus accepts."""
    return (
        expr.replace("$__rate_interval", "1m")
        .replace('"$cluster"', '"c"')
        .replace("$deployment", ".*")
        .replace("$node", ".*")
    )


def metric_names(expr: str) -> set[str]:
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    e = re.sub(r"\{[^}]*\}", "", e)  # label matchers
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", e)  # label lists
    e = re.sub(r"\[[^\]]*\]", "", e)  # ranges
    found = set()
    for m in re.finditer(r"(?<![\w:.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", e):
        if m.group(2) or m.group(1) in FUNCTIONS_AND_WORDS:
            continue
        found.add(m.group(1))
    return found


ALL = [
    (d["uid"], where, expr)
    for d in (dashboards.serving(), dashboards.cluster())
    for where, expr in dashboards.queries(d)
]


def test_the_shipped_json_is_what_the_code_generates():
    for rel, text in dashboards.files().items():
        assert (dashboards.HERE / rel).read_text() == text, f"run python -m sparkcluster.monitor.dashboards ({rel})"
    for rel in ("dashboards/sparkcluster-serving.json", "dashboards/sparkcluster-cluster.json"):
        doc = json.loads((dashboards.HERE / rel).read_text())
        assert len({p["id"] for p in doc["panels"]}) == len(doc["panels"])


def test_the_dashboards_show_what_owners_look_for():
    titles = {p["title"] for p in dashboards.cluster()["panels"]}
    for want in (
        "Headroom above the profile's floor",
        "Power",
        "SM clock (MHz)",
        "RDMA throughput",
        "Supervisor state",
    ):
        assert want in titles
    serving = {p["title"] for p in dashboards.serving()["panels"]}
    for want in ("Tokens per second", "Time to first token", "Inter-token latency", "KV cache usage"):
        assert want in serving
    assert any("spec_decode" in e for _, _, e in ALL) and any("num_preemptions" in e for _, _, e in ALL)


def test_every_metric_a_query_names_exists():
    ok = known()
    missing = {(uid, where, n) for uid, where, e in ALL for n in metric_names(e) if n not in ok}
    assert not missing
    assert metric_names('sum by (le, x) (rate(vllm:time_to_first_token_seconds_bucket{a="b"}[1m]))') == {
        "vllm:time_to_first_token_seconds_bucket"
    }


def test_every_query_parses(tmp_path):
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not installed (Debian package prometheus)")
    rules = ["groups:", "  - name: dashboards", "    rules:"]
    for i, (_, _, expr) in enumerate(ALL):
        rules += [f"      - record: dashboard_query_{i}", f"        expr: {json.dumps(concrete(expr))}"]
    (tmp_path / "q.yml").write_text("\n".join(rules) + "\n")
    p = subprocess.run(
        ["promtool", "check", "rules", str(tmp_path / "q.yml")], capture_output=True, text=True, check=False
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"SUCCESS: {len(ALL)} rules found" in p.stdout


def test_every_metric_the_alert_rules_name_exists():
    text = (Path(dashboards.__file__).parent / "rules" / "sparkcluster.yml").read_text()
    exprs = re.findall(r"expr: (?:\|\n)?(.*?)\n\s+(?:for|labels):", text, re.DOTALL)
    assert len(exprs) == len(re.findall(r"- alert:", text))
    names = {n for e in exprs for n in metric_names(e.strip().strip("'"))} - {"humanize1024"}
    assert names and not names - known()


def test_monitor_dashboards_copies_the_installed_files_into_a_folder_of_yours(tmp_path, capsys):
    """An installed user has no source tree: `monitor dashboards --out DIR` writes the shipped
    dashboards and provisioning files there, byte for byte, lists them, and never overwrites."""
    from sparkcluster.cli.main import main

    out = tmp_path / "grafana"
    assert main(["monitor", "dashboards", "--out", str(out)]) == 0
    stdout, err = capsys.readouterr()
    written = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert written == sorted(dashboards.files())
    assert stdout.splitlines() == [str(out / rel) for rel in sorted(dashboards.files())]
    for rel in written:
        assert (out / rel).read_bytes() == (dashboards.HERE / rel).read_bytes()
    assert "HEAD_CONTROL_IP" in err and "provisioning/datasources/sparkcluster.yml" in err

    (out / "dashboards" / "sparkcluster-serving.json").write_text("{} ")  # an owner's edit
    assert main(["monitor", "dashboards", "--out", str(out)]) == 2
    stdout, err = capsys.readouterr()
    assert stdout == "" and "not overwritten" in err and "--out" in err
    assert (out / "dashboards" / "sparkcluster-serving.json").read_text() == "{} "
