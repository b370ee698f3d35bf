"""NVIDIA's aiperf (ai-dynamo/aiperf 0.13.0), the harness of NVIDIA's performance.yaml records, run only
when asked (`--harness aiperf`: it brings some 138 packages): installed once in a virtualenv of its own
inside the head container (never into the image's Python), one run per level, its JSON summary read into
the same row as `vllm bench serve`'s. Pure: the argv and the parsing.

What is passed, from aiperf 0.13.0's own `config/flags/cli_config.py`: `--endpoint-type completions`
(`/v1/completions`, as vLLM's bench here: no chat template, so the prompt is the level's length)
with `--streaming`, synthetic prompts of `--isl` tokens and answers of `--osl` (`--extra-inputs
ignore_eos:true,min_tokens:N`, as vLLM's bench with `--ignore-eos`), `--concurrency`, `--request-count`
(the level's prompts, no warm-up), `--random-seed 0`, `--tokenizer` the model's folder in the mounted
cache, `--ui-type none`, no GPU telemetry or server-metrics scraping, and `--output-artifact-dir`.
Its `--api-key` is read from the command line only (0.13.0 reads `OPENAI_API_KEY` solely to restore a
key its own subprocess runner redacted): the launcher below appends it inside the Python process from
the exec's environment, so `ps` never shows it; aiperf's export redacts it. The tokenizer is named as
the HF cache names it (a repo id: the profile's model): with HF_HUB_OFFLINE=1, as every level runs,
aiperf 0.13.0 looks a tokenizer up only through `snapshot_download(local_files_only=True)`, which refuses
a folder path (seen: "Repo id must be in the form 'repo_name' or 'namespace/repo_name'").

Its summary (`profile_export_aiperf.json` in the artifact folder, `JsonExportData`, schema 1.x): one
object per metric tag with `unit`, `avg`, `p50`, `p99`, ... in display units (ms, sec, tokens/sec;
`error_request_count` absent when no request failed);
`output_token_throughput_per_user` is the per-request decode rate (tokens after the first over the time
after the first), `prefill_throughput_per_user` the prompt tokens over the time to first token.
"""

from __future__ import annotations

import math

from sparkcluster.bench.sweep import Level, Target, arg_value, venv_setup_argv

VERSION = "0.13.0"
VENV = "/tmp/sparkcluster-aiperf"
ARTIFACTS = "aiperf"  # the artifact folder, inside the level's folder
EXPORT_FILE = "profile_export_aiperf.json"
# the key joins argv inside the process (never on the exec's command line), then aiperf runs as its
# console script (aiperf.cli:app) would
LAUNCHER = (
    "import os, sys; k = os.environ.get('OPENAI_API_KEY'); "
    "sys.argv = ['aiperf', *sys.argv[1:], *(['--api-key', k] if k else [])]; "
    "from aiperf.cli import app; app()"
)


def setup_argv(pip_index_url: str | None = None) -> list[str]:
    """Install aiperf once in its own virtualenv in the head container (a no-op when there)."""
    return venv_setup_argv(VENV, "aiperf", f"aiperf=={VERSION}", pip_index_url)


def result_path(folder: str) -> str:
    """Where aiperf writes its summary for a level run in `folder`."""
    return f"{folder}/{ARTIFACTS}/{EXPORT_FILE}"


def bench_argv(level: Level, target: Target, folder: str, model: str | None = None) -> list[str]:
    """The exact aiperf argv for one level (the key is added inside the process)."""
    n_out = int(level.output_len)
    argv = [
        f"{VENV}/bin/python",
        "-c",
        LAUNCHER,
        "profile",
        arg_value("--model", model or target.model),
        arg_value("--url", target.base_url),
        "--endpoint-type",
        "completions",
        "--streaming",
        arg_value("--tokenizer", target.tokenizer),
        *(["--tokenizer-trust-remote-code"] if target.trust_remote_code else []),
        "--isl",
        str(int(level.input_len)),
        "--isl-stddev",
        "0",
        "--osl",
        str(n_out),
        "--osl-stddev",
        "0",
        arg_value("--extra-inputs", f"ignore_eos:true,min_tokens:{n_out}"),
        "--concurrency",
        str(int(level.concurrency)),
        "--request-count",
        str(int(level.num_prompts)),
        "--random-seed",
        "0",
        "--ui-type",
        "none",
        "--no-gpu-telemetry",
        "--no-server-metrics",
        arg_value("--output-artifact-dir", f"{folder}/{ARTIFACTS}"),
    ]
    return argv


def _stat(doc: dict, tag: str, stat: str = "avg") -> float | None:
    m = doc.get(tag)
    v = m.get(stat) if isinstance(m, dict) else None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        return None
    return float(v)


def _count(doc: dict, tag: str) -> int | None:
    v = _stat(doc, tag)
    return int(v) if v is not None else (0 if isinstance(doc.get(tag), dict) else None)


def row_from_result(doc: dict, level: Level) -> dict:
    """One level's aiperf summary as the CSV row `vllm bench serve`'s level gives (results.COLUMNS),
    plus `prefill_tok_s` (aiperf measures it per request itself)."""
    if not isinstance(doc, dict):
        raise ValueError("aiperf's summary must be a JSON object")
    completed = _count(doc, "request_count")
    errors = _count(doc, "error_request_count")
    if errors is None and completed is not None:
        errors = 0  # aiperf leaves the metric out when no request failed
    decode = _stat(doc, "output_token_throughput_per_user")
    return {
        "concurrency": level.concurrency,
        "num_prompts": level.num_prompts,
        "input_len": level.input_len,
        "output_len": level.output_len,
        "completed": completed if completed is not None else 0,
        "errors": errors,
        "duration_s": _stat(doc, "benchmark_duration"),
        "request_throughput": _stat(doc, "request_throughput"),
        "output_tok_s": _stat(doc, "output_token_throughput"),
        "total_tok_s": _stat(doc, "total_token_throughput"),
        "ttft_mean_ms": _stat(doc, "time_to_first_token"),
        "ttft_p50_ms": _stat(doc, "time_to_first_token", "p50"),
        "ttft_p99_ms": _stat(doc, "time_to_first_token", "p99"),
        # vLLM's TPOT is the time per output token after the first, per request: aiperf's per-user rate
        "tpot_mean_ms": 1000.0 / decode if decode else None,
        "itl_mean_ms": _stat(doc, "inter_token_latency"),
        "itl_p50_ms": _stat(doc, "inter_token_latency", "p50"),
        "itl_p99_ms": _stat(doc, "inter_token_latency", "p99"),
        "e2el_mean_ms": _stat(doc, "request_latency"),
        "e2el_p50_ms": _stat(doc, "request_latency", "p50"),
        "e2el_p99_ms": _stat(doc, "request_latency", "p99"),
        "prefill_tok_s": _stat(doc, "prefill_throughput_per_user"),
        "power_w": None,  # the level's energy: the sweep's (bench/power)
        "j_per_1k_out": None,
    }
