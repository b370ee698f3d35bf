"""NCCL failures that name their cause, each mapped to one fix (issue 35 item 5).

NCCL reports a failed verbs call as one WARN line (src/misc/ibvwrap.cc: "Call to ibv_X failed with
[error] N TEXT ..."), and the same call fails for different reasons on different cablings. Each
signature is the text NCCL prints, the cause it means on DGX Sparks, and one fix, read from the
known-bad list's `nccl.failure` entries: the fabric test's verdict, the engine's NCCL log and the
list an owner extends read the same words, so a cause is worded once.

Matched on raw text (a line NCCL printed, whatever came before it: a timestamp, a redacted host),
so output pasted from elsewhere is read as well as our own ranks' logs. Pure.

The published output the tests read is in tests/captured/nccl/published-*.txt (sources in
tests/captured/README.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sparkcluster.config import known_bad


@dataclass(frozen=True)
class Signature:
    cause: str  # the known-bad entry's id: tests and owners' overrides name it
    pattern: re.Pattern[str]
    what: str  # the cause, one line (the entry's `why`)
    fix: str
    # topologies where this reading holds (None: any); elsewhere the line matches no cause here
    topologies: tuple[str, ...] | None = None


def _signature(e: known_bad.Entry) -> Signature:
    topo = e.when.get("topology")
    return Signature(
        e.id,
        re.compile(e.when["log"].regex or ""),
        f"{e.why} ({e.sources()})",
        e.fix,
        tuple(str(t) for t in topo.in_) if topo is not None and topo.in_ else None,
    )


# The causes are worded once, as entries of check `nccl.failure` in the known-bad list
# (config/known_bad.toml, issue 39): an owner's known_bad.toml can add or reword one without code.
SIGNATURES: tuple[Signature, ...] = tuple(
    _signature(e)
    for e in known_bad.load().for_check("nccl.failure")
    if e.severity != "ok" and "log" in e.when and e.when["log"].regex
)


def causes(text: str, topology: str | None = None) -> list[Signature]:
    """The signatures found in `text`, each once, in table order; a signature tied to other
    topologies does not count (None: the topology is not known, every reading counts once)."""
    out: list[Signature] = []
    seen_patterns: set[str] = set()
    for sig in SIGNATURES:
        if topology is not None and sig.topologies is not None and topology not in sig.topologies:
            continue
        if sig.pattern.pattern in seen_patterns:
            continue  # the same line read for another topology
        if sig.pattern.search(text):
            out.append(sig)
            seen_patterns.add(sig.pattern.pattern)
    return out


def fix_for(text: str, topology: str | None = None) -> tuple[str, str] | None:
    """(cause, fix) of the first signature in `text`, or None."""
    found = causes(text, topology)
    return (found[0].what, found[0].fix) if found else None
