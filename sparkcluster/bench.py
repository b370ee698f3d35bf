"""`sparkcluster bench`: throughput and latency of the serving cluster, measured by vLLM's own
`vllm bench serve` inside the head container, one concurrency level at a time.

The pure parts come first (the sweep, the exact argv, a level's JSON turned into a row, the CSV,
the comparison with an earlier run, the run folder); they are unit-tested against output captured
from a real `vllm bench serve`. The cluster side is the `Head` class at the end: it is the only
code here that talks to the head (over `ssh`/`fanout` and the Docker API), so it is the one place
to adapt when those change.

Why inside the head container: the image already has `vllm bench`, the tokenizer is in the mounted
HF cache, and the requests do not cross the controller's network, which is not what is measured.
The API key reaches the benchmark only in the exec's environment (`OPENAI_API_KEY`, which
vllm/benchmarks/lib/endpoint_request_func.py turns into the Authorization header), never argv.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import re
import tarfile
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import Callable, Iterable

from . import log, redact
from .errors import InputError, SparkError

_log = log.get(__name__)

# ---- the sweep ---------------------------------------------------------------------------------

DEFAULT_CONCURRENCY: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
# 512 in / 128 out: a chat-sized prompt, and enough generated tokens for TPOT to mean decode speed
DEFAULT_INPUT_LEN = 512
DEFAULT_OUTPUT_LEN = 128
MAX_CONCURRENCY = 4096
MIN_PROMPTS = 8


@dataclass(frozen=True)
class Level:
    concurrency: int
    num_prompts: int
    input_len: int
    output_len: int

    @property
    def name(self) -> str:
        return f"c{self.concurrency}"


def parse_concurrency(text: str) -> tuple[int, ...]:
    """'1,2,4' -> (1, 2, 4), in the order given, duplicates refused."""
    parts = [p.strip() for p in str(text).split(",")]
    if not parts or any(p == "" for p in parts):
        raise InputError(f"--concurrency {text!r}: give a comma-separated list of positive integers",
                         "e.g. --concurrency 1,4,16")
    out: list[int] = []
    for p in parts:
        if not re.fullmatch(r"[0-9]+", p):
            raise InputError(f"--concurrency {text!r}: {p!r} is not a positive integer", "e.g. --concurrency 1,4,16")
        n = int(p)
        if n < 1:
            raise InputError(f"--concurrency {text!r}: a concurrency of {n} sends no request",
                             "use 1 or more, e.g. --concurrency 1,4,16")
        if n > MAX_CONCURRENCY:
            raise InputError(f"--concurrency {text!r}: {n} is more than {MAX_CONCURRENCY}", "use a smaller level")
        if n in out:
            raise InputError(f"--concurrency {text!r}: {n} is given twice", "list each level once")
        out.append(n)
    return tuple(out)


def prompts_for(concurrency: int) -> int:
    # four waves per level: the first and last waves ramp up and drain, the middle ones are the
    # steady state the figures should describe; never fewer than 8 so a c=1 level is not one sample
    return max(MIN_PROMPTS, 4 * concurrency)


def plan(concurrency: Iterable[int], input_len: int = DEFAULT_INPUT_LEN, output_len: int = DEFAULT_OUTPUT_LEN,
         num_prompts: int | None = None) -> list[Level]:
    for name, v in (("--input-len", input_len), ("--output-len", output_len)):
        if v < 1:
            raise InputError(f"{name} {v}: must be at least 1", f"e.g. {name} 128")
    if num_prompts is not None and num_prompts < 1:
        raise InputError(f"--num-prompts {num_prompts}: must be at least 1", "e.g. --num-prompts 64, or leave it out")
    levels = [Level(c, num_prompts or prompts_for(c), input_len, output_len) for c in concurrency]
    if not levels:
        raise InputError("no concurrency level to measure", "e.g. --concurrency 1,4,16")
    return levels


# ---- the command line inside the head container ------------------------------------------------

CONTAINER_ROOT = "/tmp/sparkcluster-bench"  # <run>/<level>/: pid, bench.log, result.json (names in LAUNCH)
RESULT_FILE = "result.json"
LOG_FILE = "bench.log"
PERCENTILE_METRICS = "ttft,tpot,itl,e2el"
METRIC_PERCENTILES = "50,99"
# `vllm bench serve` in the level's folder, its PID in a file there (the PID inside the container:
# `docker exec` forwards no signal, so Ctrl-C is a `kill` of that PID), its output in bench.log.
# The folder and argv arrive as positional parameters: no value is ever parsed by a shell.
LAUNCH = 'mkdir -p "$1" && cd "$1" && echo $$ > pid && shift && exec "$@" >bench.log 2>&1'
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,80}$")


@dataclass(frozen=True)
class Target:
    """What the benchmark talks to, from inside the head container."""

    base_url: str  # without /v1: vLLM's bench appends --endpoint
    model: str  # the served name, as clients ask for it
    tokenizer: str  # loadable offline inside the container (the HF cache is mounted there)
    trust_remote_code: bool = False


def target_for(prof, api_port: int, tokenizer: str | None = None) -> Target:
    """The served endpoint seen from inside the head container (host networking)."""
    s = prof.serve
    port = s.port or api_port
    host = s.host
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"  # a wildcard bind answers on loopback
    if ":" in host:
        host = f"[{host}]"
    return Target(f"http://{host}:{port}", prof.served_model_name, tokenizer or prof.model,
                  prof.serve.trust_remote_code)


def arg_value(name: str, v: str) -> str:
    # a value vLLM's argparse takes as a flag (a leading '-') still binds in the --flag=value form;
    # NUL cannot cross exec, a newline would forge lines in bench.log
    if "\x00" in v or "\n" in v or "\r" in v:
        raise InputError(f"{name}: value may not contain a NUL or newline", "check the profile / option")
    if v in ("", "--"):  # argparse drops a lone "--" even in --flag=-- form, leaving the flag empty
        raise InputError(f"{name}: {v!r} is not a usable value", "check the profile / option")
    return f"{name}={v}"


def bench_argv(level: Level, target: Target, result_dir: str, seed: int = 0) -> list[str]:
    """The exact `vllm bench serve` argv for one level. Every value is in --flag=value form."""
    argv = [
        "vllm", "bench", "serve",
        "--backend=vllm",
        arg_value("--base-url", target.base_url),
        "--endpoint=/v1/completions",
        arg_value("--model", target.model),
        arg_value("--tokenizer", target.tokenizer),
        "--dataset-name=random",  # synthetic prompts: no dataset download, no hub
        f"--random-input-len={int(level.input_len)}",
        f"--random-output-len={int(level.output_len)}",
        f"--num-prompts={int(level.num_prompts)}",
        f"--max-concurrency={int(level.concurrency)}",
        # every request generates exactly output_len tokens, so levels and runs compare
        "--ignore-eos",
        f"--percentile-metrics={PERCENTILE_METRICS}",
        f"--metric-percentiles={METRIC_PERCENTILES}",
        f"--seed={int(seed)}",
        "--save-result",
        arg_value("--result-dir", result_dir),
        f"--result-filename={RESULT_FILE}",
    ]
    if target.trust_remote_code:
        argv.append("--trust-remote-code")
    return argv


def level_dir(run_id: str, level: Level) -> str:
    if not _RUN_ID.match(run_id):
        raise ValueError(f"not a run id: {run_id!r}")
    return str(PurePosixPath(CONTAINER_ROOT) / run_id / level.name)


def exec_argv(folder: str, argv: list[str]) -> list[str]:
    return ["sh", "-c", LAUNCH, "sh", folder, *argv]


def exec_env(secrets: dict[str, str]) -> dict[str, str]:
    """The exec's environment: the key for vLLM's bench client, and no hub access (the tokenizer
    comes from the mounted cache; a lookup on the hub would hang a node without internet)."""
    env = {"HF_HUB_OFFLINE": "1"}
    key = secrets.get("VLLM_API_KEY")
    if key:
        env["OPENAI_API_KEY"] = key
    return env


def stop_argv(folder: str, grace_s: float = 15.0) -> list[str]:
    """Interrupt the level's benchmark by its PID inside the container; SIGKILL after the grace.
    SIGINT first: vLLM's bench cancels its requests and exits (about 5 s for vLLM 0.32 on a CPU)."""
    ticks = int(grace_s * 10)
    # alive = its /proc entry exists and is not a zombie (kill -0 also succeeds on a zombie, which
    # would hold the loop for the whole grace where the exec's parent reaps late)
    script = ('alive() { s=$(sed "s/.*) //" "/proc/$1/stat" 2>/dev/null | cut -c1); [ -n "$s" ] && [ "$s" != Z ]; }; '
              'p=$(cat "$1/pid" 2>/dev/null) || exit 0; [ -n "$p" ] || exit 0; kill -INT "$p" 2>/dev/null || exit 0; '
              f'i=0; while alive "$p"; do i=$((i+1)); [ $i -gt {ticks} ] && {{ kill -KILL "$p"; exit 0; }}; '
              'sleep 0.1; done')
    return ["sh", "-c", script, "sh", folder]


