"""What `status` reads inside a sparkcluster container, as one script of sections: on the head the
server's record and whether its PID still runs, the supervisor's state, its last journal entries
and the last canary check; on every node the telling lines of its ranks' NCCL files.

Who runs it: the node's agent, when the node itself asks (`GET /status` on its report endpoint,
answered only to the node's own address), so that `status` costs a process start in the container
rather than a `docker exec` (the daemon's round trip, 0.15-0.3 s on a busy node); or `docker exec`,
where no agent answers it (a container made by an earlier sparkcluster). One script either way.

Standard library only: this file is shipped into every container."""

from __future__ import annotations

import shlex
import subprocess

from . import engine_log
from .contract import CANARY_CHECK_PATH, JOURNAL_PATH, NCCL_LOG_DIR, RECORD_PATH, SERVE_LOG, SERVER_ALIVE_SH, STATE_PATH
from .sections import section

# only the lines that say what NCCL chose (and its warnings), from the newest files: a rank of an
# earlier server leaves its file behind until the container goes
NCCL_WANTED = r"NCCL version|Using network|NET/IB : |NET/Socket : |via |NCCL WARN|nRanks|Init COMPLETE"
NCCL_MAX_FILES = 16
NCCL_MAX_LINES = 600
JOURNAL_TAIL = 5
WHOLE = "whole"  # the last section: an answer that has it was not cut short
READ_S = 5.0  # the agent's bound on one run (the controller's round trip has its own)


def nccl_reader() -> str:
    """Shell: the newest NCCL files' telling lines (each line already carries its host and PID)."""
    return (
        f"ls -t {NCCL_LOG_DIR}/nccl.*.log 2>/dev/null | head -n {NCCL_MAX_FILES} | "
        f"xargs -r grep -h -E {shlex.quote(NCCL_WANTED)} | tail -n {NCCL_MAX_LINES}"
    )


ENGINE_MAX_LINES = 400
ENV_LINE = "ENV "


def engine_reader() -> str:
    """Shell: the variables that ask the engine for an all-reduce backend (`ENV NAME=value` lines, as
    the container runs them), then this start's telling lines of the serve log (node/engine_log: each
    rank's all-reduce backend and warm-up phase), the newest last."""
    env = "; ".join(f"printf '{ENV_LINE}{k}=%s\\n' \"${{{k}:-}}\"" for k in engine_log.ASKS)
    log, mark, wanted = shlex.quote(SERVE_LOG), shlex.quote(engine_log.SERVE_MARK), shlex.quote(engine_log.WANTED)
    return (
        f"{env}; [ -r {log} ] || exit 0; n=$(grep -F -n {mark} {log} | tail -n 1 | cut -d: -f1); "
        f"tail -n +$(( ${{n:-0}} + 1 )) {log} | grep -E {wanted} | tail -n {ENGINE_MAX_LINES}; true"
    )


def engine_text(out: str) -> tuple[dict[str, str], str]:
    """The engine section as (the variables, the log's lines)."""
    env, lines = {}, []
    for line in out.splitlines():
        if line.startswith(ENV_LINE):
            k, _, v = line[len(ENV_LINE) :].partition("=")
            env[k] = v
        else:
            lines.append(line)
    return env, "\n".join(lines)


def script(head: bool) -> str:
    """The sections, for the head's container or a worker's."""
    parts = (
        [
            section("record", f"cat {RECORD_PATH}"),
            section("alive", SERVER_ALIVE_SH),
            section("supervisor", f"cat {STATE_PATH}"),
            section("journal", f"tail -n {JOURNAL_TAIL} {JOURNAL_PATH}"),
            section("canary", f"cat {CANARY_CHECK_PATH}"),
        ]
        if head
        else []
    )
    engine = section("engine", engine_reader())
    return "\n".join([*parts, section("nccl", nccl_reader()), engine, section(WHOLE, "true")]) + "\n"


def read(head: bool) -> str:
    """What the script prints, run here (the agent's `/status`); cut short at READ_S, which the
    missing last section then says."""
    try:
        return subprocess.run(
            ["sh", "-c", script(head)], capture_output=True, text=True, timeout=READ_S, check=False
        ).stdout
    except subprocess.TimeoutExpired as e:
        return e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
