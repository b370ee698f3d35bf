"""Issue 38: the performance record (round trip, what it requires, every shipped record valid and its
profile lint-clean), a bench run written as a record with its provenance, yours against a record
(ratios, refusals, flags) and the cause ranking fed with facts."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from sparkcluster.bench import against, causes, measured, perf_record
from sparkcluster.config.lint import lint
from sparkcluster.config.profile import available, load_profile
from sparkcluster.errors import InputError
from tests.testbed import PROFILES as TESTBED_PROFILES

REPO = Path(__file__).resolve().parents[2]
PROFILES = REPO / "env-profiles"


def shipped_records() -> list[Path]:
    return sorted(PROFILES.glob("*" + perf_record.SUFFIX))


def records_of_the_testbed() -> list[Path]:
    """The testbed's record of its own runs, beside its profile (tests/testbed/profiles: not shipped)."""
    return sorted(TESTBED_PROFILES.glob("*" + perf_record.SUFFIX))


# ---- the format ------------------------------------------------------------------------------------


def test_at_least_twelve_spark_profiles_ship_a_published_record_on_one_and_two_nodes():
    published = [perf_record.load(p) for p in shipped_records() if perf_record.load(p).kind == "published"]
    assert len(published) >= 12
    assert {r.hardware.nodes for r in published} >= {1, 2}
    assert all(r.hardware.accelerator == "NVIDIA GB10" for r in published)


@pytest.mark.parametrize("path", shipped_records() + records_of_the_testbed(), ids=lambda p: p.name)
def test_every_shipped_record_is_valid_beside_a_lint_clean_profile_it_matches(path):
    rec = perf_record.load(path)
    name = path.name[: -len(perf_record.SUFFIX)]
    assert available().get(name) == path.with_name(f"{name}.toml"), f"{path.name} has no profile beside it"
    prof = load_profile(name)
    # lint-clean, but for its word on --privileged where the profile's source passes it too (the TP=2
    # recipes: container/conformance)
    sourced = prof.source is not None and prof.source.container.privileged and prof.privileged
    problems = [p for p in lint(prof) if not (sourced and p.rule == "container-rights" and p.severity == "warn")]
    assert problems == [], [p.line() for p in problems]
    # the record describes this profile: its model, its node count, its image where the source names one
    assert rec.software.model in (None, prof.model)
    assert prof.world_size == rec.hardware.gpus
    if rec.kind == "published":
        assert rec.source.url.startswith("https://") and rec.source.recipe_sha256
        assert rec.software.image == prof.image.ref
        assert rec.software.model_revision and rec.software.image_digest
        assert prof.image.vllm_version == rec.software.backend_version
    for run in rec.runs:
        assert run.figures.present()


def test_records_are_not_profiles():
    assert not [n for n in available() if n.endswith(".perf")]


def test_round_trip_keeps_every_field():
    for path in shipped_records():
        rec = perf_record.load(path)
        assert perf_record.parse(perf_record.dumps(rec)) == rec


def test_a_published_figure_is_kept_exactly():
    """The record of qwen36-27b-nvfp4-tp2 carries NVIDIA's performance.yaml figures as published."""
    rec = perf_record.load(PROFILES / "qwen36-27b-nvfp4-tp2.perf.toml")
    (run,) = rec.runs
    assert run.conditions.key == (8192, 256, 1) and run.conditions.dataset == "nvidia/SPEED-Bench"
    assert run.figures.decode_tok_s == 43.58 and run.figures.prefill_tok_s == 1806.92
    assert rec.harness.name == "aiperf" and rec.harness.version == "0.12.0"
    assert rec.source.measured_at == dt.date(2026, 8, 28) and rec.hardware.nodes == 2
    assert rec.software.driver == "580.159.03"


MINIMAL = """
kind = "published"
[source]
url = "https://example.org/perf"
measured_at = 2026-09-01
[hardware]
nodes = 2
gpus = 2
accelerator = "NVIDIA GB10"
[harness]
name = "llama-benchy"
version = "0.4.0"
[[runs]]
id = "c1"
[runs.conditions]
input_tokens = 2048
output_tokens = 128
concurrency = 1
dataset = "gutenberg"
[runs.figures]
decode_tok_s = 69.0
"""


def test_a_minimal_record_holds_only_what_is_required():
    rec = perf_record.parse(MINIMAL)
    assert rec.software == perf_record.Software() and rec.runs[0].figures.present() == {"decode_tok_s": 69.0}