def describe(level: Level, target: Target, folder: str, container: str, secrets: dict[str, str]) -> str:
    """The command as a user could type it (for logs and errors): secrets by name only."""
    import shlex

    env = " ".join(f"-e {k}=******" if k == "OPENAI_API_KEY" else f"-e {k}={v}"
                   for k, v in exec_env(secrets).items())
    return redact.mask(f"docker exec {env} {container} " + shlex.join(bench_argv(level, target, folder)))


# ---- what the benchmark printed ----------------------------------------------------------------

_TQDM = re.compile(r"(\d+)/(\d+) \[")


def progress(text: str) -> tuple[int, int] | None:
    """The last 'done/total' of tqdm's bar in the benchmark's output, or None before it starts."""
    m = None
    for m in _TQDM.finditer(text[-4096:]):
        pass
    return (int(m.group(1)), int(m.group(2))) if m else None


def failure_reason(output: str) -> tuple[str, bool]:
    """(one line for the user, whether the endpoint did not answer) from a failed level's output."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    unreachable = re.search(r"Cannot connect to host|Connection refused|ClientConnectorError|"
                            r"Server disconnected|All connection attempts failed", output)
    # vLLM 0.32 lists failed requests as "Error N: <message>" (a one-line HTTP reason, or a traceback)
    m = re.search(r"^Error \d+: (?!Traceback)(.+)$", output, re.M)
    if m:
        return redact.mask(m.group(1).strip()[:300]), bool(unreachable)
    for ln in reversed(lines):
        if re.match(r"^[A-Za-z_.]*(Error|Exception)\b", ln) or ln.startswith("ValueError"):
            return redact.mask(ln[:300]), bool(unreachable)
    return (redact.mask(lines[-1][:300]) if lines else "no output"), bool(unreachable)


# ---- one level's JSON -> one row ---------------------------------------------------------------

# (CSV column, key in vLLM's --save-result JSON); pNN keys exist because we ask for 50,99
_METRICS: list[tuple[str, str]] = [
    ("request_throughput", "request_throughput"),
    ("output_tok_s", "output_throughput"),
    ("total_tok_s", "total_token_throughput"),
]
for _m in ("ttft", "tpot", "itl", "e2el"):
    _METRICS += [(f"{_m}_mean_ms", f"mean_{_m}_ms"), (f"{_m}_p50_ms", f"p50_{_m}_ms"), (f"{_m}_p99_ms", f"p99_{_m}_ms")]

COLUMNS: list[str] = ["concurrency", "num_prompts", "input_len", "output_len", "completed", "errors",
                      "duration_s", *[c for c, _ in _METRICS]]
METRIC_COLUMNS = [c for c, _ in _METRICS]
# throughputs: more is better; latencies: less is better
HIGHER_IS_BETTER = {"request_throughput", "output_tok_s", "total_tok_s"}


def _num(v) -> float | None:
    if v is None or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def row_from_result(doc: dict, level: Level | None = None) -> dict:
    """One CSV row from one level's `--save-result` JSON. A figure the JSON lacks is None."""
    if not isinstance(doc, dict):
        raise ValueError("a level's result must be a JSON object")
    row: dict = {
        "concurrency": doc.get("max_concurrency", level.concurrency if level else None),
        "num_prompts": doc.get("num_prompts", level.num_prompts if level else None),
        "input_len": level.input_len if level else None,
        "output_len": level.output_len if level else None,
        "completed": doc.get("completed"),
        "errors": doc.get("failed"),
        "duration_s": _num(doc.get("duration")),
    }
    if row["errors"] is None and isinstance(doc.get("errors"), list):  # older vLLM: per-request errors
        row["errors"] = sum(1 for e in doc["errors"] if e)
    if row["errors"] is None and isinstance(row["num_prompts"], int) and isinstance(row["completed"], int):
        row["errors"] = max(row["num_prompts"] - row["completed"], 0)  # what did not complete failed
    for col, key in _METRICS:
        v = _num(doc.get(key))
        if v is None and "_p50_" in col:  # the median is the 50th percentile
            v = _num(doc.get(key.replace("p50_", "median_")))
        row[col] = v
    if row["completed"] == 0:  # vLLM writes 0.0 for every figure then: no measurement, not a fast one
        row.update({col: None for col in METRIC_COLUMNS})
    return row


