"""`sparkcluster bench`: a concurrency sweep of `vllm bench serve` against the serving cluster,
tabled in the terminal, kept as CSV + JSON + PNG in a run folder, compared with an earlier run."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from sparkcluster import bench as bench_pkg  # `bench` is this module's command
from sparkcluster import redact
from sparkcluster.cli.main import cli
from sparkcluster.config import profile as profiles
from sparkcluster.config.secrets import ENV_FILE_HELP, load_secrets
from sparkcluster.errors import InputError, SparkError

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
]


def _fmt(fmt: str, v) -> str:
    if v is None:
        return "-"
    return fmt.format(int(v)) if fmt == "{:d}" else fmt.format(v)


def results_table(rows: list[dict]) -> Table:
    t = Table(box=None, pad_edge=False, header_style="bold", caption="latencies in ms", caption_justify="left")
    for title, _, _ in _SHOWN:
        t.add_column(title, justify="right")
    for r in rows:
        cells = [_fmt(fmt, r.get(key)) for _, key, fmt in _SHOWN]
        if r.get("errors"):
            cells[2] = f"[red]{cells[2]}[/]"
        t.add_row(*cells)
    return t


def comparison_table(changes: list[bench_pkg.Change], tolerance: float) -> Table:
    t = Table(
        box=None,
        pad_edge=False,
        header_style="bold",
        caption=f"regression: worse by more than {tolerance:g}% (any new error)",
        caption_justify="left",
    )
    for col in ("c", "figure", "before", "after", "change", ""):
        t.add_column(col, justify="left" if col in ("figure", "") else "right")
    for ch in changes:
        pct = "-" if ch.pct is None else f"{ch.pct:+.1f}%"
        mark = "[bold red]REGRESSION[/]" if ch.regression else ""
        fmt = "{:d}" if ch.metric == "errors" else "{:.2f}"
        t.add_row(str(ch.concurrency), ch.metric, _fmt(fmt, ch.before), _fmt(fmt, ch.after), pct, mark)
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
    default=",".join(map(str, bench_pkg.DEFAULT_CONCURRENCY)),
    show_default=True,
    help="Comma-separated concurrency levels, one run of vllm bench serve each.",
)
@click.option(
    "--input-len",
    default=bench_pkg.DEFAULT_INPUT_LEN,
    show_default=True,
    type=int,
    help="Prompt tokens per request (random dataset).",
)
@click.option(
    "--output-len",
    default=bench_pkg.DEFAULT_OUTPUT_LEN,
    show_default=True,
    type=int,
    help="Generated tokens per request (EOS ignored, so exactly this many).",
)
@click.option(
    "--num-prompts",
    default=None,
    type=int,
    help=f"Requests per level (default: 4 x concurrency, at least {bench_pkg.MIN_PROMPTS}).",
)
@click.option(
    "--tokenizer",
    default=None,
    help="Tokenizer path or id inside the head container (default: the profile's model, from the HF cache).",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="Run folder (default: $XDG_STATE_HOME/sparkcluster/bench/<cluster>/<UTC time>/).",
)
@click.option(
    "--compare",
    "compare_to",
    default=None,
    help="Run folder (or its name) to compare with (default: the previous run of the same profile).",
)
@click.option(
    "--tolerance",
    default=10.0,
    show_default=True,
    type=float,
    help="Percent a figure may worsen before it is marked a regression.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON on stdout.")
@click.option(
    "--env-file",
    type=click.Path(path_type=Path),
    default=None,
    help=f"Where VLLM_API_KEY lives (mode 0600); {ENV_FILE_HELP}.",
)
@click.pass_obj
def bench(
    obj,
    profile_name: str | None,
    concurrency: str,
    input_len: int,
    output_len: int,
    num_prompts: int | None,
    tokenizer: str | None,
    out: Path | None,
    compare_to: str | None,
    tolerance: float,
    as_json: bool,
    env_file: Path | None,
) -> None:
    """Measure throughput and latency of the serving cluster with vLLM's own `vllm bench serve`."""
    # everything the user typed is checked before any connection is opened
    levels = bench_pkg.plan(bench_pkg.parse_concurrency(concurrency), input_len, output_len, num_prompts)
    if tolerance < 0:
        raise InputError(f"--tolerance {tolerance:g}: must be 0 or more", "e.g. --tolerance 10")
    if tokenizer is not None:
        bench_pkg.arg_value("--tokenizer", tokenizer)
    inv = obj.inventory()
    wanted = profiles.load_profile(profile_name) if profile_name else None
    root = bench_pkg.runs_root(inv.cluster.name)
    baseline_dir = bench_pkg.resolve_run(compare_to, root) if compare_to else None
    secrets = load_secrets(env_file, names=["VLLM_API_KEY"])
    err = Console(stderr=True, highlight=False)

    started = datetime.now(timezone.utc)
    cluster = bench_pkg.connect(inv)
    with cluster:
        head = bench_pkg.head_for(cluster, inv)
        rec, info = head.serving()
        if wanted is not None and rec.profile != wanted.name:
            raise InputError(
                f"the cluster serves profile '{rec.profile}', not '{wanted.name}'",
                f"leave out --profile to measure '{rec.profile}', or "
                f"sparkcluster up --profile {wanted.name} --replace first",
            )
        prof = wanted or profiles.load_profile(rec.profile)
        target = bench_pkg.target_for(prof, inv.cluster.api_port, tokenizer)
        port = prof.serve.port or inv.cluster.api_port
        bench_pkg.check_endpoint(cluster.head.address, target, port, secrets)
        image, image_id = head.image(info)
        vllm_version = head.vllm_version()
        nodes = bench_pkg.node_facts(cluster)
        run_dir = bench_pkg.new_run_dir(inv.cluster.name, out, started)
        err.print(
            f"measuring '{prof.name}' ({target.model}) on {inv.cluster.name}: "
            f"{len(levels)} level(s), {input_len} in / {output_len} out; results in {run_dir}"
        )

        bars = Progress(
            TextColumn("  {task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=err,
            transient=False,
        )
        tasks: dict[str, int] = {}

        def on_progress(level: bench_pkg.Level, done: int, total: int) -> None:
            if level.name not in tasks:
                tasks[level.name] = bars.add_task(f"concurrency {level.concurrency}", total=total)
            bars.update(tasks[level.name], completed=done, total=total)

        sweep = bench_pkg.Sweep(run_dir)
        error = None
        with bars:
            try:
                sweep = bench_pkg.run_sweep(head, levels, target, secrets, run_dir, on_progress)
            except SparkError as e:  # keep what was measured, then report the failure
                error = e
                sweep.rows = [
                    bench_pkg.row_from_result(json.loads((run_dir / f"{lv.name}.json").read_text()), lv)
                    for lv in levels
                    if (run_dir / f"{lv.name}.json").is_file()
                ]
                sweep.failed = e.message

    finished = datetime.now(timezone.utc)
    bench_pkg.write_csv(run_dir / "results.csv", sweep.rows)
    bench_pkg.write_json(
        run_dir / "run.json",
        bench_pkg.run_record(
            cluster=inv.cluster.name,
            prof=prof,
            image=image,
            image_id=image_id,
            vllm_version=vllm_version,
            nodes=nodes,
            levels=levels,
            target=target,
            started_at=started.isoformat(),
            finished_at=finished.isoformat(),
            interrupted=sweep.interrupted,
            failed=sweep.failed,
        ),
    )
    chart_note = bench_pkg.write_chart(run_dir / "chart.png", sweep.rows, f"{prof.name} on {inv.cluster.name}")
    chart = None if chart_note else run_dir / "chart.png"

    if baseline_dir is None:
        baseline_dir = bench_pkg.previous_run(root, prof.name, exclude=run_dir)
    changes = (
        bench_pkg.compare(bench_pkg.read_csv(baseline_dir / "results.csv"), sweep.rows, tolerance)
        if baseline_dir
        else []
    )

    summary = {
        "run_dir": str(run_dir),
        "profile": prof.name,
        "profile_hash": bench_pkg.profile_hash(prof),
        "vllm_version": vllm_version,
        "image_id": image_id,
        "rows": sweep.rows,
        "csv": str(run_dir / "results.csv"),
        "chart": str(chart) if chart else None,
        "compared_with": str(baseline_dir) if baseline_dir else None,
        "changes": [vars(c) for c in changes],
        "regressions": sum(c.regression for c in changes),
        "interrupted": sweep.interrupted,
        "failed": sweep.failed,
    }
    if as_json:
        click.echo(redact.mask(json.dumps(summary, indent=2)))
    else:
        con = Console(soft_wrap=True, highlight=False)
        con.print(results_table(sweep.rows))
        if changes:
            con.print(f"\ncompared with {baseline_dir}:")
            con.print(comparison_table(changes, tolerance))
        elif not compare_to:
            con.print("no earlier run of this profile to compare with")
        con.print(f"\nresults: {run_dir / 'results.csv'}")
        if chart:
            con.print(f"chart:   {chart}")
    if chart_note:
        err.print(chart_note)
    if error is not None:
        raise error
    if sweep.interrupted:
        err.print(
            f"interrupted: stopped the benchmark in the head container; kept {len(sweep.rows)} level(s) in {run_dir}"
        )
        raise click.exceptions.Exit(130)