@pytest.mark.parametrize(
    "edit, says",
    [
        (lambda t: t.replace('url = "https://example.org/perf"\n', ""), "source.url"),
        (lambda t: t.replace("measured_at = 2026-09-01\n", ""), "source.measured_at"),
        (lambda t: t.replace("nodes = 2\n", ""), "hardware.nodes"),
        (lambda t: t.replace('version = "0.4.0"\n', ""), "harness.version"),
        (lambda t: t.replace('name = "llama-benchy"', 'name = "my-script"'), "harness.name"),
        (lambda t: t.replace("concurrency = 1\n", ""), "concurrency"),
        (lambda t: t.replace("decode_tok_s = 69.0", ""), "at least one figure"),
        (lambda t: t.replace("https://example.org", "example.org"), "https://"),
        (lambda t: t + "\n[extra]\nx = 1\n", "extra"),
    ],
)
def test_a_record_missing_what_is_required_is_refused_naming_it(edit, says):
    with pytest.raises(InputError) as e:
        perf_record.parse(edit(MINIMAL), "x.perf.toml")
    assert says in " ".join(e.value.details) + e.value.message


def test_two_runs_at_the_same_conditions_are_refused():
    text = MINIMAL + MINIMAL[MINIMAL.index("[[runs]]") :].replace('id = "c1"', 'id = "c1b"')
    with pytest.raises(InputError) as e:
        perf_record.parse(text)
    assert "share their conditions" in " ".join(e.value.details)


# ---- a bench run as a record -------------------------------------------------------------------------


def row(c: int, tpot: float, ttft: float, out: float, n_in: int = 512, n_out: int = 128) -> dict:
    return {
        "concurrency": c,
        "num_prompts": 8,
        "input_len": n_in,
        "output_len": n_out,
        "completed": 8,
        "errors": 0,
        "tpot_mean_ms": tpot,
        "ttft_mean_ms": ttft,
        "output_tok_s": out,
        "ttft_p50_ms": ttft,
        "ttft_p99_ms": ttft * 1.5,
        "itl_p50_ms": tpot,
        "itl_p99_ms": tpot * 2,
        "e2el_mean_ms": ttft + tpot * (n_out - 1),
    }


PROV = measured.Provenance(
    cluster="pair",
    nodes={
        "spark-a": {"kernel": "6.17.0-1014-nvidia", "gpu": "NVIDIA GB10, 580.159.03"},
        "spark-b": {"kernel": "6.17.0-1014-nvidia", "gpu": "NVIDIA GB10, 580.159.03"},
    },
    image="vllm/vllm-openai:v0.28.0",
    image_ids={"spark-a": "sha256:" + "a" * 64, "spark-b": "sha256:" + "a" * 64},
    image_digest="sha256:" + "61fc8a896b0a4fbbbdc063bc4b0dbc25ce98e02b5050c24aeb7830ac02039b14",
    vllm_version="0.28.0",
    model="nvidia/Qwen3.6-27B-NVFP4",
    model_revision="0893e1606ff3d5f97a441f405d5fc541a6bdf404",
    profile="qwen36-27b-nvfp4-tp2",
    profile_hash="b" * 64,
    nccl_texts={"spark-a": "spark-a:1:1 [0] NCCL INFO NCCL version 2.28.9+cuda13.0\n"},
    nccl_transport={"spark-a": "NET/IB rocep1s0f1 GID 3"},
    gpus=2,
)


def build(rows: list[dict]) -> perf_record.PerfRecord:
    rec = measured.build(
        rows,
        PROV,
        harness_version="0.28.0",
        argv=["vllm", "bench", "serve"],
        measured_at=dt.date(2026, 11, 25),
        source="/state/bench/pair/20261125T100000Z",
    )
    assert rec is not None
    return rec


def test_a_bench_run_becomes_a_record_with_provenance_from_the_facts():
    rec = build([row(1, 25.0, 4000.0, 39.0, 8192, 256), row(4, 40.0, 6000.0, 95.0, 8192, 256)])
    assert rec.kind == "measured" and rec.harness.name == "vllm-bench-serve"
    assert rec.hardware.nodes == 2 and rec.hardware.accelerator == "NVIDIA GB10"
    sw = rec.software
    assert sw.driver == "580.159.03" and sw.kernel == "6.17.0-1014-nvidia" and sw.nccl == "2.28.9"
    assert sw.nccl_transport == {"spark-a": "NET/IB rocep1s0f1 GID 3"} and sw.profile_hash == "b" * 64
    c1 = rec.run_at((8192, 256, 1))
    assert c1.figures.decode_tok_s == pytest.approx(40.0) and c1.figures.prefill_tok_s == pytest.approx(2048.0)
    assert perf_record.parse(perf_record.dumps(rec)) == rec


