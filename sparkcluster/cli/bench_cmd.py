"""`sparkcluster bench`: a concurrency sweep of `vllm bench serve` against the serving cluster,
tabled in the terminal, kept as CSV + JSON + PNG and a performance record in a run folder, compared
with an earlier run, a published record or the cluster's own baseline (issue 38)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from sparkcluster import redact
from sparkcluster.bench import against, aiperf, benchy, orchestrate, results, sweep
from sparkcluster.cli.main import cli
from sparkcluster.cli.options import env_file_option
from sparkcluster.config.secrets import ENV_FILE_HELP

# the figures the terminal table shows (the CSV has them all)
_SHOWN = [
    ("c", "concurrency", "{:d}"),
    ("ok", "completed", "{:d}"),
    ("err", "errors", "{:d}"),
    ("req/s", "request_throughput", "{:.2f}"),
    ("out tok/s", "output_tok_s", "{:.1f}"),
    ("total tok/s", "total_tok_s", "{:.1f}"),
    ("TTFT p50", "ttft_p50_ms", "{:.0f}"),
    ("TTFT p99", "ttft_p99_ms", "{:.0f}"),
    ("TPOT p50", "tpot_p50_ms", "{:.1f}"),
    ("TPOT p99", "tpot_p99_ms", "{:.1f}"),
    ("ITL p99", "itl_p99_ms", "{:.1f}"),
    ("GPU W", "power_w", "{:.1f}"),  # the deployment's, every node's summed (issue 75)
    ("J/1k out", "j_per_1k_out", "{:.0f}"),
]


def _fmt(fmt: str, v) -> str:
    if v is None:
        return "-"
    return fmt.format(int(v)) if fmt == "{:d}" else fmt.format(v)


def _table(caption: str, columns: Iterable[str], left: tuple[str, ...] = ()) -> Table:
    """Borderless, a bold header, the caption under it; `left` columns read left, figures right."""
    t = Table(box=None, pad_edge=False, header_style="bold", caption=caption, caption_justify="left")
    for col in columns:
        t.add_column(col, justify="left" if col in left else "right")
    return t


def results_table(rows: list[dict]) -> Table:
    t = _table("latencies in ms", [title for title, _, _ in _SHOWN])
    for r in rows:
        cells = [_fmt(fmt, r.get(key)) for _, key, fmt in _SHOWN]
        if r.get("errors"):
            cells[2] = f"[red]{cells[2]}[/]"
        t.add_row(*cells)
    return t


def comparison_table(changes: list[results.Change], tolerance: float) -> Table:
    t = _table(
        f"regression: worse by more than {tolerance:g}% (any new error)",
        ("c", "figure", "before", "after", "change", ""),
        left=("figure", ""),
    )
    for ch in changes:
        pct = "-" if ch.pct is None else f"{ch.pct:+.1f}%"
        mark = "[bold red]REGRESSION[/]" if ch.regression else ""
        fmt = "{:d}" if ch.metric == "errors" else "{:.2f}"
        t.add_row(str(ch.concurrency), ch.metric, _fmt(fmt, ch.before), _fmt(fmt, ch.after), pct, mark)
    return t


def against_table(st: against.Standing) -> Table:
    t = _table(
        f"ratio: yours / record (latencies inverted); short below {1 - st.tolerance_pct / 100:.2f}",
        ("conditions", "figure", "yours", "record", "ratio", ""),
        left=("conditions", "figure", ""),
    )
    for r in st.ratios:
        mark = "" if not r.short else "[bold red]SHORT[/]"
        if r.short and r.figure in against.TAIL_FIGURES:
            mark = "[yellow]short (a p99: not judged)[/]"
        t.add_row(r.conditions, r.figure, f"{r.ours:.4g}", f"{r.theirs:.4g}", f"{r.ratio:.2f}", mark)
    return t


@cli.command()
@click.option(
    "--profile",
    "-p",
    "profile_name",
    default=None,
    help="The profile you expect to be serving (default: whatever the cluster serves).",
)
@click.option(
    "--concurrency",
    "-c",
    default=None,
    help="Comma-separated concurrency levels, one run of vllm bench serve each "
    f"[default: {','.join(map(str, sweep.DEFAULT_CONCURRENCY))}, or the compared record's].",
)
@click.option(
    "--input-len",
    default=None,
    type=int,
    help=f"Prompt tokens per request (random dataset) [default: {sweep.DEFAULT_INPUT_LEN}, or the compared record's].",
)
@click.option(
    "--output-len",
    default=None,
    type=int,
    help="Generated tokens per request (EOS ignored, so exactly this many) "
    f"[default: {sweep.DEFAULT_OUTPUT_LEN}, or the compared record's].",
)
@click.option(
    "--num-prompts",
    default=None,
    type=int,
    help=f"Requests per level (default: 4 x concurrency, at least {sweep.MIN_PROMPTS}).",
)
@click.option(
    "--tokenizer",
    default=None,
    help="Tokenizer path or id inside the head container (default: the profile's model, from the HF cache).",
)
@click.option(
    "--output",
    "-o",
    "out",
    type=click.Path(path_type=Path),
    default=None,
    help="Run folder (default: $XDG_STATE_HOME/sparkcluster/bench/<cluster>/<UTC time>/).",
)
@click.option(
    "--compare",
    "compare_to",
    default=None,
    help="What to compare with: an earlier run folder (or its name; default: the previous run of the same "
    "profile), a performance record (PATH.perf.toml), 'published' (the record shipped beside the serving "
    "profile) or 'baseline' (the run this cluster kept with --keep-baseline). Against a record, the levels "
    "default to its conditions.",
)
@click.option("--repeat", default=1, show_default=True, type=int, help="Measure each level this many times.")
@click.option(
    "--harness",
    type=click.Choice(orchestrate.RUNNABLE),
    default=None,
    help="What measures: vLLM's own bench (in the image), llama-benchy "
    f"{benchy.VERSION} or NVIDIA's aiperf {aiperf.VERSION} (each installed once in a "
    "virtualenv of its own in the head container; aiperf only when named here) "
    "[default: the compared record's harness where it runs here (llama-benchy), else vllm-bench-serve].",
)
@click.option(
    "--keep-baseline",
    is_flag=True,
    help="Keep this run's record as the cluster's baseline for the profile (--compare baseline; a later "
    "run below it by more than --tolerance says so).",
)
@click.option(
    "--tolerance",
    default=10.0,
    show_default=True,
    type=float,
    help="Percent a figure may worsen before it is marked a regression.",
)
@click.option(
    "--canary",
    "canary",
    is_flag=True,
    help="Instead of measuring speed: ask the correctness canary's fixed prompts greedily and compare the "
    "answers with the deployment's last good serve (taken the first time; exit 1 when a deterministic "
    "model's answers changed).",
)
@click.option("--canary-retake", is_flag=True, help="With --canary: take the canary anew (after a change you meant).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON on stdout.")
@env_file_option(f"Where VLLM_API_KEY lives (mode 0600); {ENV_FILE_HELP}.")
@click.pass_obj
def bench(
    obj,
    profile_name: str | None,
    concurrency: str | None,
    input_len: int | None,
    output_len: int | None,
    num_prompts: int | None,
    tokenizer: str | None,
    out: Path | None,
    compare_to: str | None,
    repeat: int,
    harness: str | None,
    keep_baseline: bool,
    tolerance: float,
    canary: bool,
    canary_retake: bool,
    as_json: bool,
    env_file: Path | None,
) -> None:
    """Measure throughput and latency of the serving cluster with vLLM's own `vllm bench serve`."""
    req = orchestrate.Request(
        profile_name,
        concurrency,
        input_len,
        output_len,
        num_prompts,
        tokenizer,
        out,
        compare_to,
        repeat,
        harness,
        keep_baseline,
        tolerance,
        canary,
        canary_retake,
        env_file,
    )
    orchestrate.requested_levels(req)  # everything the user typed is checked before any connection
    inv = obj.inventory()
    err = Console(stderr=True, highlight=False)
    bars = Progress(
        TextColumn("  {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=False,
    )
    tasks: dict[str, int] = {}

    def on_progress(level: sweep.Level, done: int, total: int) -> None:
        if level.name not in tasks:
            tasks[level.name] = bars.add_task(f"concurrency {level.concurrency}", total=total)
        bars.update(tasks[level.name], completed=done, total=total)

    got = orchestrate.run(inv, req, lambda line: err.print(escape(line)), on_progress, bars)
    if isinstance(got, orchestrate.CanaryResult):
        click.echo(json.dumps(got.doc, indent=2) if as_json else got.says)
        if got.problem:
            raise click.exceptions.Exit(1)
        return
    if as_json:
        click.echo(redact.mask(json.dumps(got.to_json(), indent=2)))
    else:
        render(got, compare_to)
    if got.chart_note:
        err.print(got.chart_note)
    if got.error is not None:
        raise got.error
    if got.interrupted:
        err.print(
            f"interrupted: stopped the benchmark in the head container; kept {len(got.rows)} level(s) in {got.run_dir}"
        )
        raise click.exceptions.Exit(130)


def render(r: orchestrate.BenchResult, compare_to: str | None) -> None:
    """The result as text: the levels' table, the comparison with an earlier run, the standing
    against a record, and where each file is."""
    con = Console(soft_wrap=True, highlight=False)
    con.print(results_table(r.rows))
    if r.changes:
        con.print(f"\ncompared with {r.compared_with}:")
        con.print(comparison_table(r.changes, r.tolerance))
    elif not compare_to:
        con.print("no earlier run of this profile to compare with")
    if r.standing is not None:
        _print_standing(con, r.standing, r.target_kind, r.causes)
    con.print(f"\nresults: {r.csv}")
    if r.chart:
        con.print(f"chart:   {r.chart}")
    if r.record:
        con.print(f"record:  {r.record}")
    if r.standing is not None:
        con.print(f"against: {r.against_csv}" + (f", {r.against_chart}" if r.against_chart else ""))
    if r.baseline_kept:
        con.print(f"kept as this cluster's baseline for '{r.profile}': {r.baseline_kept}")


def _print_standing(con: Console, st, kind: str | None, found: list) -> None:
    what = {"baseline": "this cluster's baseline", "published": "the published record"}.get(kind or "", "the record")
    con.print(f"\nagainst {what} ({escape(st.source)}):")
    if st.ratios:
        con.print(against_table(st))
    for f in st.flags:
        con.print(f"[yellow]flagged[/] {escape(f)}")
    for r in st.refused:
        con.print(f"[yellow]not compared[/] {escape(r)}")
    if st.verdict == "short":
        w = st.worst
        con.print(
            f"[bold red]SHORT[/]: {w.figure} {w.ours:.4g} against {w.theirs:.4g} ({w.ratio:.2f}) at {w.conditions}"
        )
        if found:
            con.print("likely causes, most likely first (sparkcluster/bench/causes.py states the rule):")
            for i, c in enumerate(found, 1):
                con.print(f"  {i}. {escape(c.line())}")
        else:
            con.print(
                "no cause found in the cluster's facts "
                "(fabric, MTU, twins, memory, image, vLLM, driver, weights, prompts)"
            )
    elif st.verdict == "ok":
        con.print("[green]holds[/]: every compared figure within the tolerance")
