"""`sparkcluster bench`: a concurrency sweep of `vllm bench serve` against the serving cluster,
tabled in the terminal, kept as CSV + JSON + PNG and a performance record in a run folder, compared
with an earlier run, a published record or the cluster's own baseline (issue 38)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from sparkcluster import bench as bench_pkg  # `bench` is this module's command
from sparkcluster import redact
from sparkcluster.cli.main import cli
from sparkcluster.cli.options import env_file_option
from sparkcluster.config import profile as profiles
from sparkcluster.config.flags import engine_host
from sparkcluster.config.secrets import ENV_FILE_HELP, load_secrets
from sparkcluster.deployment import canary_watch, endpoint, engine_ranks, known_good
from sparkcluster.errors import InputError, SparkError
from sparkcluster.fabric import engine_nccl

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


def comparison_table(changes: list[bench_pkg.Change], tolerance: float) -> Table:
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


# the harnesses bench runs itself; a record's aiperf figures are compared with vLLM's bench, flagged,
# unless --harness aiperf asks for aiperf itself (opt-in: it installs some 138 packages in the container)
RUNNABLE = ("vllm-bench-serve", "llama-benchy", "aiperf")
OPT_IN = ("aiperf",)  # run only when --harness names it, never as a record's default
# the harnesses installed into a virtualenv of their own in the head container: their modules
INSTALLED = {"llama-benchy": bench_pkg.benchy, "aiperf": bench_pkg.aiperf}


def against_table(st: bench_pkg.against.Standing) -> Table:
    t = _table(
        f"ratio: yours / record (latencies inverted); short below {1 - st.tolerance_pct / 100:.2f}",
        ("conditions", "figure", "yours", "record", "ratio", ""),
        left=("conditions", "figure", ""),
    )
    for r in st.ratios:
        mark = "" if not r.short else "[bold red]SHORT[/]"
        if r.short and r.figure in bench_pkg.against.TAIL_FIGURES:
            mark = "[yellow]short (a p99: not judged)[/]"
        t.add_row(r.conditions, r.figure, f"{r.ours:.4g}", f"{r.theirs:.4g}", f"{r.ratio:.2f}", mark)
    return t


def _record_target(spec: str | None, root: Path) -> tuple[str | None, Path | None]:
    """--compare SPEC: ("record", path) for a .perf.toml file, ("published"|"baseline", None), or
    ("run", folder) for an earlier run; (None, None) without --compare."""
    if spec is None:
        return None, None
    if spec in ("published", "baseline"):
        return spec, None
    p = Path(spec).expanduser()
    if bench_pkg.perf_record.is_record_file(p):
        if not p.is_file():
            raise InputError(f"--compare {spec}: no such performance record", "give the path of a .perf.toml file")
        return "record", p
    return "run", bench_pkg.resolve_run(spec, root)


def baseline_path(root: Path, profile: str) -> Path:
    return root / "baselines" / f"{profile}{bench_pkg.perf_record.SUFFIX}"


def _record_for(kind: str | None, path: Path | None, prof, root: Path):
    if kind == "record":
        return bench_pkg.perf_record.load(path)
    if kind == "published":
        rec = bench_pkg.perf_record.published_for(prof)
        if rec is None:
            raise InputError(
                f"profile '{prof.name}' ships no performance record "
                f"({prof.name}{bench_pkg.perf_record.SUFFIX} beside it)",
                "give a record: --compare PATH.perf.toml, or keep a run as this cluster's baseline: --keep-baseline",
            )
        return rec
    if kind == "baseline":
        p = baseline_path(root, prof.name)
        if not p.is_file():
            raise InputError(
                f"this cluster keeps no baseline for profile '{prof.name}'",
                "measure one and keep it: sparkcluster bench --keep-baseline",
            )
        return bench_pkg.perf_record.load(p)
    return None


def levels_from(rec) -> list[bench_pkg.Level]:
    """A record's conditions as levels: its concurrency, prompt and answer lengths, request count."""
    out: list[bench_pkg.Level] = []
    for run in rec.runs:
        c = run.conditions
        out += bench_pkg.plan([c.concurrency], c.input_tokens, c.output_tokens, c.requests)
    return out


