"""The sweep and the exact command lines run inside the head container: the concurrency levels
(`plan`), the `vllm bench serve` argv for one level (`bench_argv`), and the `docker exec` argv
that launches it, records its PID and stops it (`exec_argv`, `exec_env`, `stop_argv`). Pure.

The API key reaches the benchmark only in the exec's environment (`OPENAI_API_KEY`, which
vllm/benchmarks/lib/endpoint_request_func.py turns into the Authorization header), never argv.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import PurePosixPath

from sparkcluster import redact
from sparkcluster.bench.prompts import PromptSet
from sparkcluster.config.flags import reached_at
from sparkcluster.errors import InputError

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
    # "-r2" for a level's second repetition (`--repeat`), "-2" for a second level at one concurrency
    suffix: str = ""

    @property
    def name(self) -> str:
        return f"c{self.concurrency}{self.suffix}"


def parse_concurrency(text: str) -> tuple[int, ...]:
    """'1,2,4' -> (1, 2, 4), in the order given, duplicates refused."""
    parts = [p.strip() for p in str(text).split(",")]
    if not parts or any(p == "" for p in parts):
        raise InputError(
            f"--concurrency {text!r}: give a comma-separated list of positive integers", "e.g. --concurrency 1,4,16"
        )
    out: list[int] = []
    for p in parts:
        if not re.fullmatch(r"[0-9]+", p):
            raise InputError(f"--concurrency {text!r}: {p!r} is not a positive integer", "e.g. --concurrency 1,4,16")
        n = int(p)
        if n < 1:
            raise InputError(
                f"--concurrency {text!r}: a concurrency of {n} sends no request",
                "use 1 or more, e.g. --concurrency 1,4,16",
            )
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


def plan(
    concurrency: Iterable[int],
    input_len: int = DEFAULT_INPUT_LEN,
    output_len: int = DEFAULT_OUTPUT_LEN,
    num_prompts: int | None = None,
) -> list[Level]:
    for name, v in (("--input-len", input_len), ("--output-len", output_len)):
        if v < 1:
            raise InputError(f"{name} {v}: must be at least 1", f"e.g. {name} 128")
    if num_prompts is not None and num_prompts < 1:
        raise InputError(f"--num-prompts {num_prompts}: must be at least 1", "e.g. --num-prompts 64, or leave it out")
    levels = [Level(c, num_prompts or prompts_for(c), input_len, output_len) for c in concurrency]
    if not levels:
        raise InputError("no concurrency level to measure", "e.g. --concurrency 1,4,16")
    return levels


def repeated(levels: list[Level], repeat: int = 1) -> list[Level]:
    """Each level `repeat` times in a row, every one with a name of its own (its run folder files)."""
    if not 1 <= repeat <= 20:
        raise InputError(f"--repeat {repeat}: must be 1 to 20", "e.g. --repeat 3")
    out: list[Level] = []
    seen: dict[str, int] = {}
    for lv in levels:
        n = seen[lv.name] = seen.get(lv.name, 0) + 1
        base = replace(lv, suffix=f"-{n}") if n > 1 else lv
        out += [replace(base, suffix=base.suffix + (f"-r{i}" if i > 1 else "")) for i in range(1, repeat + 1)]
    return out


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


def target_for(prof, api_port: int, tokenizer: str | None = None, bind: str | None = None) -> Target:
    """The served endpoint seen from inside the head container (host networking); `bind`: the
    address the engine listens on (flags.engine_host), else the profile's serve.host."""
    s = prof.serve
    port = s.port or api_port
    host = reached_at(bind or s.host)
    return Target(
        f"http://{host}:{port}", prof.served_model_name, tokenizer or prof.model, prof.serve.trust_remote_code
    )


def arg_value(name: str, v: str) -> str:
    # a value vLLM's argparse takes as a flag (a leading '-') still binds in the --flag=value form;
    # NUL cannot cross exec, a newline would forge lines in bench.log
    if "\x00" in v or "\n" in v or "\r" in v:
        raise InputError(f"{name}: value may not contain a NUL or newline", "check the profile / option")
    if v in ("", "--"):  # argparse drops a lone "--" even in --flag=-- form, leaving the flag empty
        raise InputError(f"{name}: {v!r} is not a usable value", "check the profile / option")
    return f"{name}={v}"


def bench_argv(
    level: Level, target: Target, result_dir: str, seed: int = 0, prompts: PromptSet | None = None
) -> list[str]:
    """The exact `vllm bench serve` argv for one level. Every value is in --flag=value form.
    `prompts` (bench/prompts.PromptSet): the record's dataset where the run sends it, else random."""
    dataset = (prompts or PromptSet()).argv(level.input_len, level.output_len)
    argv = [
        "vllm",
        "bench",
        "serve",
        "--backend=vllm",
        arg_value("--base-url", target.base_url),
        "--endpoint=/v1/completions",
        arg_value("--model", target.model),
        arg_value("--tokenizer", target.tokenizer),
        *dataset,
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
    script = (
        'alive() { s=$(sed "s/.*) //" "/proc/$1/stat" 2>/dev/null | cut -c1); [ -n "$s" ] && [ "$s" != Z ]; }; '
        'p=$(cat "$1/pid" 2>/dev/null) || exit 0; [ -n "$p" ] || exit 0; kill -INT "$p" 2>/dev/null || exit 0; '
        f'i=0; while alive "$p"; do i=$((i+1)); [ $i -gt {ticks} ] && {{ kill -KILL "$p"; exit 0; }}; '
        "sleep 0.1; done"
    )
    return ["sh", "-c", script, "sh", folder]


def describe(
    level: Level, target: Target, folder: str, container: str, secrets: dict[str, str], prompts: PromptSet | None = None
) -> str:
    """The command as a user could type it (for logs and errors): secrets by name only."""
    import shlex

    env = " ".join(f"-e {k}=******" if k == "OPENAI_API_KEY" else f"-e {k}={v}" for k, v in exec_env(secrets).items())
    argv = bench_argv(level, target, folder, prompts=prompts)
    return redact.mask(f"docker exec {env} {container} " + shlex.join(argv))


def venv_setup_argv(venv: str, module: str, requirement: str, pip_index_url: str | None = None) -> list[str]:
    """Install `requirement` once in a virtualenv of its own at `venv` in the head container (a no-op
    when `module` imports there already): the harnesses that pin what the image's Python cannot hold."""
    index = f" --index-url {shlex.quote(pip_index_url)}" if pip_index_url else ""
    script = (
        f"test -x {venv}/bin/python && {venv}/bin/python -c 'import {module}' 2>/dev/null || "
        f"{{ python3 -m venv {venv} && {venv}/bin/pip install -q{index} {requirement}; }}"
    )
    return ["sh", "-c", script]
