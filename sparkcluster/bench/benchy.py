"""llama-benchy (eugr/llama-benchy 0.4.0), the harness the Spark community's tables use, run for a
record that names it: installed once in a virtualenv of its own inside the head container (it pins a
`transformers` newer than vLLM's, so never into the image's Python), one run per level, its JSON read
into the same row as `vllm bench serve`'s. Pure: the argv and the parsing.

What is passed, from llama-benchy 0.4.0's own `config.py`: `--pp` prompt tokens, `--tg` generated
tokens with `--exact-tg` (min_tokens and ignore_eos, as vLLM's bench with `--ignore-eos`), `--depth 0`,
`--concurrency`, `--runs`, `--skip-coherence` (its check expects a real model's "Paris"), `--no-cache`,
`--format json --save-result FILE`. Its `--api-key` takes the key on the command line only: the
launcher below appends it inside the Python process from the exec's environment, so `ps` never shows
it. Its prompts come from a book (`--book-url`, Project Gutenberg by default, cached under
`~/.cache/llama-benchy` in the container after the first download).

The figures, from its results.py (`BenchmarkRun`): `pp_req_throughput` is prefill tok/s per request,
`tg_req_throughput` decode tok/s per request, `tg_throughput` the generation rate of all requests,
`e2e_ttft` the time to first token in ms; each a mean over its `--runs`.
"""

from __future__ import annotations

from sparkcluster.bench.sweep import Level, Target, arg_value, venv_setup_argv

VERSION = "0.4.0"
VENV = "/tmp/sparkcluster-llama-benchy"
# the key joins argv inside the process (never on the exec's command line), then llama-benchy runs as
# its console script would
LAUNCHER = (
    "import os, runpy, sys; k = os.environ.get('OPENAI_API_KEY'); "
    "sys.argv = ['llama-benchy', *sys.argv[1:], *(['--api-key', k] if k else [])]; "
    "runpy.run_module('llama_benchy', run_name='__main__', alter_sys=True)"
)


def setup_argv(pip_index_url: str | None = None) -> list[str]:
    """Install llama-benchy once in its own virtualenv in the head container (a no-op when there)."""
    return venv_setup_argv(VENV, "llama_benchy", f"llama-benchy=={VERSION}", pip_index_url)


def bench_argv(level: Level, target: Target, result_file: str, runs: int = 3, model: str | None = None) -> list[str]:
    """The exact llama-benchy argv for one level (the key is added inside the process)."""
    argv = [
        f"{VENV}/bin/python",
        "-c",
        LAUNCHER,
        arg_value("--base-url", target.base_url + "/v1"),
        arg_value("--model", model or target.tokenizer),
        arg_value("--served-model-name", target.model),
        arg_value("--tokenizer", target.tokenizer),
        "--pp",
        str(int(level.input_len)),
        "--tg",
        str(int(level.output_len)),
        "--exact-tg",
        "--depth",
        "0",
        "--concurrency",
        str(int(level.concurrency)),
        "--runs",
        str(int(runs)),
        "--skip-coherence",
        "--no-cache",
        "--format",
        "json",
        arg_value("--save-result", result_file),
    ]
    return argv


def _mean(doc: dict, key: str) -> float | None:
    m = doc.get(key)
    if isinstance(m, dict) and isinstance(m.get("mean"), (int, float)) and m["mean"] > 0:
        return float(m["mean"])
    return None


def row_from_result(doc: dict, level: Level) -> dict:
    """One level's llama-benchy JSON as the CSV row `vllm bench serve`'s level gives (results.COLUMNS),
    plus `prefill_tok_s` (llama-benchy measures it per request itself)."""
    runs = [b for b in doc.get("benchmarks") or [] if not b.get("is_context_prefill_phase")]
    run = next(
        (b for b in runs if b.get("concurrency") == level.concurrency and b.get("prompt_size") == level.input_len),
        runs[0] if runs else {},
    )
    decode = _mean(run, "tg_req_throughput")
    values = (run.get("tg_req_throughput") or {}).get("values") or []
    ttft = _mean(run, "e2e_ttft")
    row = {
        "concurrency": level.concurrency,
        "num_prompts": len(values) or None,
        "input_len": level.input_len,
        "output_len": level.output_len,
        "completed": len(values) if run else 0,
        "errors": 0 if run else None,
        "duration_s": None,
        "output_tok_s": _mean(run, "tg_throughput"),
        "tpot_mean_ms": 1000.0 / decode if decode else None,
        "ttft_mean_ms": ttft,
        "prefill_tok_s": _mean(run, "pp_req_throughput"),
    }
    return row