def level_error(doc: dict, output: str, level: Level, base_url: str) -> SparkError | None:
    """A level in which no request completed (vLLM's bench still exits 0 and writes its JSON)."""
    if doc.get("completed") != 0:
        return None
    why, unreachable = failure_reason(output)
    if unreachable:
        return SparkError(f"the endpoint {base_url} did not answer the benchmark at concurrency "
                          f"{level.concurrency}: {why}", "sparkcluster status; sparkcluster logs")
    if "Unauthorized" in why or "401" in why:
        return InputError(f"the endpoint refused the benchmark's API key at concurrency {level.concurrency}: {why}",
                          "set VLLM_API_KEY to the key the cluster was started with (--env-file or the environment)")
    return SparkError(f"no request completed at concurrency {level.concurrency}: {why}",
                      f"read {level.name}.log in the run folder")


def decode_tok_s(row: dict) -> float | None:
    """Single-stream decode speed: 1000 / mean time per output token (excludes the first token)."""
    tpot = row.get("tpot_mean_ms")
    if tpot:
        return 1000.0 / tpot
    return row.get("output_tok_s")


# ---- the run folder ----------------------------------------------------------------------------


def runs_root(cluster: str) -> Path:
    return log.state_dir() / "bench" / cluster


def run_id(now: datetime | None = None) -> str:
    now = now or datetime.now(timezone.utc)
    return now.strftime("%Y%m%dT%H%M%SZ")


