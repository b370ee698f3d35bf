"""alertmanager.yml and silences. Alerts go to the webhook the owner configures (the secret
ALERT_WEBHOOK_URL, from the environment or the 0600 .env like the others: seed 004 sends them to a
Telegram bridge), or nowhere but Alertmanager's own list and `sparkcluster events` when unset.

Grouping: alerts group by name, cluster and node; a group's first notification waits one scrape
interval (`group_wait`), and a page (the wedge, an unreachable node, a failing endpoint) waits none:
Prometheus already evaluates the rules at every scrape, so a wedge reaches the webhook within the
stall bound plus one scrape interval.

A planned `down` or `up` silences its nodes while it runs and a grace period after it
(monitor/planned): what it stops and starts is not news. The silence is made by `amtool` inside the
Alertmanager container, over the Docker API on the head's SSH connection: no port of the head's is
opened to the controller for it."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from sparkcluster.config.inventory import Inventory
from sparkcluster.monitor import scrape, stack

WEBHOOK_SECRET = "ALERT_WEBHOOK_URL"
RECEIVER = "owner"


def alertmanager_config(inv: Inventory, webhook_url: str | None) -> dict:
    receiver: dict = {"name": RECEIVER}
    if webhook_url:
        receiver["webhook_configs"] = [{"url": webhook_url, "send_resolved": True, "max_alerts": 0}]
    wait = f"{inv.monitor.scrape_interval_s:g}s"
    return {
        "route": {
            "receiver": RECEIVER,
            "group_by": ["alertname", "cluster", "node"],
            "group_wait": wait,
            "group_interval": "1m",
            "repeat_interval": "4h",
            "routes": [{"matchers": ['severity="page"'], "receiver": RECEIVER, "group_wait": "0s"}],
        },
        "receivers": [receiver],
        # a node that does not answer explains everything else it stops showing
        "inhibit_rules": [
            {
                "source_matchers": ['alertname="SparkNodeUnreachable"'],
                "target_matchers": ['alertname!="SparkNodeUnreachable"'],
                "equal": ["cluster", "node"],
            }
        ],
    }


def render(doc: dict) -> str:
    return json.dumps(doc, indent=2)


def _rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def amtool(inv: Inventory, *args: str) -> list[str]:
    """amtool inside the Alertmanager container, pointed at its own listener."""
    url = f"http://{scrape.reach_ip(inv, inv.head.name)}:{inv.monitor.alertmanager_port}"
    return ["/bin/amtool", f"--alertmanager.url={url}", *args]


def silence_argv(inv: Inventory, nodes: list[str], why: str, end: float) -> list[str]:
    matchers = [f"cluster={inv.cluster.name}", f"node=~{'|'.join(nodes)}"]
    return amtool(
        inv,
        "silence",
        "add",
        "--author=sparkcluster",
        f"--comment={why}",
        f"--end={_rfc3339(end)}",
        *matchers,
    )


def end_argv(inv: Inventory, silence_id: str, end: float) -> list[str]:
    return amtool(inv, "silence", "update", f"--end={_rfc3339(end)}", silence_id)


def _epoch(stamp: str) -> float:
    try:
        return datetime.fromisoformat(stamp).timestamp()
    except (ValueError, AttributeError):
        return 0.0


def alert_entries(doc) -> list[dict]:
    """Alertmanager's alerts (`amtool alert query -o json`: its API v2 list) as journal-like entries
    for `events`: {ts, event, node, summary, ...}, oldest first."""
    out = []
    for a in doc if isinstance(doc, list) else []:
        labels, ann = a.get("labels") or {}, a.get("annotations") or {}
        state = (a.get("status") or {}).get("state", "active")
        out.append(
            {
                "ts": _epoch(a.get("startsAt", "")),
                "event": f"alert {labels.get('alertname', '?')}" + ("" if state == "active" else f" ({state})"),
                "source": "alertmanager",
                **{k: labels[k] for k in ("node", "deployment", "severity") if k in labels},
                **({"summary": ann["summary"]} if "summary" in ann else {}),
            }
        )
    return sorted(out, key=lambda e: e["ts"])


def alerts(api, inv: Inventory) -> list[dict]:
    """The alerts Alertmanager holds now (silenced ones included), as entries; [] where monitoring
    does not run or does not answer."""
    if not stack.running(api, inv, stack.ALERTMANAGER):
        return []
    res = stack.exec_in(
        api,
        inv,
        stack.ALERTMANAGER,
        amtool(inv, "alert", "query", "--active", "--silenced", "--inhibited", "-o", "json"),
    )
    try:
        return alert_entries(json.loads(res.stdout)) if res.ok else []
    except ValueError:
        return []
