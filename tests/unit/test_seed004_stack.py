"""Seed 004's stack as docs/guides/stacks.md writes it (issue 60, item 6): its inventory parses,
each Spark's deployment plans offline (`up --dry-run --offline`) with the seed's port and today's
container names, a deployment beside it plans in a slot of its own, and the page's memory sums are
those of node/memory_fit.admit."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from sparkcluster.config import inventory
from sparkcluster.config import profile as profiles
from sparkcluster.node import memory_fit
from sparkcluster.up.plan import make_offline_plan

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "guides" / "stacks.md"
QWEN, GEMMA = "qwen36-35b-nvfp4-mtp", "gemma4-26b-fp8-mtp"
GB = 10**9


@pytest.fixture
def inv_path(tmp_path) -> Path:
    toml = re.search(r"```toml\n(.*?)```", PAGE.read_text(), re.S).group(1)
    p = tmp_path / "cluster.toml"
    p.write_text(toml)
    return p


def test_the_inventory_is_seed_004s_pair(inv_path):
    inv = inventory.load(inv_path)
    assert [n.name for n in inv.nodes] == ["spark-a", "spark-b"]
    assert inv.cluster.api_port == 8001  # seed 004: -p 8001:8000
    assert [n.memory_gb for n in inv.nodes] == [128, 128]


@pytest.mark.parametrize("profile,node", [(QWEN, "spark-a"), (GEMMA, "spark-b")])
def test_each_sparks_dry_run(inv_path, tmp_path, monkeypatch, profile, node):
    from sparkcluster.cli.main import cli

    env = tmp_path / ".env"
    env.write_text("")
    env.chmod(0o600)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    r = CliRunner().invoke(
        cli,
        ["--inventory", str(inv_path), "up", "--profile", profile, "--node", node, "--dry-run", "--offline"],
        env={"SPARKCLUSTER_ENV_FILE": str(env)},
    )
    assert r.exit_code == 0, r.output
    assert "sparkcluster-seed004-head" in r.output and "--port 8001" in r.output, r.output
    assert "-d1-" not in r.output  # the first deployment on a node: the names of before


def test_a_deployment_beside_qwen_plans_in_its_own_slot(inv_path):
    inv = inventory.load(inv_path).only(["spark-a"]).at_slot(1)
    prof = profiles.load_profile(QWEN)
    plan = make_offline_plan(inv, prof)
    assert plan.serve.container == "sparkcluster-seed004-d1-head" and plan.serve.port == 8011
    assert [s.name for s in plan.containers] == ["sparkcluster-seed004-d1-head"]


def test_the_pages_memory_sums():
    """The page's arithmetic: the shipped profiles' fractions and seed 004's Nano sidecars (0.20 on
    Spark 1, 0.28 on Spark 2, from its "why we killed Nemotron-Nano" section) on a 128 GB Spark."""
    total, floor = 128 * GB, 6 * memory_fit.GiB
    qwen = profiles.load_profile(QWEN).serve.gpu_memory_utilization
    gemma = profiles.load_profile(GEMMA).serve.gpu_memory_utilization
    assert (qwen, gemma) == (0.55, 0.80)
    held = [memory_fit.Held("'qwen'", qwen)]
    assert memory_fit.admit(total, held, memory_fit.Held("'nano'", 0.20), floor) is None
    assert memory_fit.gb(int(qwen * total) + int(0.20 * total) + floor) == "102.4 GB"
    why = memory_fit.admit(total, [memory_fit.Held("'gemma'", gemma)], memory_fit.Held("'nano'", 0.28), floor)
    assert why and "'gemma' holds 102.4 GB" in why and "'nano' needs 35.8 GB" in why
    text = PAGE.read_text()
    assert "102.4 GB" in text and "35.8 GB" in text and "70.4 GB" in text