def new_run_dir(cluster: str, out: Path | None = None, now: datetime | None = None) -> Path:
    """The folder this run writes to (created). --out chooses it; it must be new or empty."""
    if out is not None:
        d = out.expanduser()
        if d.exists() and (not d.is_dir() or any(d.iterdir())):
            raise InputError(f"--out {d}: exists and is not an empty folder", "choose a new folder")
    else:
        base = runs_root(cluster)
        rid = run_id(now)
        d = base / rid
        n = 1
        while d.exists():  # two runs in one second
            n += 1
            d = base / f"{rid}-{n}"
    d.mkdir(parents=True, exist_ok=True)
    return d


def write_csv(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in COLUMNS})


def read_csv(path: Path) -> list[dict]:
    rows = []
    with path.open(newline="") as f:
        for raw in csv.DictReader(f):
            row: dict = {}
            for k, v in raw.items():
                if k is None:
                    continue
                if v in ("", None):
                    row[k] = None
                elif k in ("concurrency", "num_prompts", "input_len", "output_len", "completed", "errors"):
                    row[k] = int(float(v))
                else:
                    row[k] = _num(v)
            rows.append(row)
    return rows


def profile_hash(prof) -> str:
    # the validated fields, not the file's text: comments and key order change nothing served
    return hashlib.sha256(prof.model_dump_json().encode()).hexdigest()


def run_record(*, cluster: str, prof, image: str, image_id: str, vllm_version: str, nodes: dict,
               levels: list[Level], target: Target, started_at: str, finished_at: str,
               interrupted: bool, failed: str = "") -> dict:
    from . import __version__

    return {
        "cluster": cluster,
        "profile": prof.name,
        "profile_hash": profile_hash(prof),
        "profile_fields": prof.model_dump(mode="json"),
        "image": image,
        "image_id": image_id,
        "vllm_version": vllm_version,
        "nodes": nodes,
        "target": {"model": target.model, "tokenizer": target.tokenizer, "base_url": target.base_url},
        "levels": [asdict(lv) for lv in levels],
        "started_at": started_at,
        "finished_at": finished_at,
        "interrupted": interrupted,
        "failed": failed,
        "sparkcluster_version": __version__,
    }


