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

from ..node import contract

REFUSED_REASON = contract.REFUSED_REASON
Verdict = contract.Availability  # in rotation or not, why, Retry-After, wake, final: node/contract's one judgement
SERVING = Verdict(True, "serving", 0, why="serving")


def judge(report: dict | None, why_not: str = "") -> Verdict:
    """Pure: the head agent's report (None: it did not answer, `why_not` says how) -> in rotation or
    not, with the reason a client is told: `contract.availability` of the supervisor's state in it,
    as old as the report says (the agent's clock and the supervisor's are the head's)."""
    if report is None:
        return Verdict(False, f"its supervisor does not answer ({why_not or 'no report'})", 5, why="no answer")
    sup = contract.Supervised.of(report.get("supervisor"))
    return contract.availability(sup, sup.age(report.get("ts")) if sup else None)


async def look(client, url: str, timeout: float = 1.0, seen: dict | None = None) -> Verdict:
    """One read of a head agent's report (httpx.AsyncClient), judged; `seen` gets the report under
    "report" (None unanswered), which the console shows."""
    import httpx

    seen = {} if seen is None else seen
    seen["report"] = None
    try:
        r = await client.get(url, timeout=timeout)
        r.raise_for_status()
        report = r.json()
    except (httpx.HTTPError, ValueError) as e:
        return judge(None, f"{url}: {type(e).__name__}: {e}".rstrip(": "))
    seen["report"] = report if isinstance(report, dict) else None
    return judge(seen["report"], "not a report")


def event(what: str, **detail) -> None:
    """One JSON line on stdout, the gateway's journal (`docker logs` of its container)."""
    import json

    print(json.dumps({"ts": round(time.time(), 3), "event": what, **detail}), flush=True)
