"""One `sparkcluster bench`, from what the user asked to one typed result: the levels planned, the
cluster measured through its head, the run folder written (CSV, JSON, chart, performance record),
the comparison with an earlier run and the standing against a record, with the likely causes when
short. The command line renders the result as text or as JSON (`BenchResult.to_json`); nothing
here prints, but for the lines it hands to `say` while it runs (stderr in the CLI).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

from sparkcluster.bench import against, aiperf, benchy, causes, measured, perf_record, prompts
from sparkcluster.bench.results import (
    Change,
    compare,
    new_run_dir,
    previous_run,
    read_csv,
    resolve_run,
    run_record,
    runs_root,
    write_chart,
    write_csv,
    write_json,
)
from sparkcluster.bench.runner import (
    LoadedRtt,
    Sweep,
    check_endpoint,
    cluster_facts,
    connect,
    head_for,
    model_revision,
    prompt_set,
    row_for,
    run_sweep,
)
from sparkcluster.bench.sweep import (
    DEFAULT_CONCURRENCY,
    DEFAULT_INPUT_LEN,
    DEFAULT_OUTPUT_LEN,
    Level,
    arg_value,
    bench_argv,
    parse_concurrency,
    plan,
    repeated,
    target_for,
)
from sparkcluster.config import profile as profiles
from sparkcluster.config.flags import engine_host
from sparkcluster.config.secrets import load_secrets
from sparkcluster.deployment import canary_watch, deployments, endpoint, engine_ranks, head_records, known_good
from sparkcluster.errors import InputError, SparkError
from sparkcluster.fabric import engine_nccl
from sparkcluster.movement import hfcache

# the harnesses bench runs itself; a record's aiperf figures are compared with vLLM's bench, flagged,
# unless --harness aiperf asks for aiperf itself (opt-in: it installs some 138 packages in the container)
RUNNABLE = ("vllm-bench-serve", "llama-benchy", "aiperf")
OPT_IN = ("aiperf",)  # run only when --harness names it, never as a record's default
# the harnesses installed into a virtualenv of their own in the head container: their modules
INSTALLED = {"llama-benchy": benchy, "aiperf": aiperf}


@dataclass(frozen=True)
class Request:
    """What the user asked for, as the command line took it (None: not given)."""

    profile_name: str | None = None
    concurrency: str | None = None
    input_len: int | None = None
    output_len: int | None = None
    num_prompts: int | None = None
    tokenizer: str | None = None
    out: Path | None = None
    compare_to: str | None = None
    repeat: int = 1
    harness: str | None = None
    keep_baseline: bool = False
    tolerance: float = 10.0
    canary: bool = False
    canary_retake: bool = False
    env_file: Path | None = None  # where VLLM_API_KEY lives


@dataclass
class BenchResult:
    """One measured run: what the text and the JSON summaries both say."""

    run_dir: Path
    profile: str
    profile_hash: str
    vllm_version: str
    image_id: str
    rows: list[dict]
    tolerance: float
    chart: Path | None = None
    chart_note: str = ""  # why no chart was drawn
    compared_with: Path | None = None
    changes: list[Change] = field(default_factory=list)
    interrupted: bool = False
    failed: str | None = None
    error: SparkError | None = None  # the failure that ended the sweep, after what it measured was kept
    record: Path | None = None
    baseline_kept: Path | None = None
    standing: against.Standing | None = None
    target_kind: str | None = None  # what the standing is against: record, published, baseline
    causes: list = field(default_factory=list)
    against_chart: Path | None = None

    @property
    def csv(self) -> Path:
        return self.run_dir / "results.csv"

    @property
    def against_csv(self) -> Path:
        return self.run_dir / "against.csv"

    def to_json(self) -> dict:
        return {
            "run_dir": str(self.run_dir),
            "profile": self.profile,
            "profile_hash": self.profile_hash,
            "vllm_version": self.vllm_version,
            "image_id": self.image_id,
            "rows": self.rows,
            "csv": str(self.csv),
            "chart": str(self.chart) if self.chart else None,
            "compared_with": str(self.compared_with) if self.compared_with else None,
            "changes": [vars(c) for c in self.changes],
            "regressions": sum(c.regression for c in self.changes),
            "interrupted": self.interrupted,
            "failed": self.failed,
            "record": str(self.record) if self.record else None,
            "baseline_kept": str(self.baseline_kept) if self.baseline_kept else None,
            "against": (
                {
                    **self.standing.to_json(),
                    "kind": self.target_kind,
                    "causes": [vars(c) for c in self.causes],
                    "chart": str(self.against_chart) if self.against_chart else None,
                    "csv": str(self.against_csv),
                }
                if self.standing
                else None
            ),
        }


@dataclass(frozen=True)
class CanaryResult:
    """`bench --canary`: the canary taken, or compared with the deployment's last good serve."""

    doc: dict  # the JSON summary
    says: str  # the text summary, one line
    problem: bool  # a deterministic model's answers changed