def deployment_nodes(inv, prof) -> list[str]:
    """The nodes the serving profile spans: from the head, in inventory order, until its GPUs are met."""
    names, gpus = [], 0
    for n in [inv.head, *[x for x in inv.nodes if x.name != inv.head.name]]:
        if gpus >= prof.world_size:
            break
        names.append(n.name)
        gpus += n.gpus
    return names


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
    f"[default: {','.join(map(str, bench_pkg.DEFAULT_CONCURRENCY))}, or the compared record's].",
)
@click.option(
    "--input-len",
    default=None,
    type=int,
    help="Prompt tokens per request (random dataset) "
    f"[default: {bench_pkg.DEFAULT_INPUT_LEN}, or the compared record's].",
)
@click.option(
    "--output-len",
    default=None,
    type=int,
    help="Generated tokens per request (EOS ignored, so exactly this many) "
    f"[default: {bench_pkg.DEFAULT_OUTPUT_LEN}, or the compared record's].",
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
    type=click.Choice(RUNNABLE),
    default=None,
    help="What measures: vLLM's own bench (in the image), llama-benchy "
    f"{bench_pkg.benchy.VERSION} or NVIDIA's aiperf {bench_pkg.aiperf.VERSION} (each installed once in a "
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
    # everything the user typed is checked before any connection is opened
    explicit = any(v is not None for v in (concurrency, input_len, output_len, num_prompts))
    levels = bench_pkg.plan(
        bench_pkg.parse_concurrency(concurrency or ",".join(map(str, bench_pkg.DEFAULT_CONCURRENCY))),
        bench_pkg.DEFAULT_INPUT_LEN if input_len is None else input_len,
        bench_pkg.DEFAULT_OUTPUT_LEN if output_len is None else output_len,
        num_prompts,
    )
    bench_pkg.repeated(levels, repeat)
    if tolerance < 0:
        raise InputError(f"--tolerance {tolerance:g}: must be 0 or more", "e.g. --tolerance 10")
    if tokenizer is not None:
        bench_pkg.arg_value("--tokenizer", tokenizer)
    inv = obj.inventory()
    wanted = profiles.load_profile(profile_name) if profile_name else None
    root = bench_pkg.runs_root(inv.cluster.name)
    target_kind, target_path = _record_target(compare_to, root)
    baseline_dir = target_path if target_kind == "run" else None
    reference = _record_for(target_kind, target_path, wanted, root) if wanted or target_kind == "record" else None
    secrets = load_secrets(env_file, names=["VLLM_API_KEY"])
    err = Console(stderr=True, highlight=False)

    started = datetime.now(UTC)
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
        if reference is None and target_kind in ("published", "baseline"):
            reference = _record_for(target_kind, target_path, prof, root)
        if reference is not None and not explicit:
            levels = levels_from(reference)  # the record's own conditions
        levels = bench_pkg.repeated(levels, repeat)
        if harness is None:
            named = reference.harness.name if reference is not None else ""
            harness = named if named in RUNNABLE and named not in OPT_IN else "vllm-bench-serve"
        # the levels run inside the head container, at the address the engine listens on
        target = bench_pkg.target_for(prof, inv.cluster.api_port, tokenizer, bind=engine_host(inv, prof))
        port = prof.serve.port or inv.cluster.api_port
        # the controller's own questions: through the head's SSH connection when engines listen only
        # on the cluster's addresses (the gateway the only door)
        with endpoint.reached(cluster.head, inv, port) as base:
            at = urlsplit(base)
            bench_pkg.check_endpoint(at.hostname, target, at.port, secrets)
            image, image_id = head.image(info)
            vllm_version = head.vllm_version()
            if canary or canary_retake:
                meta = {
                    "profile_hash": profiles.profile_hash(prof),
                    "image_id": image_id,
                    "model_revision": bench_pkg.model_revision(cluster, inv, prof),
                    "vllm_version": vllm_version,
                }
                _canary(inv, prof, head, at.hostname, at.port, target.model, secrets, meta, canary_retake, as_json)
                return
        facts = bench_pkg.cluster_facts(cluster, inv, prof, head, image_id)
        nodes = facts.nodes
        if harness in INSTALLED:
            err.print(
                f"{harness} {INSTALLED[harness].VERSION} in {head.container} (installed once, in its own virtualenv)"
            )
            if harness == "aiperf":
                head.setup_aiperf(inv.cluster.pip_index_url)
            else:
                head.setup_benchy(inv.cluster.pip_index_url)
        sent = bench_pkg.prompt_set(head, reference, prof, harness)
        if sent.fallback:
            err.print(f"not the record's prompts: {sent.fallback}")
        run_dir = bench_pkg.new_run_dir(inv.cluster.name, out, started)
        n_in = sorted({lv.input_len for lv in levels})
        n_out = sorted({lv.output_len for lv in levels})
        err.print(
            f"measuring '{prof.name}' ({target.model}) on {inv.cluster.name}: "
            f"{len(levels)} level(s), {'/'.join(map(str, n_in))} in / {'/'.join(map(str, n_out))} out; "
            f"results in {run_dir}"
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
        loaded = bench_pkg.LoadedRtt(cluster, inv).start() if len(deployment_nodes(inv, prof)) > 1 else None
        with bars:
            try:
                sweep = bench_pkg.run_sweep(
                    head, levels, target, secrets, run_dir, on_progress, harness=harness, prompts=sent
                )
            except SparkError as e:  # keep what was measured, then report the failure
                error = e
                sweep.rows = [
                    bench_pkg.row_for(harness, json.loads((run_dir / f"{lv.name}.json").read_text()), lv)
                    for lv in levels
                    if (run_dir / f"{lv.name}.json").is_file()
                ]
                sweep.failed = e.message
        if loaded is not None:
            facts.loaded_rtts = loaded.join()

    finished = datetime.now(UTC)
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

    dep = deployment_nodes(inv, prof)
    transports, _ = engine_nccl.summaries(inv, {n: facts.nccl_texts.get(n, "") for n in dep})
    measured = bench_pkg.measured.build(
        sweep.rows,
        bench_pkg.measured.Provenance(
            cluster=inv.cluster.name,
            nodes={n: nodes.get(n, {}) for n in dep},
            image=prof.image.ref,
            image_ids={n: nodes.get(n, {}).get("image_id", "") for n in dep if nodes.get(n, {}).get("image_id")},
            image_digest=facts.image_digests[0] if facts.image_digests else "",
            vllm_version=vllm_version,
            model=prof.model,
            model_revision=facts.model_revision,
            profile=prof.name,
            profile_hash=profiles.profile_hash(prof),
            nccl_texts=facts.nccl_texts,
            nccl_transport=transports,
            all_reduce=engine_ranks.all_reduce({n: facts.engine_texts.get(n, "") for n in dep})[1],
            topology=inv.cluster.topology,
            gpus=prof.world_size,
            prompts=sent,
            speculative=bench_pkg.prompts.speculative(prof),
        ),
        harness=harness,
        harness_version=INSTALLED[harness].VERSION if harness in INSTALLED else vllm_version,
        argv=(
            bench_pkg.benchy.bench_argv(levels[0], target, "RESULT_FILE")
            if harness == "llama-benchy"
            else bench_pkg.aiperf.bench_argv(levels[0], target, "RESULT_DIR")
            if harness == "aiperf"
            else bench_pkg.bench_argv(levels[0], target, "RESULT_DIR", prompts=sent)
        ),
        measured_at=started.date(),
        source=str(run_dir),
    )
    record_file = run_dir / f"record{bench_pkg.perf_record.SUFFIX}" if measured else None
    if measured:
        bench_pkg.perf_record.write(record_file, measured)
    kept = None
    if keep_baseline and measured and not sweep.interrupted and not error:
        kept = baseline_path(root, prof.name)
        kept.parent.mkdir(parents=True, exist_ok=True)
        bench_pkg.perf_record.write(kept, measured)
    if reference is None and target_kind is None and baseline_path(root, prof.name).is_file() and not kept:
        reference, target_kind = bench_pkg.perf_record.load(baseline_path(root, prof.name)), "baseline"
    standing, found, against_chart = None, [], None
    if reference is not None and measured is not None:
        standing = bench_pkg.against.against(measured, reference, tolerance)
        if standing.verdict == "short":
            view = bench_pkg.causes.view_from(
                inv,
                dep,
                nodes,
                facts.rtts,
                transports,
                loaded_rtts=facts.loaded_rtts,
                image=prof.image.ref,
                image_digests=tuple(facts.image_digests),
                vllm_version=vllm_version,
                model_revision=facts.model_revision,
            )
            found = bench_pkg.causes.rank(view, reference, ours=measured)
        bench_pkg.write_json(
            run_dir / "against.json",
            {**standing.to_json(), "profile": prof.name, "kind": target_kind, "causes": [vars(c) for c in found]},
        )
        bench_pkg.against.write_csv(run_dir / "against.csv", standing)
        note = bench_pkg.against.write_chart(
            run_dir / "against.png",
            standing,
            f"{prof.name}: yours against "
            + {"published": "the published record", "baseline": "the cluster's baseline"}.get(
                target_kind, "the record"
            ),
            theirs=target_kind if target_kind in ("published", "baseline") else "record",
        )
        against_chart = None if note else run_dir / "against.png"

    summary = {
        "run_dir": str(run_dir),
        "profile": prof.name,
        "profile_hash": profiles.profile_hash(prof),
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
        "record": str(record_file) if record_file else None,
        "baseline_kept": str(kept) if kept else None,
        "against": (
            {
                **standing.to_json(),
                "kind": target_kind,
                "causes": [vars(c) for c in found],
                "chart": str(against_chart) if against_chart else None,
                "csv": str(run_dir / "against.csv"),
            }
            if standing
            else None
        ),
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
        if standing is not None:
            _print_standing(con, standing, target_kind, found)
        con.print(f"\nresults: {run_dir / 'results.csv'}")
        if chart:
            con.print(f"chart:   {chart}")
        if record_file:
            con.print(f"record:  {record_file}")
        if standing is not None:
            con.print(f"against: {run_dir / 'against.csv'}" + (f", {against_chart}" if against_chart else ""))
        if kept:
            con.print(f"kept as this cluster's baseline for '{prof.name}': {kept}")
    if chart_note:
        err.print(chart_note)
    if error is not None:
        raise error
    if sweep.interrupted:
        err.print(
            f"interrupted: stopped the benchmark in the head container; kept {len(sweep.rows)} level(s) in {run_dir}"
        )
        raise click.exceptions.Exit(130)


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


def _canary(
    inv, prof, head, address: str, port: int, model: str, secrets, meta: dict, retake: bool, as_json: bool
) -> None:
    """`bench --canary`: compare with the answers kept in the deployment's known-good record, or take
    them (the first time, or `--canary-retake` after a change you meant); told to the head like every
    canary check (deployment/canary_watch)."""
    deployment = f"{prof.name}@{'+'.join(deployment_nodes(inv, prof))}"
    good = known_good.last_for(known_good.load(inv.cluster.name), deployment)
    if good is None:
        raise InputError(
            f"no good serve of {deployment} is recorded on this machine: the canary is kept with it",
            f"sparkcluster up --profile {prof.name} (records it, and takes the canary)",
        )
    at = known_good.now_utc()

    def ask():
        return endpoint.ask_canary(address, port, model, secrets)

    if retake or canary_watch.must_take(good, prof.model):
        kept = canary_watch.take(ask, meta, at)
    else:
        kept = canary_watch.compare(good, ask, meta, at, "bench --canary")
    known_good.replace_newest(
        inv.cluster.name,
        replace(good, canary=kept.canary, canary_deterministic=kept.deterministic, canary_taken=kept.taken),
    )
    try:
        canary_watch.hand(head.api, head.container, canary_watch.reference(deployment, prof.name, kept), kept.check)
    except Exception as e:  # the record is kept; the head's copy is the supervisor's, refreshed by the next up
        Console(stderr=True).print(f"could not hand the canary to {head.container}: {escape(str(e))}")
    path = str(known_good.path_for(inv.cluster.name))
    v = kept.verdict
    if v is None:
        doc = {"canary": "taken", "deployment": deployment, "deterministic": kept.deterministic, "file": path}
        click.echo(json.dumps(doc, indent=2) if as_json else f"{kept.says()} for {deployment}; kept in {path}")
        return
    doc = {
        "canary": v.state,
        "deployment": deployment,
        "problem": v.problem,
        "changed": list(v.changed),
        "since": list(v.since),
        "says": v.says,
        "file": path,
    }
    click.echo(json.dumps(doc, indent=2) if as_json else f"canary of {deployment}: {v.says}")
    if v.problem:
        raise click.exceptions.Exit(1)