def write_json(path: Path, doc) -> None:
    path.write_text(redact.mask(json.dumps(doc, indent=2)) + "\n")


def previous_run(root: Path, profile: str, exclude: Path | None = None) -> Path | None:
    """The newest earlier run folder under root that measured the same profile, with results."""
    if not root.is_dir():
        return None
    ex = exclude.resolve() if exclude else None
    for d in sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: p.name, reverse=True):
        if ex is not None and d.resolve() == ex:
            continue
        try:
            doc = json.loads((d / "run.json").read_text())
        except (OSError, ValueError):
            continue
        if doc.get("profile") == profile and (d / "results.csv").is_file():
            return d
    return None


def resolve_run(spec: str, root: Path) -> Path:
    """--compare RUN: a run folder, its results.csv, or a folder name under the cluster's runs."""
    p = Path(spec).expanduser()
    candidates = [p, p.parent if p.name == "results.csv" else None, root / spec]
    for c in candidates:
        if c is not None and (c / "results.csv").is_file():
            return c
    raise InputError(f"--compare {spec}: no results.csv there or under {root}",
                     f"give a run folder (ls {root})")


# ---- comparison --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    concurrency: int
    metric: str
    before: float | None
    after: float | None
    pct: float | None  # (after - before) / before, in percent
    regression: bool


def compare(before: list[dict], after: list[dict], tolerance_pct: float = 10.0) -> list[Change]:
    """Per level present in both runs and per figure: the change, and whether it is a regression
    (worse than the tolerance in the figure's bad direction; any new error is one)."""
    old = {r.get("concurrency"): r for r in before}
    out: list[Change] = []
    for r in after:
        c = r.get("concurrency")
        if c not in old:
            continue
        o = old[c]
        for m in ["errors", *METRIC_COLUMNS]:
            a, b = r.get(m), o.get(m)
            if a is None or b is None:
                out.append(Change(c, m, b, a, None, False))
                continue
            pct = (a - b) / b * 100.0 if b else (0.0 if a == b else None)
            if m == "errors":
                bad = a > b
            elif pct is None:
                bad = False
            elif m in HIGHER_IS_BETTER:
                bad = pct < -tolerance_pct
            else:
                bad = pct > tolerance_pct
            out.append(Change(c, m, b, a, pct, bad))
    return out


# ---- chart -------------------------------------------------------------------------------------