def record_target(spec: str | None, root: Path) -> tuple[str | None, Path | None]:
    """--compare SPEC: ("record", path) for a .perf.toml file, ("published"|"baseline", None), or
    ("run", folder) for an earlier run; (None, None) without --compare."""
    if spec is None:
        return None, None
    if spec in ("published", "baseline"):
        return spec, None
    p = Path(spec).expanduser()
    if perf_record.is_record_file(p):
        if not p.is_file():
            raise InputError(f"--compare {spec}: no such performance record", "give the path of a .perf.toml file")
        return "record", p
    return "run", resolve_run(spec, root)


def baseline_path(root: Path, profile: str) -> Path:
    return root / "baselines" / f"{profile}{perf_record.SUFFIX}"


def record_for(kind: str | None, path: Path | None, prof, root: Path):
    if kind == "record":
        return perf_record.load(path)
    if kind == "published":
        rec = perf_record.published_for(prof)
        if rec is None:
            raise InputError(
                f"profile '{prof.name}' ships no performance record ({prof.name}{perf_record.SUFFIX} beside it)",
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
        return perf_record.load(p)
    return None


def levels_from(rec) -> list[Level]:
    """A record's conditions as levels: its concurrency, prompt and answer lengths, request count."""
    out: list[Level] = []
    for run in rec.runs:
        c = run.conditions
        out += plan([c.concurrency], c.input_tokens, c.output_tokens, c.requests)
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


def requested_levels(req: Request) -> list[Level]:
    """The levels the user asked for, checked with everything else they typed before any connection."""
    levels = plan(
        parse_concurrency(req.concurrency or ",".join(map(str, DEFAULT_CONCURRENCY))),
        DEFAULT_INPUT_LEN if req.input_len is None else req.input_len,
        DEFAULT_OUTPUT_LEN if req.output_len is None else req.output_len,
        req.num_prompts,
    )
    repeated(levels, req.repeat)
    if req.tolerance < 0:
        raise InputError(f"--tolerance {req.tolerance:g}: must be 0 or more", "e.g. --tolerance 10")
    if req.tokenizer is not None:
        arg_value("--tokenizer", req.tokenizer)
    return levels


Progress = Callable[[Level, int, int], None]


def _slot_of_profile(cluster, inv, wanted):
    """The inventory at the slot where `wanted` runs on the head beside other deployments (issue 60),
    so that its own container and port are measured; the inventory as it is otherwise."""
    if wanted is None:
        return inv
    found, _ = deployments.on(cluster, inv)
    slots = [d.slot for d in found if d.profile == wanted.name and inv.head.name in d.nodes and d.slot]
    return inv.at_slot(slots[0]) if slots else inv


def run(
    inv,
    req: Request,
    say: Callable[[str], None] = lambda line: None,
    on_progress: Progress | None = None,
    bars: AbstractContextManager | None = None,
) -> BenchResult | CanaryResult:
    """The whole bench: `say` takes the lines a person follows it by, `on_progress` each level's
    requests done, inside `bars` (the display they draw in, entered while the levels run)."""
    levels = requested_levels(req)
    explicit = any(v is not None for v in (req.concurrency, req.input_len, req.output_len, req.num_prompts))
    wanted = profiles.load_profile(req.profile_name) if req.profile_name else None
    root = runs_root(inv.cluster.name)
    target_kind, target_path = record_target(req.compare_to, root)
    baseline_dir = target_path if target_kind == "run" else None
    reference = record_for(target_kind, target_path, wanted, root) if wanted or target_kind == "record" else None
    harness = req.harness
    secrets = load_secrets(req.env_file, names=["VLLM_API_KEY"])

    started = datetime.now(UTC)
    cluster = connect(inv)
    with cluster:
        inv = _slot_of_profile(cluster, inv, wanted)
        head = head_for(cluster, inv)
        rec, info = head.serving()
        if wanted is not None and rec.profile != wanted.name:
            raise InputError(
                f"the cluster serves profile '{rec.profile}', not '{wanted.name}'",
                f"leave out --profile to measure '{rec.profile}', or "
                f"sparkcluster up --profile {wanted.name} --replace first",
            )
        prof = wanted or profiles.load_profile(rec.profile)
        if reference is None and target_kind in ("published", "baseline"):
            reference = record_for(target_kind, target_path, prof, root)
        if reference is not None and not explicit:
            levels = levels_from(reference)  # the record's own conditions
        levels = repeated(levels, req.repeat)
        if harness is None:
            named = reference.harness.name if reference is not None else ""
            harness = named if named in RUNNABLE and named not in OPT_IN else "vllm-bench-serve"
        # the levels run inside the head container, at the address the engine listens on
        target = target_for(prof, inv.cluster.api_port, req.tokenizer, bind=engine_host(inv, prof))
        port = prof.serve.port or inv.cluster.api_port
        # the controller's own questions: through the head's SSH connection when engines listen only
        # on the cluster's addresses (the gateway the only door)
        with endpoint.reached(cluster.head, inv, port) as base:
            at = urlsplit(base)
            check_endpoint(at.hostname, target, at.port, secrets)
            image, image_id = head.image(info)
            vllm_version = head.vllm_version()
            if req.canary or req.canary_retake:
                meta = {
                    "profile_hash": profiles.profile_hash(prof),
                    "image_id": image_id,
                    "model_revision": model_revision(cluster, inv, prof),
                    "vllm_version": vllm_version,
                }
                return canary(
                    inv, prof, head, at.hostname, at.port, target.model, secrets, meta, req.canary_retake, say
                )
        facts = cluster_facts(cluster, inv, prof, head, image_id)
        nodes = facts.nodes
        sent = _harness_and_prompts(inv, head, harness, reference, prof, say)
        run_dir = new_run_dir(inv.cluster.name, req.out, started)
        n_in = sorted({lv.input_len for lv in levels})
        n_out = sorted({lv.output_len for lv in levels})
        say(
            f"measuring '{prof.name}' ({target.model}) on {inv.cluster.name}: "
            f"{len(levels)} level(s), {'/'.join(map(str, n_in))} in / {'/'.join(map(str, n_out))} out; "
            f"results in {run_dir}"
        )
        sweep = Sweep(run_dir)
        error = None
        loaded = LoadedRtt(cluster, inv).start() if len(deployment_nodes(inv, prof)) > 1 else None
        with bars or nullcontext():
            try:
                sweep = run_sweep(head, levels, target, secrets, run_dir, on_progress, harness=harness, prompts=sent)
            except SparkError as e:  # keep what was measured, then report the failure
                error = e
                sweep.rows = [
                    row_for(harness, json.loads((run_dir / f"{lv.name}.json").read_text()), lv)
                    for lv in levels
                    if (run_dir / f"{lv.name}.json").is_file()
                ]
                sweep.failed = e.message
        if loaded is not None:
            facts.loaded_rtts = loaded.join()

        result = _kept(inv, req, prof, image, image_id, vllm_version, levels, target, started, sweep, error, nodes)
        if baseline_dir is None:
            baseline_dir = previous_run(root, prof.name, exclude=run_dir)
        result.compared_with = baseline_dir
        result.changes = (
            compare(read_csv(baseline_dir / "results.csv"), sweep.rows, req.tolerance) if baseline_dir else []
        )

        dep = deployment_nodes(inv, prof)
        transports, _ = engine_nccl.summaries(inv, {n: facts.nccl_texts.get(n, "") for n in dep})
        got = _measured(
            inv, prof, dep, facts, transports, vllm_version, sweep.rows, harness, levels, target, started, run_dir, sent
        )
        result.record = run_dir / f"record{perf_record.SUFFIX}" if got else None
        if got:
            perf_record.write(result.record, got)
        if req.keep_baseline and got and not sweep.interrupted and not error:
            result.baseline_kept = baseline_path(root, prof.name)
            result.baseline_kept.parent.mkdir(parents=True, exist_ok=True)
            perf_record.write(result.baseline_kept, got)
        if (
            reference is None
            and target_kind is None
            and baseline_path(root, prof.name).is_file()
            and not result.baseline_kept
        ):
            reference, target_kind = perf_record.load(baseline_path(root, prof.name)), "baseline"
        if reference is not None and got is not None:
            _stand(result, inv, prof, dep, nodes, facts, transports, vllm_version, got, reference, target_kind)
        _publish(cluster, inv, f"{prof.name}@{'+'.join(dep)}", result, started, say)  # its connection still open
    return result


def _publish(cluster, inv, key: str, result: BenchResult, started: datetime, say: Callable[[str], None]) -> None:
    """The run's summary copied to the head for the gateway's console (deployment/head_records)."""
    doc = head_records.bench_doc(result.to_json(), key, started.isoformat())
    head_records.publish(cluster.head, inv.cluster.name, f"bench/{result.run_dir.name}", doc, say)


def _harness_and_prompts(inv, head, harness: str, reference, prof, say: Callable[[str], None]):
    """The harness installed in the head container where it is not vLLM's own, and the prompts the
    run sends (bench/prompts: the record's dataset where the image has it), said when they are not
    the record's."""
    if harness in INSTALLED:
        say(f"{harness} {INSTALLED[harness].VERSION} in {head.container} (installed once, in its own virtualenv)")
        if harness == "aiperf":
            head.setup_aiperf(inv.cluster.pip_index_url)
        else:
            head.setup_benchy(inv.cluster.pip_index_url)
    sent = prompt_set(head, reference, prof, harness, inv.cluster.hf_endpoint or hfcache.PUBLIC_HUB)
    if sent.fallback:
        say(f"not the record's prompts: {sent.fallback}")
    return sent


def _kept(inv, req, prof, image, image_id, vllm_version, levels, target, started, sweep, error, nodes) -> BenchResult:
    """What was measured, kept in the run folder (results.csv, run.json, chart.png), as the result."""
    run_dir = sweep.run_dir
    finished = datetime.now(UTC)
    write_csv(run_dir / "results.csv", sweep.rows)
    write_json(
        run_dir / "run.json",
        run_record(
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
    result = BenchResult(
        run_dir,
        prof.name,
        profiles.profile_hash(prof),
        vllm_version,
        image_id,
        sweep.rows,
        req.tolerance,
        interrupted=sweep.interrupted,
        failed=sweep.failed,
        error=error,
    )
    result.chart_note = write_chart(run_dir / "chart.png", sweep.rows, f"{prof.name} on {inv.cluster.name}")
    result.chart = None if result.chart_note else run_dir / "chart.png"
    return result


def _measured(inv, prof, dep, facts, transports, vllm_version, rows, harness, levels, target, started, run_dir, sent):
    """The run as a performance record (bench/measured), or None when nothing was measured."""
    nodes = facts.nodes
    return measured.build(
        rows,
        measured.Provenance(
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
            speculative=prompts.speculative(prof),
        ),
        harness=harness,
        harness_version=INSTALLED[harness].VERSION if harness in INSTALLED else vllm_version,
        argv=(
            benchy.bench_argv(levels[0], target, "RESULT_FILE")
            if harness == "llama-benchy"
            else aiperf.bench_argv(levels[0], target, "RESULT_DIR")
            if harness == "aiperf"
            else bench_argv(levels[0], target, "RESULT_DIR", prompts=sent)
        ),
        measured_at=started.date(),
        source=str(run_dir),
    )


def _stand(result: BenchResult, inv, prof, dep, nodes, facts, transports, vllm_version, got, reference, kind) -> None:
    """The run against a record (bench/against), the likely causes when it falls short, kept in the
    run folder (against.json, .csv, .png) and in `result`."""
    standing = against.against(got, reference, result.tolerance)
    found = []
    if standing.verdict == "short":
        view = causes.view_from(
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
        found = causes.rank(view, reference, ours=got)
    run_dir = result.run_dir
    write_json(
        run_dir / "against.json",
        {**standing.to_json(), "profile": prof.name, "kind": kind, "causes": [vars(c) for c in found]},
    )
    against.write_csv(run_dir / "against.csv", standing)
    note = against.write_chart(
        run_dir / "against.png",
        standing,
        f"{prof.name}: yours against "
        + {"published": "the published record", "baseline": "the cluster's baseline"}.get(kind, "the record"),
        theirs=kind if kind in ("published", "baseline") else "record",
    )
    result.standing, result.target_kind, result.causes = standing, kind, found
    result.against_chart = None if note else run_dir / "against.png"


def canary(
    inv, prof, head, address: str, port: int, model: str, secrets, meta: dict, retake: bool, say: Callable[[str], None]
) -> CanaryResult:
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
        say(f"could not hand the canary to {head.container}: {e}")
    path = str(known_good.path_for(inv.cluster.name))
    v = kept.verdict
    if v is None:
        doc = {"canary": "taken", "deployment": deployment, "deterministic": kept.deterministic, "file": path}
        return CanaryResult(doc, f"{kept.says()} for {deployment}; kept in {path}", False)
    doc = {
        "canary": v.state,
        "deployment": deployment,
        "problem": v.problem,
        "changed": list(v.changed),
        "since": list(v.since),
        "says": v.says,
        "file": path,
    }
    return CanaryResult(doc, f"canary of {deployment}: {v.says}", bool(v.problem))