def test_repeated_levels_are_one_run_with_their_count_and_spread():
    rec = build([row(1, 20.0, 100.0, 48.0), row(1, 25.0, 100.0, 39.0)])
    (run,) = rec.runs
    assert run.repetitions == 2
    assert run.figures.decode_tok_s == pytest.approx(45.0)
    assert run.spread_pct["decode_tok_s"] == pytest.approx(15.71, abs=0.01)


def test_a_run_that_measured_nothing_is_no_record():
    dead = dict(row(1, 20.0, 100.0, 48.0), completed=0)
    assert measured.build([dead], PROV, harness_version="x", argv=[], measured_at=dt.date.today(), source="x") is None


# ---- yours against a record -------------------------------------------------------------------------

QWEN_TP2 = PROFILES / "qwen36-27b-nvfp4-tp2.perf.toml"


def test_a_run_at_the_records_conditions_is_a_ratio_per_figure_flagged_across_harnesses():
    ours = build([row(1, 1000 / 40.0, 8192 * 1000 / 1900.0, 39.0, 8192, 256)])
    st = against.against(ours, perf_record.load(QWEN_TP2), tolerance_pct=10)
    got = {r.figure: r for r in st.ratios}
    assert got["decode_tok_s"].ratio == pytest.approx(40.0 / 43.58) and not got["decode_tok_s"].short
    assert got["prefill_tok_s"].ratio == pytest.approx(1900.0 / 1806.92)
    assert st.verdict == "ok" and not st.refused
    assert any(f.startswith("harness: the record used aiperf 0.12.0") for f in st.flags)
    assert any("nvidia/SPEED-Bench" in f for f in st.flags)


def test_a_run_well_below_the_record_is_short():
    ours = build([row(1, 1000 / 12.0, 8192 * 1000 / 1800.0, 11.0, 8192, 256)])
    st = against.against(ours, perf_record.load(QWEN_TP2))
    assert st.verdict == "short" and st.worst.figure == "decode_tok_s"
    assert st.worst.ratio == pytest.approx(12.0 / 43.58)


def test_other_conditions_are_refused_with_the_options_that_measure_them():
    ours = build([row(1, 25.0, 100.0, 39.0)])  # 512 in / 128 out
    st = against.against(ours, perf_record.load(QWEN_TP2))
    assert st.verdict == "refused" and not st.ratios
    assert "--input-len 8192 --output-len 256 --concurrency 1" in st.refused[0]


def test_another_model_or_node_count_is_refused_whole():
    ours = build([row(1, 25.0, 4000.0, 39.0, 8192, 256)])
    other = perf_record.load(PROFILES / "minimax-m27-nvfp4-tp2.perf.toml")
    assert "another model" in against.against(ours, other).refused[0]
    single = perf_record.load(PROFILES / "qwen36-27b-nvfp4-single.perf.toml")
    assert "1 node(s), this run on 2" in against.against(ours, single).refused[0]


def test_latencies_are_inverted_so_below_one_is_worse():
    base = build([row(1, 20.0, 100.0, 48.0)])
    slow = build([row(1, 40.0, 100.0, 24.0)])
    st = against.against(slow, base)
    itl = next(r for r in st.ratios if r.figure == "itl_ms_p50")
    assert itl.ratio == pytest.approx(0.5) and itl.short and not st.flags


# ---- causes ------------------------------------------------------------------------------------------