def write_chart(path: Path, rows: list[dict], title: str = "") -> str | None:
    """chart.png: output tok/s and p99 TTFT against concurrency. Returns why it was skipped, or None."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display on a controller over SSH
        import matplotlib.pyplot as plt
    except ImportError:
        return "no chart: matplotlib is not installed (pip install 'sparkcluster[plot]')"
    pts = sorted((r for r in rows if r.get("concurrency")), key=lambda r: r["concurrency"])  # levels in any order
    if not pts:
        return "no chart: no level was measured"
    xs = [r["concurrency"] for r in pts]
    fig, (ax1, ax2) = plt.subplots(2, 1, sharex=True, figsize=(7, 6))
    ax1.plot(xs, [r.get("output_tok_s") for r in pts], marker="o")
    ax1.set_ylabel("output tok/s")
    ax1.grid(True, alpha=0.3)
    ax2.plot(xs, [r.get("ttft_p99_ms") for r in pts], marker="o", color="tab:red")
    ax2.set_ylabel("p99 TTFT (ms)")
    ax2.set_xlabel("concurrency")
    ax2.grid(True, alpha=0.3)
    if len(set(xs)) > 1 and min(xs) > 0:
        ax2.set_xscale("log", base=2)
    ax2.set_xticks(xs, [str(x) for x in xs])
    if title:
        ax1.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


# ---- smoke: one short single-stream measurement (for `up --smoke`) -----------------------------

SMOKE_FLOOR = 0.7  # below 70% of the published figure: something is wrong, not run-to-run noise


def judge_smoke(tok_s: float | None, expected: float | None, floor: float = SMOKE_FLOOR) -> str:
    if tok_s is None:
        return "failed"
    if not expected:
        return "unknown"  # the profile states no published figure
    return "ok" if tok_s >= floor * expected else "slow"


def smoke(head: "Head", target: Target, secrets: dict[str, str], expected: float | None,
          output_len: int = 128, prompts: int = 3) -> tuple[float | None, float | None, str]:
    """A short single-stream run: (decode tok/s, the profile's expected figure, verdict)."""
    level = Level(1, prompts, 128, output_len)
    rid = "smoke-" + run_id()
    try:
        doc = head.run_level(level, target, secrets, rid).doc
        tok_s = decode_tok_s(row_from_result(doc, level))
    except Interrupted:  # the caller's own Ctrl-C handling applies (the level is already stopped)
        raise KeyboardInterrupt from None
    except SparkError as e:  # a smoke test warns; it never fails the `up` that already succeeded
        _log.warning("smoke measurement failed", error=e.message)
        tok_s = None
    finally:
        head.cleanup(rid)
    return tok_s, expected, judge_smoke(tok_s, expected)


def smoke_after_up(host, inv, prof, secrets: dict[str, str]) -> tuple[float | None, float | None, str]:
    """`up --smoke` in one call: host is the connected head (ssh.Host) `up` already holds."""
    from .labels import container_name

    head = Head(host, container_name(inv.cluster.name, "head", inv.head.name))
    return smoke(head, target_for(prof, inv.cluster.api_port), secrets, prof.expected_decode_tok_s)


def smoke_message(tok_s: float | None, expected: float | None, verdict: str) -> str:
    """One line for `up --smoke` to print (a warning unless the verdict is ok)."""
    if verdict == "failed":
        return "smoke: the single-stream measurement failed (sparkcluster bench -c 1 shows why)"
    got = f"{tok_s:.1f} tok/s single-stream decode"
    if verdict == "unknown":
        return f"smoke: {got} (the profile states no published figure to compare with)"
    if verdict == "slow":
        return (f"smoke: {got}, far below the {expected:g} tok/s published for this profile "
                f"(under {SMOKE_FLOOR:.0%}): check sparkcluster doctor (RoCE, MTU, NCCL falling back to TCP)")
    return f"smoke: {got} (published: {expected:g} tok/s)"


# ---- the sweep, driven through a Head ----------------------------------------------------------


class Interrupted(Exception):
    """Ctrl-C during a level: the level was stopped inside the container."""


@dataclass(frozen=True)
class LevelResult:
    doc: dict  # the parsed --save-result JSON
    raw: bytes  # the same file as vLLM wrote it
    output: str  # what the benchmark printed (secrets masked)


@dataclass
class Sweep:
    run_dir: Path
    rows: list[dict] = field(default_factory=list)
    interrupted: bool = False
    failed: str = ""  # why the sweep stopped early, else ""


def run_sweep(head: "Head", levels: list[Level], target: Target, secrets: dict[str, str], run_dir: Path,
              on_progress: Callable[[Level, int, int], None] | None = None) -> Sweep:
    """Each level in turn; its raw JSON lands in the run folder as soon as it is measured, so an
    interruption or a failed level keeps every level before it."""
    import secrets as _random

    sweep = Sweep(run_dir)
    # the folder in the container is this run's alone, whatever --out is called
    rid = f"{run_id()}-{_random.token_hex(3)}"
    try:
        for level in levels:
            res = head.run_level(level, target, secrets, rid, on_progress=on_progress)
            (run_dir / f"{level.name}.json").write_bytes(res.raw)
            (run_dir / f"{level.name}.log").write_text(res.output)
            sweep.rows.append(row_from_result(res.doc, level))
            if on_progress is not None:  # a level too quick for a poll still shows as done
                on_progress(level, level.num_prompts, level.num_prompts)
            err = level_error(res.doc, res.output, level, target.base_url)
            if err is not None:  # kept in the folder and the CSV (its errors column says it), then reported
                raise err
    except (Interrupted, KeyboardInterrupt):  # between levels nothing runs in the container
        sweep.interrupted = True
    except SparkError as e:
        sweep.failed = e.message
        raise
    finally:
        head.cleanup(rid)
    return sweep


# ---- the cluster side: the only calls into ssh/fanout/serve and the Docker API ----------------


NODE_FACTS = ("echo \"hostname=$(hostname)\"; echo \"kernel=$(uname -r)\"; "
              "echo \"gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)\"; "
              "echo \"mem_total_kb=$(awk '/^MemTotal/ {print $2}' /proc/meminfo)\"; "
              "echo \"docker=$(docker version --format '{{.Server.Version}}' 2>/dev/null)\"; true")
VLLM_VERSION = ("python3 -c 'import importlib.metadata as m; print(m.version(\"vllm\"))' 2>/dev/null "
                "|| vllm --version 2>/dev/null | tail -1")


def parse_facts(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        k, sep, v = line.partition("=")
        if sep and re.fullmatch(r"[a-z_]+", k):
            out[k] = v.strip()
    return out


class Head:
    """The head container, reached over an open SSH connection (ssh.Host) and its Docker API."""

    def __init__(self, host, container: str, poll_s: float = 0.5):
        self.host = host
        self.container = container
        self.api = host.docker().api
        self.poll_s = poll_s

    # -- state ---------------------------------------------------------------------------------

    def serving(self):
        """(serve.Record, container inspect) of the running server, or raise 'no cluster serving'."""
        import docker

        from . import serve

        fix = "start it with: sparkcluster up --profile NAME"
        try:
            info = self.api.inspect_container(self.container)
        except docker.errors.NotFound:
            raise SparkError(f"no cluster is serving: {self.host.name} has no container {self.container}", fix) from None
        except docker.errors.DockerException as e:
            raise SparkError(f"{self.host.name}: cannot ask its Docker engine about {self.container}: {e}",
                             "sparkcluster doctor shows why") from None
        if not info.get("State", {}).get("Running"):
            raise SparkError(f"no cluster is serving: {self.container} on {self.host.name} is not running", fix)
        rec = serve.read_record(self.api, self.container)
        if rec is None or not serve.running(self.api, rec):
            raise SparkError(f"no cluster is serving: vllm serve is not running in {self.container}",
                             "sparkcluster up --profile NAME starts it; sparkcluster logs shows why it stopped")
        return rec, info

    def image(self, info: dict) -> tuple[str, str]:
        return info.get("Config", {}).get("Image", ""), info.get("Image", "")

    def vllm_version(self) -> str:
        code, out = self._exec(["sh", "-c", VLLM_VERSION], {})
        return out.strip().splitlines()[-1] if code == 0 and out.strip() else ""

    # -- one level -------------------------------------------------------------------------------

    def run_level(self, level: Level, target: Target, secrets: dict[str, str], rid: str,
                  on_progress: Callable[[Level, int, int], None] | None = None) -> LevelResult:
        """Run one level to the end. Ctrl-C stops it and raises Interrupted; a failed benchmark
        raises SparkError with its last lines."""
        folder = level_dir(rid, level)
        argv = exec_argv(folder, bench_argv(level, target, folder))
        _log.info("bench level", command=describe(level, target, folder, self.container, secrets))
        ex = self.api.exec_create(self.container, argv, environment=exec_env(secrets), stdout=False, stderr=False)
        try:
            self.api.exec_start(ex["Id"], detach=True)
            code = self._wait(ex["Id"], level, folder, on_progress)
        except KeyboardInterrupt:
            self.stop(folder)
            raise Interrupted() from None
        output = redact.mask(self._read(f"{folder}/{LOG_FILE}").decode(errors="replace"))
        if code != 0:
            why, unreachable = failure_reason(output)
            tail = [ln for ln in output.replace("\r", "\n").splitlines() if ln.strip()][-8:]
            if unreachable:
                raise SparkError(f"the endpoint {target.base_url} did not answer the benchmark at concurrency "
                                 f"{level.concurrency}: {why}", "sparkcluster status; sparkcluster logs "
                                 f"{self.host.name}", details=tail)
            if code == 127:  # the shell found no `vllm` to exec
                raise SparkError(f"{self.container} has no `vllm` command on its PATH: {why}",
                                 "the profile's image must ship vLLM (NGC vllm images and vllm-openai do)")
            raise SparkError(f"vllm bench serve failed at concurrency {level.concurrency} (exit {code}): {why}",
                             "see the lines above; the levels before it are kept", details=tail)
        try:
            raw = self._read(f"{folder}/{RESULT_FILE}")
            doc = json.loads(raw)
        except (ValueError, SparkError) as e:
            raise SparkError(f"vllm bench serve wrote no readable result at concurrency {level.concurrency}: {e}",
                             "run it again with -vv and read the debug log") from None
        return LevelResult(doc, raw, output)

    def _wait(self, exec_id: str, level: Level, folder: str, on_progress) -> int:
        last = None
        while True:
            info = self.api.exec_inspect(exec_id)
            if on_progress is not None:
                try:
                    p = progress(self._read(f"{folder}/{LOG_FILE}").decode(errors="replace"))
                except SparkError:
                    p = None  # not written yet
                if p and p != last:
                    last = p
                    on_progress(level, *p)
            if not info.get("Running"):
                return info.get("ExitCode", 1) if info.get("ExitCode") is not None else 1
            time.sleep(self.poll_s)

    def stop(self, folder: str) -> None:
        """Ctrl-C: `docker exec` forwarded nothing, so interrupt the benchmark by its PID."""
        try:
            self._exec(stop_argv(folder), {})
        except Exception as e:  # best effort: the user asked to stop, report what we could not do
            _log.warning("could not stop the benchmark in the container", error=str(e))

    def cleanup(self, rid: str) -> None:
        if not _RUN_ID.match(rid):
            return
        try:
            self._exec(["rm", "-rf", "--", str(PurePosixPath(CONTAINER_ROOT) / rid)], {})
        except Exception as e:  # leftovers in /tmp of the container harm nothing
            _log.info("could not remove the container's bench folder", error=str(e))

    # -- primitives ------------------------------------------------------------------------------

    def _exec(self, argv: list[str], env: dict[str, str]) -> tuple[int, str]:
        """A short command in the head container, to its end (the Docker API client's timeout bounds it)."""
        ex = self.api.exec_create(self.container, argv, environment=env)
        out = self.api.exec_start(ex["Id"]).decode(errors="replace")
        return self.api.exec_inspect(ex["Id"]).get("ExitCode", 1), out

    def _read(self, path: str) -> bytes:
        import docker

        try:
            stream, _ = self.api.get_archive(self.container, path)
        except docker.errors.NotFound:
            raise SparkError(f"{path}: no such file in {self.container}") from None
        data = b"".join(stream)
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            member = tar.getmembers()[0]
            f = tar.extractfile(member)
            return f.read() if f else b""


def node_facts(cluster) -> dict[str, dict]:
    """A few facts per node for run.json; an unreachable node is recorded as such."""
    out: dict[str, dict] = {}
    res = cluster.each(lambda h: h.run(NODE_FACTS, timeout=20))
    for name, o in res.items():
        out[name] = parse_facts(o.value.stdout) if o.ok else {"error": str(o.error)}
    return out


def connect(inv):
    """The cluster's hosts (fanout.Cluster); the head must answer, a worker may not."""
    from .fanout import Cluster, connect_all

    res = connect_all(inv)
    if inv.head.name in res.failed:
        for h in res.succeeded.values():
            h.close()
        raise res.failed[inv.head.name]  # a ConnectError names the head and the fix
    return Cluster(inv, res.succeeded)


def head_for(cluster, inv) -> Head:
    from .labels import container_name

    return Head(cluster.hosts[inv.head.name], container_name(inv.cluster.name, "head", inv.head.name))


def check_endpoint(address: str, target: Target, port: int, secrets: dict[str, str]) -> None:
    """From the controller, before any level: the endpoint answers and takes our key."""
    import httpx

    from . import serve

    base = f"http://{address}:{port}"
    with httpx.Client() as client:
        code = serve.health(client, base)
        if code != 200:
            raise SparkError(f"the endpoint {base} does not answer (/health: {code or 'no answer'})",
                             "sparkcluster status shows what is down; sparkcluster logs shows why")
        ok, why = serve.one_token(client, base, target.model, serve.headers(secrets), timeout=60)
    if ok:
        return
    if "HTTP 401" in why:
        raise InputError(f"the endpoint {base} refuses the API key: {why}",
                         "set VLLM_API_KEY to the key the cluster was started with (--env-file or the environment)")
    if why.startswith("completion answered HTTP"):
        # an answer is an endpoint that works; the chat route may be what it refuses (a model without
        # a chat template) while the benchmark's /v1/completions is fine: let the level say
        _log.warning("chat completion refused before the benchmark", reason=why)
        return
    raise SparkError(f"the endpoint {base} answers /health but not a completion: {why}",
                     "sparkcluster status; sparkcluster logs")
