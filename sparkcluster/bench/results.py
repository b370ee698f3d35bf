"""What a level leaves behind, turned into results: the benchmark's output (progress, why it
failed), its `--save-result` JSON turned into a CSV row, the run folder (CSV, run.json, earlier
runs), the comparison with an earlier run, and the chart. Pure apart from the run folder's files;
unit-tested against output captured from a real `vllm bench serve`.
"""

from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from sparkcluster import __version__, log, redact
from sparkcluster.bench.sweep import Level, Target
from sparkcluster.config.profile import profile_hash
from sparkcluster.errors import InputError, SparkError

# ---- what the benchmark printed ----------------------------------------------------------------

_TQDM = re.compile(r"(\d+)/(\d+) \[")


def progress(text: str) -> tuple[int, int] | None:
    """The last 'done/total' of tqdm's bar in the benchmark's output, or None before it starts."""
    m = None
    for found in _TQDM.finditer(text[-4096:]):
        m = found
    return (int(m.group(1)), int(m.group(2))) if m else None


def failure_reason(output: str) -> tuple[str, bool]:
    """(one line for the user, whether the endpoint did not answer) from a failed level's output."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    unreachable = re.search(
        r"Cannot connect to host|Connection refused|ClientConnectorError|"
        r"Server disconnected|All connection attempts failed",
        output,
    )
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

COLUMNS: list[str] = [
    "concurrency",
    "num_prompts",
    "input_len",
    "output_len",
    "completed",
    "errors",
    "duration_s",
    *[c for c, _ in _METRICS],
    # the deployment's mean GPU power while the level ran and its energy per 1,000 output tokens
    # (bench/power; empty where no node reads its power)
    "power_w",
    "j_per_1k_out",
]
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
    row.update(power_w=None, j_per_1k_out=None)  # the level's energy: the sweep's (bench/power)
    return row


def level_error(doc: dict, output: str, level: Level, base_url: str) -> SparkError | None:
    """A level in which no request completed (vLLM's bench still exits 0 and writes its JSON)."""
    if doc.get("completed") != 0:
        return None
    why, unreachable = failure_reason(output)
    if unreachable:
        return SparkError(
            f"the endpoint {base_url} did not answer the benchmark at concurrency {level.concurrency}: {why}",
            "sparkcluster status; sparkcluster logs",
        )
    if "Unauthorized" in why or "401" in why:
        return InputError(
            f"the endpoint refused the benchmark's API key at concurrency {level.concurrency}: {why}",
            f"set VLLM_API_KEY to the key the cluster was started with: {redact.set_fix('VLLM_API_KEY')}",
        )
    return SparkError(
        f"no request completed at concurrency {level.concurrency}: {why}", f"read {level.name}.log in the run folder"
    )


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
    now = now or datetime.now(UTC)
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


def run_record(
    *,
    cluster: str,
    prof,
    image: str,
    image_id: str,
    vllm_version: str,
    nodes: dict,
    levels: list[Level],
    target: Target,
    started_at: str,
    finished_at: str,
    interrupted: bool,
    failed: str = "",
) -> dict:
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
    raise InputError(f"--compare {spec}: no results.csv there or under {root}", f"give a run folder (ls {root})")


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


NO_MATPLOTLIB = "matplotlib is not installed (pip install 'sparkcluster[plot]')"


def pyplot():
    """matplotlib's pyplot drawing to files only, or None where matplotlib is not installed: every
    chart bench draws (chart.png, against.png) starts here and ends in `save`."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display on a controller over SSH
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def save(plt, fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_chart(path: Path, rows: list[dict], title: str = "") -> str | None:
    """chart.png: output tok/s and p99 TTFT against concurrency. Returns why it was skipped, or None."""
    plt = pyplot()
    if plt is None:
        return f"no chart: {NO_MATPLOTLIB}"
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
    save(plt, fig, path)
    return None