def healthy(**over) -> causes.ClusterView:
    nodes = (
        causes.NodeView(
            "spark-a",
            kernel="6.17.0-1014-nvidia",
            driver="580.159.03",
            mtu_expected=9000,
            mtus={"enp1s0f1np1": 9000, "enP2p1s0f1np1": 9000},
            hcas=("rocep1s0f1", "roceP2p1s0f1"),
            nccl_transport="NET/IB rocep1s0f1,roceP2p1s0f1 GID 3",
        ),
        causes.NodeView(
            "spark-b",
            kernel="6.17.0-1014-nvidia",
            driver="580.159.03",
            mtu_expected=9000,
            mtus={"enp1s0f1np1": 9000, "enP2p1s0f1np1": 9000},
            hcas=("rocep1s0f1", "roceP2p1s0f1"),
            nccl_transport="NET/IB rocep1s0f1,roceP2p1s0f1 GID 3",
            rtt_ms=0.04,
        ),
    )
    view = causes.ClusterView(
        nodes=nodes,
        roce=True,
        image="vllm/vllm-openai:v0.28.0",
        image_digests=("sha256:61fc8a896b0a4fbbbdc063bc4b0dbc25ce98e02b5050c24aeb7830ac02039b14",),
        vllm_version="0.28.0",
        model_revision="0893e1606ff3d5f97a441f405d5fc541a6bdf404",
    )
    return _replace(view, **over)


def _replace(view: causes.ClusterView, node: str | None = None, **over) -> causes.ClusterView:
    import dataclasses

    node_over = {k[5:]: v for k, v in over.items() if k.startswith("node_")}
    rest = {k: v for k, v in over.items() if not k.startswith("node_")}
    nodes = tuple(dataclasses.replace(n, **node_over) if n.name == node else n for n in view.nodes)
    return dataclasses.replace(view, nodes=nodes, **rest)


QWEN = perf_record.load(QWEN_TP2)


def test_a_healthy_cluster_at_the_records_stack_has_no_cause():
    assert causes.rank(healthy(), QWEN) == []


@pytest.mark.parametrize(
    "over, area, node",
    [
        (dict(node="spark-b", node_nccl_transport="NET/Socket enp1s0f1np1"), "fabric", "spark-b"),
        (dict(node="spark-b", node_rtt_ms=40.2), "fabric", "spark-b"),
        (dict(node="spark-b", node_rtt_error="100% packet loss"), "fabric", "spark-b"),
        (dict(node="spark-b", node_rtt_loaded_ms=80.0), "fabric", "spark-b"),
        (dict(fabric_busbw_gbps=4.1, fabric_floor_gbps=11.85), "fabric", None),
        (dict(node="spark-a", node_mtus={"enp1s0f1np1": 1500, "enP2p1s0f1np1": 9000}), "mtu", "spark-a"),
        (dict(node="spark-b", node_hcas=("rocep1s0f1",)), "twins", "spark-b"),
        (dict(image_digests=("sha256:" + "c" * 64,)), "image", None),
        (dict(vllm_version="0.26.1"), "vllm", None),
        (dict(node="spark-a", node_driver="580.95.05"), "driver", "spark-a"),
        (dict(model_revision="f" * 40), "model", None),
    ],
)
def test_each_fact_off_on_one_node_is_its_cause_there_only(over, area, node):
    got = causes.rank(healthy(**over), QWEN)
    assert [(c.area, c.node) for c in got] == [(area, node)], [c.line() for c in got]


def test_causes_are_ranked_by_the_stated_class_order_then_inventory_order():
    view = healthy(vllm_version="0.26.1", model_revision="f" * 40)
    view = _replace(view, node="spark-b", node_rtt_ms=40.0)
    view = _replace(view, node="spark-a", node_mtus={"enp1s0f1np1": 1500})
    view = _replace(view, node="spark-b", node_mtus={"enp1s0f1np1": 1500})
    got = [(c.area, c.node) for c in causes.rank(view, QWEN)]
    assert got == [("fabric", "spark-b"), ("mtu", "spark-a"), ("mtu", "spark-b"), ("vllm", None), ("model", None)]
    assert "40.00 ms" in causes.rank(view, QWEN)[0].says


def test_a_single_node_record_has_no_fabric_or_twins_cause():
    single = perf_record.load(PROFILES / "qwen36-27b-nvfp4-single.perf.toml")
    view = causes.ClusterView(nodes=(causes.NodeView("spark-a", hcas=("rocep1s0f1",), rtt_ms=50.0),), roce=False)
    assert causes.rank(view, single) == []


def test_without_a_registry_digest_the_image_is_judged_by_its_name():
    view = healthy(image_digests=(), image="vllm/vllm-openai:v0.24.0")
    (cause,) = causes.rank(view, QWEN)
    assert cause.area == "image" and "v0.24.0" in cause.says


