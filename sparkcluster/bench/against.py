"""Yours against a record: a measured run set beside a published record (or the cluster's own
baseline) at the same conditions, figure by figure, as a ratio. Pure.

What is compared, and what is not (never silently):
- Refused: another model, another node count (the whole record), and every run of the record whose
  conditions (prompt and answer lengths, concurrency) this run did not measure: each refusal says the
  `sparkcluster bench` options that measure them.
- Flagged: another harness (aiperf or llama-benchy against vLLM's bench: each defines prefill speed on its
  own prompts and TTFT), another harness version, another dataset (SPEED-Bench against random prompts),
  another accelerator. The ratios are still given, with the flags beside them.
- The ratio is yours over theirs for throughputs and theirs over yours for latencies, so below 1 is
  always worse; a figure is short when its ratio is under 1 - margin, the margin being the tolerance or,
  where the record measured the figure several times, twice its spread if that is wider (a noisy figure
  is not called short on noise). The p99 latencies are shown and
  marked but do not decide the verdict: a run of a few requests makes its 99th percentile one request.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from sparkcluster.bench.perf_record import THROUGHPUTS, PerfRecord

# shown, never deciding the verdict (see the module's docstring)
TAIL_FIGURES = frozenset({"ttft_ms_p99", "itl_ms_p99"})

HARNESS_NOTES = {
    frozenset({"aiperf", "vllm-bench-serve"}): "aiperf's prefill is prompt tokens over TTFT on its dataset's "
    "prompts; vLLM's bench here sends random prompts: decode speed (per request, after the first token) is "
    "defined alike",
    frozenset({"llama-benchy", "vllm-bench-serve"}): "llama-benchy's pp/tg figures time prompt processing and "
    "generation separately (tg with --exact-tg); vLLM's bench times whole requests",
}


@dataclass(frozen=True)
class Ratio:
    run: str  # the record's run id
    conditions: str
    concurrency: int
    figure: str
    ours: float
    theirs: float
    ratio: float
    short: bool
    margin_pct: float = 0.0  # what "short" was judged against (the tolerance, or twice the record's spread)


@dataclass
class Standing:
    source: str
    tolerance_pct: float
    ratios: list[Ratio] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        """short: some figure falls short; ok: every compared figure holds; refused: nothing comparable."""
        if not self.ratios:
            return "refused"
        return "short" if any(r.short for r in self.judged) else "ok"

    @property
    def judged(self) -> list[Ratio]:
        return [r for r in self.ratios if r.figure not in TAIL_FIGURES] or self.ratios

    @property
    def worst(self) -> Ratio | None:
        return min(self.judged, key=lambda r: r.ratio) if self.ratios else None

    def to_json(self) -> dict:
        return {
            "source": self.source,
            "verdict": self.verdict,
            "tolerance_pct": self.tolerance_pct,
            "ratios": [asdict(r) for r in self.ratios],
            "refused": self.refused,
            "flags": self.flags,
        }


def bench_options(key: tuple[int, int, int]) -> str:
    n_in, n_out, c = key
    return f"--input-len {n_in} --output-len {n_out} --concurrency {c}"


def against(ours: PerfRecord, theirs: PerfRecord, tolerance_pct: float = 10.0) -> Standing:
    st = Standing(theirs.source.url, tolerance_pct)
    m_ours, m_theirs = ours.software.model, theirs.software.model
    if m_ours and m_theirs and m_ours != m_theirs:
        st.refused.append(f"the record is of {m_theirs}, this run of {m_ours}: another model is not compared")
        return st
    if ours.hardware.nodes != theirs.hardware.nodes:
        st.refused.append(
            f"the record ran on {theirs.hardware.nodes} node(s), this run on {ours.hardware.nodes}: "
            "another node count is not compared"
        )
        return st
    h_ours, h_theirs = ours.harness, theirs.harness
    if h_ours.name != h_theirs.name:
        note = HARNESS_NOTES.get(frozenset({h_ours.name, h_theirs.name}), "the two harnesses define figures apart")
        st.flags.append(f"harness: the record used {h_theirs.name} {h_theirs.version}, this run {h_ours.name} ({note})")
    elif h_ours.version != h_theirs.version:
        st.flags.append(
            f"harness version: the record used {h_theirs.name} {h_theirs.version}, this run {h_ours.version}"
        )
    if ours.hardware.accelerator != theirs.hardware.accelerator:
        st.flags.append(
            f"accelerator: the record ran on {theirs.hardware.accelerator}, this run on {ours.hardware.accelerator}"
        )
    datasets: set[str] = set()
    for run in theirs.runs:
        key = run.conditions.key
        mine = ours.run_at(key)
        if mine is None:
            st.refused.append(
                f"not measured here: {run.conditions.describe()} (run {run.id}); "
                f"sparkcluster bench {bench_options(key)} measures it"
            )
            continue
        if mine.conditions.dataset != run.conditions.dataset:
            datasets.add(
                f"dataset: the record's prompts are {run.conditions.dataset}, this run's {mine.conditions.dataset}"
            )
        theirs_f, ours_f = run.figures.present(), mine.figures.present()
        for fig, t in theirs_f.items():
            o = ours_f.get(fig)
            if o is None:
                continue
            ratio = o / t if fig in THROUGHPUTS else t / o
            margin = max(tolerance_pct, 2.0 * run.spread_pct.get(fig, 0.0))
            st.ratios.append(
                Ratio(
                    run.id,
                    run.conditions.describe(),
                    run.conditions.concurrency,
                    fig,
                    o,
                    t,
                    ratio,
                    ratio < 1.0 - margin / 100.0,
                    margin,
                )
            )
    st.flags.extend(sorted(datasets))
    return st


def write_chart(path, st: Standing, title: str = "") -> str | None:
    """against.png: each compared figure, yours beside the record's, with the ratio above the pair.
    Returns why it was skipped, or None."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display on a controller over SSH
        import matplotlib.pyplot as plt
    except ImportError:
        return "no comparison chart: matplotlib is not installed (pip install 'sparkcluster[plot]')"
    if not st.ratios:
        return "no comparison chart: nothing was comparable"
    labels = [f"{r.figure}\nc{r.concurrency}" for r in st.ratios]
    xs = list(range(len(st.ratios)))
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(xs) + 2), 4.5))
    # each pair on its own scale: the record's figure is 1, yours is the ratio (below 1 is worse)
    ax.bar([x - 0.2 for x in xs], [1.0] * len(xs), width=0.4, label="record", color="tab:gray")
    colors = ["tab:red" if r.short else "tab:green" for r in st.ratios]
    ax.bar([x + 0.2 for x in xs], [r.ratio for r in st.ratios], width=0.4, label="yours", color=colors)
    for x, r in zip(xs, st.ratios, strict=True):
        ax.annotate(
            f"{r.ratio:.2f}\n({r.ours:.4g} / {r.theirs:.4g})", (x + 0.2, r.ratio), ha="center", va="bottom", fontsize=8
        )
    ax.axhline(1.0 - st.tolerance_pct / 100.0, color="tab:red", linestyle="--", linewidth=1, label="short below")
    ax.set_xticks(xs, labels, fontsize=8)
    ax.set_ylabel("yours / record (latencies inverted)")
    ax.legend(loc="upper right", fontsize=8)
    ax.set_ylim(0, max(1.3, max(r.ratio for r in st.ratios) * 1.25))
    ax.set_title(title or st.source, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
