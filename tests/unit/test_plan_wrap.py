"""The dry run reads at about 100 columns: a step's command (a `docker run` of thousands of
characters, the supervisor's `vllm serve`) wraps at its spaces, its words kept whole, and `--json`
keeps each step's description in full."""

from __future__ import annotations

import json
import re
from pathlib import Path

from sparkcluster.cli.main import main
from sparkcluster.steps.base import PLAN_WIDTH, wrapped

REPO = Path(__file__).resolve().parents[2]


def _pair(tmp_path: Path) -> Path:
    text = (REPO / "README.md").read_text()
    pair = re.search(r"```toml\n(.*?)```", text.split("### A complete inventory: the pair", 1)[1], re.S).group(1)
    inv = tmp_path / "cluster.toml"
    inv.write_text(pair)
    return inv


def test_wrapped_keeps_every_word_and_masks_before_it_cuts():
    text = "docker run -d " + " ".join(f"-e NAME_{i}=value-{i}" for i in range(40)) + " image:tag"
    lines = wrapped(text, "      ")
    assert len(lines) > 1 and all(len(line) <= PLAN_WIDTH for line in lines)
    assert lines[0].startswith("      docker run") and all(line.startswith("        ") for line in lines[1:])
    assert " ".join(" ".join(lines).split()) == text
    long_word = "x" * 150
    assert wrapped(f"a {long_word} b", "  ") == ["  a", f"    {long_word}", "    b"]


def test_the_dry_run_wraps_at_100_columns_and_json_keeps_the_whole_command(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("HF_TOKEN", "hf_wraptesttoken0123456789")
    monkeypatch.setenv("VLLM_API_KEY", "wrap-test-key-0123456789")
    inv = str(_pair(tmp_path))
    assert main(["-i", inv, "up", "--profile", "nemotron", "--dry-run", "--offline"]) == 0
    out = capsys.readouterr().out
    assert main(["-i", inv, "up", "--profile", "nemotron", "--dry-run", "--offline", "--json"]) == 0
    steps = json.loads(capsys.readouterr().out)
    longest = max(steps, key=lambda s: len(s["description"]))
    assert len(longest["description"]) > 1000  # the containers' start: the whole command, one string
    # every line fits, but for a single word longer than a line (a URL, a JSON value without spaces)
    title, *lines = out.splitlines()
    assert title.startswith("plan for profile 'nemotron' on cluster 'pair' (image ")
    too_long = [line for line in lines if len(line) > PLAN_WIDTH and " " in line.strip()]
    assert not too_long, too_long
    flat = " ".join(out.split())
    for s in steps:  # each step's command, wrapped, is still all there, word for word
        body = s["description"].split(": ", 1)[-1]
        assert " ".join(body.split()) in flat, s["id"]
    assert "hf_wraptesttoken0123456789" not in out and "wrap-test-key-0123456789" not in out
