"""sparkcluster's alert rules (sparkcluster/monitor/rules/) under Debian's `promtool` (package
prometheus, 2.42): they load, and tests/unit/data/monitor/rules_test.yml holds for each alert a case
that fires it (on the one node whose series are broken) and one that does not. Skips, saying so,
where promtool is not installed (tests/testbed/install-deps.sh installs it)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from sparkcluster import monitor

RULES = Path(monitor.__file__).parent / "rules"
CASES = Path(__file__).parent / "data" / "monitor" / "rules_test.yml"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (Debian package prometheus)")


def alert_names() -> list[str]:
    return [
        m for f in sorted(RULES.glob("*.yml")) for m in re.findall(r"^\s*- alert: (\S+)", f.read_text(), re.MULTILINE)
    ]


@needs_promtool
def test_the_rules_load():
    p = subprocess.run(
        [PROMTOOL, "check", "rules", *map(str, sorted(RULES.glob("*.yml")))],
        capture_output=True,
        text=True,
        check=False,
    )
    assert p.returncode == 0, p.stdout + p.stderr


@needs_promtool
def test_the_rules_fire_where_they_should_and_only_there():
    p = subprocess.run([PROMTOOL, "test", "rules", str(CASES)], capture_output=True, text=True, check=False)
    assert p.returncode == 0, p.stdout + p.stderr


def test_every_alert_has_a_case_that_fires_it_and_one_that_does_not():
    text = CASES.read_text()
    names = alert_names()
    assert len(names) == len(set(names)) >= 7
    for name in names:
        blocks = re.findall(
            rf"alertname: {name}\n\s+exp_alerts:(.*?)(?=\n\s+- eval_time|\n  - interval|\Z)", text, re.DOTALL
        )
        assert any("exp_labels" in b for b in blocks), f"no case fires {name}"
        assert any(b.strip().startswith("[]") for b in blocks), f"no case where {name} stays silent"


def test_the_stopped_alert_names_the_final_states_and_the_metric_every_state():
    """SparkServerStopped fires for exactly the states the supervisor never leaves by itself, and the
    agent exports one series for every state: the names are the enum's (node/contract.State), so a
    state renamed or added without the rule and the metric following fails here."""
    from sparkcluster.node import contract, metrics

    text = (RULES / "sparkcluster.yml").read_text()
    (expr,) = re.findall(r"- alert: SparkServerStopped\n\s+expr: '([^']*)'", text)
    (alternatives,) = re.findall(r'sparkcluster_supervisor_state\{state=~"([^"]*)"\}', expr)
    assert set(alternatives.split("|")) == {s.value for s in contract.State if s.final}
    assert set(metrics.STATES) == set(contract.State) and len(metrics.STATES) == len(contract.State)
    assert all(contract.State.of(s.value) is s for s in contract.State) and contract.State.of("gone") is None
