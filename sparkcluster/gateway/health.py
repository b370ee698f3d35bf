"""Which deployments are in rotation: the supervisor's verdict, read from the head agent's report.

vLLM's `/health` stays 200 while a rank is stopped, so probing it keeps a wedged deployment in
rotation (docs/field-notes.md, "Health is not readiness"). The supervisor on each deployment's head
already tells a wedge from a prefill; it publishes its state file, and its agent serves that state
in its report on the node's control address (node/agent.py). The gateway reads that report every
`poll_s` and routes only to a deployment whose supervisor says serving, freshly: a verdict found
since it last said serving (wedged, dead: the supervisor publishes it before it stops the engine,
which may take its stop grace), restarting, starting, waiting for nodes, stopped for good (restart
limit, memory floor, failed start), a peer's memory unknown, a state gone stale, or an agent that
does not answer each take it out, with that reason and a Retry-After for the client. On demand, a
deployment on standby, or whose last start was refused for memory, is out of rotation but wakeable:
a request for it wakes its head's agent (app.py), and it enters rotation when the supervisor serves.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..node import contract

REFUSED_REASON = "its last start was refused"  # the verdict of a start refused for memory (on demand)


@dataclass(frozen=True)
class Verdict:
    up: bool
    reason: str = ""
    retry_after: int = 5  # seconds, for the client's Retry-After
    wake: bool = False  # on demand: on standby (or its last start refused): a request wakes it


SERVING = Verdict(True, "serving", 0)


def judge(report: dict | None, why_not: str = "") -> Verdict:
    """Pure: the head agent's report (None: it did not answer, `why_not` says how) -> in rotation or
    not, with the reason a client is told."""
    if report is None:
        return Verdict(False, f"its supervisor does not answer ({why_not or 'no report'})", 5)
    sup = report.get("supervisor")
    if not isinstance(sup, dict):
        return Verdict(False, "no server asked for (sparkcluster up has not started one)", 30)
    state, causes = sup.get("state"), sup.get("causes") or []
    newest = causes[-1] if causes and isinstance(causes[-1], dict) else {}
    last = newest.get("cause", "")
    acts = (sup.get("policy") or {}).get("act", True)
    if state == contract.SERVING and acts and float(newest.get("ts") or 0) >= float(sup.get("since") or 0) > 0:
        # a verdict newer than "serving": the supervisor is stopping the engine (which may take its
        # stop grace) and will restart it or give up; either way it serves nothing now
        return Verdict(False, f"{newest.get('kind', 'fault')}: {last}; the supervisor is stopping it", 10)
    now, updated = report.get("ts"), sup.get("updated")
    if isinstance(now, (int, float)) and isinstance(updated, (int, float)):
        age = now - updated
        if age > contract.stale_after_s(sup):
            return Verdict(False, f"its supervisor is stale ({state}, {age:.0f}s old): it is not watching", 10)
    # the verdict's kind first (wedged, dead, not-ready, memory): what a client and the journal are told
    after = f" (after {newest.get('kind') or 'a verdict'}: {last})" if last else ""
    if state == contract.SERVING:
        unknown = sup.get("memory_unknown") or {}
        if unknown:
            return Verdict(False, "degraded: memory unknown on " + ", ".join(sorted(unknown)), 10)
        return SERVING
    if state == contract.RESTARTING:
        return Verdict(False, f"restarting{after}", 10)
    if state in (contract.STARTING, contract.WAITING):
        return Verdict(False, f"{state}{after}", 10)
    if state == contract.STANDBY:
        return Verdict(False, "on standby: a request starts it on demand", 10, wake=True)
    if state == contract.REFUSED:
        return Verdict(False, f"{REFUSED_REASON}: {sup.get('refusal') or last}", 30, wake=True)
    if state in (contract.LIMIT, contract.MEMORY, contract.FAILED):
        return Verdict(False, f"{state}{after}; sparkcluster up brings it back", 60)
    return Verdict(False, f"not serving ({state or 'no state'})", 30)


async def look(client, url: str, timeout: float = 1.0) -> Verdict:
    """One read of a head agent's report (httpx.AsyncClient), judged."""
    import httpx

    try:
        r = await client.get(url, timeout=timeout)
        r.raise_for_status()
        report = r.json()
    except (httpx.HTTPError, ValueError) as e:
        return judge(None, f"{url}: {type(e).__name__}: {e}".rstrip(": "))
    return judge(report if isinstance(report, dict) else None, "not a report")


def event(what: str, **detail) -> None:
    """One JSON line on stdout, the gateway's journal (`docker logs` of its container)."""
    import json

    print(json.dumps({"ts": round(time.time(), 3), "event": what, **detail}), flush=True)
