"""`up --smoke`: one short single-stream measurement through the head, judged against the
profile's published decode figure; it warns, it never fails the `up` that already succeeded.
"""

from __future__ import annotations

from sparkcluster import log
from sparkcluster.bench.results import decode_tok_s, row_from_result, run_id
from sparkcluster.bench.runner import Head, Interrupted
from sparkcluster.bench.sweep import Level, Target, target_for
from sparkcluster.config.flags import engine_host
from sparkcluster.errors import SparkError
from sparkcluster.labels import container_name

_log = log.get("sparkcluster.bench")  # the logger name of the single module this was

# ---- smoke: one short single-stream measurement (for `up --smoke`) -----------------------------

SMOKE_FLOOR = 0.7  # below 70% of the published figure: something is wrong, not run-to-run noise


def judge_smoke(tok_s: float | None, expected: float | None, floor: float = SMOKE_FLOOR) -> str:
    if tok_s is None:
        return "failed"
    if not expected:
        return "unknown"  # the profile states no published figure
    return "ok" if tok_s >= floor * expected else "slow"


def smoke(
    head: Head,
    target: Target,
    secrets: dict[str, str],
    expected: float | None,
    output_len: int = 128,
    prompts: int = 3,
) -> tuple[float | None, float | None, str]:
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
    head = Head(host, container_name(inv.cluster.name, "head", inv.head.name, inv.slot))
    target = target_for(prof, inv.cluster.api_port, bind=engine_host(inv, prof))
    return smoke(head, target, secrets, prof.expected_decode_tok_s)


def smoke_message(tok_s: float | None, expected: float | None, verdict: str) -> str:
    """One line for `up --smoke` to print (a warning unless the verdict is ok)."""
    if verdict == "failed":
        return "smoke: the single-stream measurement failed (sparkcluster bench -c 1 shows why)"
    got = f"{tok_s:.1f} tok/s single-stream decode"
    if verdict == "unknown":
        return f"smoke: {got} (the profile states no published figure to compare with)"
    if verdict == "slow":
        return (
            f"smoke: {got}, far below the {expected:g} tok/s published for this profile "
            f"(under {SMOKE_FLOOR:.0%}): check sparkcluster doctor (RoCE, MTU, NCCL falling back to TCP)"
        )
    return f"smoke: {got} (published: {expected:g} tok/s)"