def test_the_facts_bench_reads_parse_from_captured_output():
    from sparkcluster.bench.causes import parse_mtus
    from sparkcluster.bench.runner import parse_rtt

    captured = REPO / "tests" / "captured"
    assert 0 < parse_rtt((captured / "vm-ping-rtt-lo.txt").read_text()) < 1.0
    assert parse_rtt((captured / "vm-ping-rtt-noreply.txt").read_text()) is None
    assert parse_mtus("lo:65536,enp1s0f1np1:9000,enP2p1s0f1np1:1500,") == {
        "lo": 65536,
        "enp1s0f1np1": 9000,
        "enP2p1s0f1np1": 1500,
    }


def test_the_view_takes_only_the_deployments_data_plane_from_the_facts():
    from sparkcluster.config.inventory import parse as parse_inventory
    from tests.unit.test_cli_errors import inventory_toml

    inv = parse_inventory(inventory_toml())
    facts = {
        "spark-head": {"kernel": "6.17", "gpu": "NVIDIA GB10, 580.159.03", "mtus": "lo:65536,enp1s0f1np1:1500,"},
        "spark-worker": {"kernel": "6.17", "gpu": "NVIDIA GB10, 580.159.03", "mtus": "enp1s0f1np1:9000,"},
    }
    view = causes.view_from(
        inv,
        ["spark-head", "spark-worker"],
        facts,
        {"spark-worker": (0.05, "")},
        {},
        loaded_rtts={"spark-worker": (0.09, "")},
    )
    head, worker = view.nodes
    assert head.mtus == {"enp1s0f1np1": 1500} and head.driver == "580.159.03" and head.mtu_expected == 9000
    assert worker.rtt_ms == 0.05 and worker.rtt_loaded_ms == 0.09 and view.roce
    assert [(c.area, c.node) for c in causes.rank(view, QWEN)] == [
        ("mtu", "spark-head"),
        ("twins", "spark-head"),
        ("twins", "spark-worker"),
    ]


def test_a_p99_alone_falling_short_is_shown_but_does_not_decide():
    base = build([row(1, 20.0, 100.0, 48.0)])
    tail = build([dict(row(1, 20.0, 100.0, 48.0), ttft_p99_ms=600.0)])
    st = against.against(tail, base)
    p99 = next(r for r in st.ratios if r.figure == "ttft_ms_p99")
    assert p99.short and st.verdict == "ok" and st.worst.figure != "ttft_ms_p99"


def test_the_benchmark_guides_catalogue_shows_each_records_figures_exactly():
    import re

    rows = {}
    for line in (REPO / "docs" / "guides" / "benchmark.md").read_text().splitlines():
        # generated by bench/catalogue (test_catalogue); read here as a reader would, figure by figure
        m = re.match(
            r"\| `([a-z0-9.-]+)` \| [^|]+ \| (\d) \| decode ([\d.,]+) / prefill ([\d.,]+) tok/s \| [^|]+ \| ([\d-]+) \|",
            line,
        )
        if m:
            rows[m.group(1)] = m.groups()[1:]
    published = {
        p.name[: -len(perf_record.SUFFIX)]: perf_record.load(p)
        for p in shipped_records()
        if perf_record.load(p).kind == "published"
    }
    assert set(rows) == set(published)
    for name, (nodes, decode, prefill, date) in rows.items():
        rec = published[name]
        (run,) = rec.runs
        assert (int(nodes), date) == (rec.hardware.nodes, rec.source.measured_at.isoformat()), name
        assert float(decode.replace(",", "")) == run.figures.decode_tok_s, name
        assert float(prefill.replace(",", "")) == run.figures.prefill_tok_s, name


def test_a_figure_the_record_saw_spread_widely_is_judged_against_twice_its_spread():
    noisy = build([row(1, 20.0, 100.0, 48.0), row(1, 20.0, 100.0, 32.0)])  # output 40 +- 28%
    (run,) = noisy.runs
    assert run.spread_pct["output_tok_s"] == pytest.approx(28.28, abs=0.01)
    st = against.against(build([row(1, 20.0, 100.0, 30.0)]), noisy, tolerance_pct=10)
    out = next(r for r in st.ratios if r.figure == "output_tok_s")
    assert out.ratio == pytest.approx(0.75) and out.margin_pct == pytest.approx(56.57, abs=0.01) and not out.short
    steady = next(r for r in st.ratios if r.figure == "decode_tok_s")
    assert steady.margin_pct == 10 and not steady.short
