"""Yours against a record: a measured run set beside a published record (or the cluster's own
baseline) at the same conditions, figure by figure, as a ratio. Pure.

What is compared, and what is not (never silently):
- Refused: another model, another node count (the whole record), and every run of the record whose
  conditions (prompt and answer lengths, concurrency) this run did not measure: each refusal says the
  `sparkcluster bench` options that measure them.
- Refused for a speculative-decoding profile (our record's software.speculative): the figures decode
  decides (prompts.DECODE_BOUND) of every run whose prompts differ from the record's, because draft
  acceptance follows the text (bench/prompts.py states the rule and its sources).
- Flagged: another harness (aiperf or llama-benchy against vLLM's bench: each defines prefill speed on its
  own prompts and TTFT), another harness version, another dataset (SPEED-Bench against random prompts),
  another accelerator, hosts of another memory size (issue 52: a 64 GB Spark's record beside a 128 GB
  one's run holds another KV cache, so is not like for like; the causes rank it, bench/causes.py). The
  ratios are still given, with the flags beside them.
- The ratio is yours over theirs for throughputs and theirs over yours for latencies, so below 1 is
  always worse; a figure is short when its ratio is under 1 - margin, the margin being the tolerance or,
  where the record measured the figure several times, twice its spread if that is wider (a noisy figure
  is not called short on noise). The p99 latencies are shown and
  marked but do not decide the verdict: a run of a few requests makes its 99th percentile one request.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from sparkcluster.bench import prompts, results
from sparkcluster.bench.perf_record import FIGURES, THROUGHPUTS, PerfRecord
from sparkcluster.node import memory_fit

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
    memory = memory_flag(ours, theirs)
    if memory:
        st.flags.append(memory)
    spec = ours.software.speculative
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
        other_prompts = prompts.said(mine.conditions) != prompts.said(run.conditions)
        if other_prompts:
            datasets.add(
                f"dataset: the record's prompts are {prompts.said(run.conditions)}, "
                f"this run's {prompts.said(mine.conditions)}"
            )
        refused = frozenset(prompts.DECODE_BOUND) if spec and other_prompts else frozenset()
        theirs_f, ours_f = run.figures.present(), mine.figures.present()
        if refused & theirs_f.keys() & ours_f.keys():
            st.refused.append(
                f"run {run.id}: " + prompts.refusal(spec, prompts.said(run.conditions), prompts.said(mine.conditions))
            )
        for fig, t in theirs_f.items():
            o = ours_f.get(fig)
            if o is None or fig in refused:
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


def memory_flag(ours: PerfRecord, theirs: PerfRecord) -> str:
    """The flag for hosts of another memory size (issue 52), "" where both are of one size or either
    record does not say (a record's "unknown" is never taken for a size)."""
    a, b = ours.hardware.memory_known, theirs.hardware.memory_known
    if a is None or b is None or memory_fit.same_size({"ours": a, "theirs": b}):
        return ""
    return (
        f"memory: the record's hosts have {b:g} GB, this run's {a:g} GB: another memory size holds another "
        "KV cache (fewer sequences before vLLM preempts), so this is not like for like; compare with a record "
        "of your hosts' size or a baseline of your own (--keep-baseline)"
    )


CSV_COLUMNS = ("run", "conditions", "concurrency", "figure", "yours", "record", "ratio", "short", "margin_pct")


def write_csv(path, st: Standing) -> None:
    """against.csv: one row per compared figure, beside against.json and against.png."""
    import csv

    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS)
        for r in st.ratios:
            w.writerow(
                [
                    r.run,
                    r.conditions,
                    r.concurrency,
                    r.figure,
                    r.ours,
                    r.theirs,
                    round(r.ratio, 4),
                    r.short,
                    r.margin_pct,
                ]
            )


@dataclass(frozen=True)
class Bar:
    """One pair of bars in a figure's panel: the record's figure and yours at one set of conditions."""

    label: str
    theirs: float
    ours: float
    ratio: float
    short: bool


def panels(st: Standing) -> dict[str, list[Bar]]:
    """Pure: what against.png draws, one panel per figure (in the record format's order), a pair of
    bars per compared conditions, in each figure's own unit."""
    out: dict[str, list[Bar]] = {}
    order = {f: i for i, f in enumerate(FIGURES)}
    for r in sorted(st.ratios, key=lambda r: (order.get(r.figure, len(order)), r.concurrency, r.conditions)):
        label = f"c{r.concurrency}\n{r.conditions.split(' at ')[0]}"
        out.setdefault(r.figure, []).append(Bar(label, r.theirs, r.ours, r.ratio, r.short))
    return out


def unit(figure: str) -> str:
    return "tok/s" if figure in THROUGHPUTS else "ms (lower is better)"


def write_chart(path, st: Standing, title: str = "", theirs: str = "record") -> str | None:
    """against.png: yours drawn beside the record's figures (a published one, or the baseline), one
    panel per figure in its own unit, the ratio above your bar (red where short). The same drawing
    path as bench's own chart (results.pyplot, results.save). Returns why it was skipped, or None."""
    plt = results.pyplot()
    if plt is None:
        return f"no comparison chart: {results.NO_MATPLOTLIB}"
    drawn = panels(st)
    if not drawn:
        return "no comparison chart: nothing was comparable"
    fig, axes = plt.subplots(1, len(drawn), figsize=(max(5.0, 3.4 * len(drawn)), 4.6), squeeze=False)
    for ax, (figure, bars) in zip(axes[0], drawn.items(), strict=True):
        xs = list(range(len(bars)))
        ax.bar([x - 0.2 for x in xs], [b.theirs for b in bars], width=0.4, label=theirs, color="tab:gray")
        colors = ["tab:red" if b.short else "tab:green" for b in bars]
        ax.bar([x + 0.2 for x in xs], [b.ours for b in bars], width=0.4, label="yours", color=colors)
        for x, b in zip(xs, bars, strict=True):
            ax.annotate(f"{b.ratio:.2f}x", (x + 0.2, b.ours), ha="center", va="bottom", fontsize=8)
        ax.set_xticks(xs, [b.label for b in bars], fontsize=7)
        ax.set_title(figure, fontsize=9)
        ax.set_ylabel(unit(figure), fontsize=8)
        ax.set_ylim(0, max(max(b.theirs, b.ours) for b in bars) * 1.2 or 1.0)
        ax.grid(True, axis="y", alpha=0.3)
    axes[0][0].legend(loc="lower left", fontsize=8)
    flagged = f"\nflagged: {'; '.join(st.flags)}" if st.flags else ""
    fig.suptitle(
        f"{title or 'yours against the record'} ({st.verdict}, short below {1 - st.tolerance_pct / 100:.2f}x)\n"
        f"{st.source}{flagged[:200]}",
        fontsize=8,
    )
    results.save(plt, fig, path)
    return None
