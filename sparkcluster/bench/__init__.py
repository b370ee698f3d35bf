"""`sparkcluster bench`: throughput and latency of the serving cluster, measured by vLLM's own
`vllm bench serve` inside the head container, one concurrency level at a time.

The pure parts: `sweep` (the levels, the exact argv) and `results` (a level's output and JSON
turned into a row, the CSV, the run folder, the comparison with an earlier run, the chart); they
are unit-tested against output captured from a real `vllm bench serve`. The cluster side is
`runner` (the `Head` class: the only code here that talks to the head, over `ssh`/`fanout` and the
Docker API, so the one place to adapt when those change); `smoke` is `up --smoke`'s measurement.
Every public name is re-exported here: `sparkcluster.bench.X` is the name callers use.

Why inside the head container: the image already has `vllm bench`, the tokenizer is in the mounted
HF cache, and the requests do not cross the controller's network, which is not what is measured.
"""

import time  # re-exported: tests patch `bench.time.sleep` (the module runner.Head polls with)

from sparkcluster.bench.results import (
    COLUMNS,
    HIGHER_IS_BETTER,
    METRIC_COLUMNS,
    Change,
    compare,
    decode_tok_s,
    failure_reason,
    level_error,
    new_run_dir,
    previous_run,
    profile_hash,
    progress,
    read_csv,
    resolve_run,
    row_from_result,
    run_id,
    run_record,
    runs_root,
    write_chart,
    write_csv,
    write_json,
)
from sparkcluster.bench.runner import (
    NODE_FACTS,
    VLLM_VERSION,
    Head,
    Interrupted,
    LevelResult,
    Sweep,
    check_endpoint,
    connect,
    head_for,
    node_facts,
    parse_facts,
    run_sweep,
)
from sparkcluster.bench.smoke import SMOKE_FLOOR, judge_smoke, smoke, smoke_after_up, smoke_message
from sparkcluster.bench.sweep import (
    CONTAINER_ROOT,
    DEFAULT_CONCURRENCY,
    DEFAULT_INPUT_LEN,
    DEFAULT_OUTPUT_LEN,
    LAUNCH,
    LOG_FILE,
    MAX_CONCURRENCY,
    METRIC_PERCENTILES,
    MIN_PROMPTS,
    PERCENTILE_METRICS,
    RESULT_FILE,
    Level,
    Target,
    arg_value,
    bench_argv,
    describe,
    exec_argv,
    exec_env,
    level_dir,
    parse_concurrency,
    plan,
    prompts_for,
    stop_argv,
    target_for,
)

__all__ = [
    # sweep
    "DEFAULT_CONCURRENCY",
    "DEFAULT_INPUT_LEN",
    "DEFAULT_OUTPUT_LEN",
    "MAX_CONCURRENCY",
    "MIN_PROMPTS",
    "Level",
    "parse_concurrency",
    "prompts_for",
    "plan",
    "CONTAINER_ROOT",
    "RESULT_FILE",
    "LOG_FILE",
    "PERCENTILE_METRICS",
    "METRIC_PERCENTILES",
    "LAUNCH",
    "Target",
    "target_for",
    "arg_value",
    "bench_argv",
    "level_dir",
    "exec_argv",
    "exec_env",
    "stop_argv",
    "describe",
    # results
    "progress",
    "failure_reason",
    "COLUMNS",
    "METRIC_COLUMNS",
    "HIGHER_IS_BETTER",
    "row_from_result",
    "level_error",
    "decode_tok_s",
    "runs_root",
    "run_id",
    "new_run_dir",
    "write_csv",
    "read_csv",
    "profile_hash",
    "run_record",
    "write_json",
    "previous_run",
    "resolve_run",
    "Change",
    "compare",
    "write_chart",
    # smoke
    "SMOKE_FLOOR",
    "judge_smoke",
    "smoke",
    "smoke_after_up",
    "smoke_message",
    # runner
    "Interrupted",
    "LevelResult",
    "Sweep",
    "run_sweep",
    "NODE_FACTS",
    "VLLM_VERSION",
    "parse_facts",
    "Head",
    "node_facts",
    "connect",
    "head_for",
    "check_endpoint",
    "time",
]
