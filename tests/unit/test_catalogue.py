"""The benchmark guide's catalogue table (docs/guides/benchmark.md) is generated from the shipped performance records (bench/catalogue): it
says what the records say, nothing else, and a record added without regenerating it fails here."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkcluster.bench import catalogue, perf_record

PAGE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "benchmark.md"


def test_the_readme_table_is_the_one_the_shipped_records_make():
    text = PAGE.read_text()
    got = catalogue.in_text(text)
    assert got is not None, "docs/guides/benchmark.md lacks the catalogue's markers"
    assert got == catalogue.block(catalogue.shipped()), (
        "docs/guides/benchmark.md's catalogue differs from the shipped env-profiles/*.perf.toml: "
        "run python -m sparkcluster.bench.catalogue --write docs/guides/benchmark.md (or make docs)"
    )


def test_every_shipped_record_is_a_row_and_a_dozen_are_published():
    records = catalogue.shipped()
    table = catalogue.table(records)
    assert all(f"| `{name}` |" in table for name, _ in records)
    published = [r for _, r in records if r.kind == "published"]
    assert len(published) >= 12 and all(r.source.url in table for r in published)
    rows = table.splitlines()[2:]
    nodes = [int(r.split(" | ")[2]) for r in rows]
    assert nodes == sorted(nodes, reverse=True)
    assert not [n for n, _ in records if n.startswith("testbed")]  # the testbed's profiles do not ship


def test_a_measured_record_follows_every_published_one():
    from tests.testbed import PROFILES as TESTBED_PROFILES

    records = catalogue.shipped() + catalogue.shipped(TESTBED_PROFILES)
    rows = catalogue.table(records).splitlines()[2:]
    assert rows[-1].startswith("| `testbed` |") and len(rows) == len(records)


RECORD = """
kind = "published"
[source]
url = "https://github.com/NVIDIA/local-ai-inference-recipes/blob/abc/models/x/x-9b/dgx-spark-4gpu/linux/vllm/performance.yaml"
measured_at = 2026-10-01
publisher = "NVIDIA/local-ai-inference-recipes"
[hardware]
nodes = 4
gpus = 4
accelerator = "NVIDIA GB10"
[harness]
name = "aiperf"
version = "0.12.0"
[software]
model = "x/X-9B"
[[runs]]
id = "c1"
[runs.conditions]
input_tokens = 8192
output_tokens = 256
concurrency = 1
dataset = "nvidia/SPEED-Bench"
[runs.figures]
decode_tok_s = 64.0
prefill_tok_s = 3500.5
[[runs]]
id = "c8"
[runs.conditions]
input_tokens = 8192
output_tokens = 256
concurrency = 8
dataset = "nvidia/SPEED-Bench"
[runs.figures]
decode_tok_s = 13.5
"""


def test_a_made_up_record_makes_its_row():
    rec = perf_record.parse(RECORD)
    assert catalogue.figure(rec) == "decode 64 / prefill 3,500.50 tok/s (c1); decode 13.50 tok/s (c8)"
    assert catalogue.conditions(rec) == "8,192 in / 256 out, c1,8, nvidia/SPEED-Bench; aiperf 0.12.0"
    assert catalogue.source(rec).startswith("[x-9b/dgx-spark-4gpu](https://github.com/")
    row = catalogue.row("x9-tp4", rec)
    assert row.startswith("| `x9-tp4` | x/X-9B | 4 | decode 64") and "| 2026-10-01 |" in row


def test_the_block_is_spliced_between_its_markers_and_only_there(tmp_path):
    rec = perf_record.parse(RECORD)
    text = f"before\n{catalogue.BEGIN}\nold table\n{catalogue.END}\nafter\n"
    out = catalogue.splice(text, [("x9-tp4", rec)])
    assert out.startswith("before\n") and out.endswith("\nafter\n") and "old table" not in out
    assert catalogue.in_text(out) == catalogue.block([("x9-tp4", rec)])
    with pytest.raises(ValueError, match="markers are missing"):
        catalogue.splice("no markers here", [])
    readme = tmp_path / "README.md"
    readme.write_text(text)
    assert catalogue.main(["--write", str(readme)]) == 0
    assert catalogue.in_text(readme.read_text()) == catalogue.block(catalogue.shipped())
