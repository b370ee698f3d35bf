"""`sparkcluster gateway keys add|list|revoke|rotate` and `sparkcluster gateway usage`: the gateway's
named keys and what each used (sparkcluster/gateway/keys, quota, programs/gateway_usage). The key
file and the usage ledger live in the gateway's folder on its node (gateway/store): where the
gateway runs, else the inventory's head. A key is printed once, when it is made; the file holds its
SHA-256 only. The running gateway reads the file again within a second of a change: no restart, no
stream dropped. `gateway_cmd` adds these to the `gateway` group."""

from __future__ import annotations

import csv
import io
import json
import time
from datetime import UTC, datetime

import click

from sparkcluster.deployment import gateway_registry
from sparkcluster.errors import InputError, SparkError
from sparkcluster.gateway import keys, rollout, store
from sparkcluster.remote.fanout import connect_reachable
from sparkcluster.remote.lock import NodeLocks

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration(text: str, option: str) -> int:
    t = text.strip()
    if t[:-1].isdigit() and t[-1] in _UNITS:
        return int(t[:-1]) * _UNITS[t[-1]]
    if t.isdigit():
        return int(t)
    raise InputError(f"{option} {text!r} is not a duration", f"use e.g. {option} 90s, 10m, 2h or 7d")


def moment(text: str, option: str) -> float:
    """A date or date and time (ISO 8601; UTC unless it says otherwise) as epoch seconds."""
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise InputError(
            f"{option} {text!r} is not a date", f"use e.g. {option} 2026-12-31 or 2026-12-31T18:00"
        ) from None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


class _Place:
    """The node holding the gateway's folder, connected; whether the gateway running there reads it."""

    def __init__(self, obj, node_name: str | None):
        self.inv = obj.inventory()
        self.cluster, unreachable = connect_reachable(self.inv)
        running = {}
        for name, host in self.cluster.hosts.items():
            c = gateway_registry.find(host.docker().api, self.inv.cluster.name)
            if c is not None:
                running[name] = c
        name = node_name or next(iter(running), None) or self.inv.head.name
        if name not in self.cluster.hosts:
            self.cluster.close()
            err = unreachable.get(name)
            raise SparkError(
                f"{name} (where the gateway's keys and usage are kept) is unreachable"
                + (f": {err.message}" if err else ""),
                err.fix if err else "check the node, then run the command again",
            )
        self.node, self.host = name, self.cluster.hosts[name]
        self.gateway = running.get(name)
        self.folder = store.folder(self.host, self.inv.cluster.name)

    def reads_keys(self) -> bool:
        mounts = (self.gateway or {}).get("Mounts") or []
        return any(m.get("Destination") == rollout.DATA_MOUNT for m in mounts)

    def when(self) -> str:
        if self.gateway is None:
            return "the gateway reads it when it starts (sparkcluster gateway up)"
        if not self.reads_keys():
            return "the gateway running there predates named keys: run sparkcluster gateway up once to let it read them"
        return "the running gateway takes it within a second (no restart)"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.cluster.close()


def _edit(obj, node_name, what: str, change) -> tuple[str, str]:
    """Read the key file, `change(entries)` (returns what to say), write it back, under the node's lock."""
    with _Place(obj, node_name) as at:
        with NodeLocks(at.cluster, at.inv.only([at.node]), f"gateway keys {what}"):
            entries = store.read_keys(at.host, at.folder)
            said = change(entries)
            store.write_keys(at.host, at.folder, entries)
        return said, f"key file {at.folder}/{keys.KEYS_FILE} on {at.node} (0600): {at.when()}"


def _named(entries, name: str) -> keys.Entry:
    e = keys.find(entries, name)
    if e is None:
        have = ", ".join(x.name for x in entries) or "none"
        raise InputError(f"no key named {name!r} (keys: {have})", "sparkcluster gateway keys list")
    return e


_node_option = click.option(
    "--node", "node_name", default=None, help="The gateway's node (default: where it runs, else the head)."
)


@click.group("keys")
def keys_group() -> None:
    """Named client keys: add, list, revoke, rotate (limits, models, admin)."""


@keys_group.command("add")
@click.argument("name")
@click.option("--models", default="", help="Only these models (comma-separated); others get 404.")
@click.option("--requests-per-minute", type=click.IntRange(min=1), default=None, help="At most N requests a minute.")
@click.option("--tokens-per-day", type=click.IntRange(min=1), default=None, help="At most N tokens a UTC day.")
@click.option("--max-concurrent", type=click.IntRange(min=1), default=None, help="At most N requests in flight.")
@click.option("--expires", default=None, help="Refused from this date (ISO 8601, UTC unless it says).")
@click.option("--admin", is_flag=True, help="May use the gateway's and the console's actions.")
@_node_option
@click.pass_obj
def keys_add(obj, name, models, requests_per_minute, tokens_per_day, max_concurrent, expires, admin, node_name):
    """Make a key NAME and print it, once: it is stored hashed and never shown again."""
    if not keys.valid_name(name):
        raise InputError(
            f"{name!r} is not a key name", "use up to 64 letters, digits and - _ . @ (not starting with env:)"
        )
    until = moment(expires, "--expires") if expires else 0.0
    key = keys.new_key()

    def add(entries):
        if keys.find(entries, name) is not None:
            raise InputError(f"a key named {name!r} exists", f"sparkcluster gateway keys rotate {name}")
        entries.append(
            keys.Entry(
                name,
                keys.digest(key),
                created=round(time.time(), 3),
                admin=admin,
                models=[m.strip() for m in models.split(",") if m.strip()],
                requests_per_minute=requests_per_minute or 0,
                tokens_per_day=tokens_per_day or 0,
                max_concurrent=max_concurrent or 0,
                expires=until,
            )
        )
        return f"key {name!r} added{' (admin)' if admin else ''}"

    said, where = _edit(obj, node_name, "add", add)
    click.echo(f"{said}; {where}")
    click.echo("the key (shown this once; give it to its user, it cannot be read back):")
    click.echo(key)


@keys_group.command("rotate")
@click.argument("name")
@click.option("--grace", default="0", show_default=True, help="How long the old key stays valid (e.g. 10m, 1d).")
@_node_option
@click.pass_obj
def keys_rotate(obj, name, grace, node_name):
    """Give NAME a new key (printed once); its limits and usage stay."""
    grace_s = duration(grace, "--grace")
    key = keys.new_key()

    def rotate(entries):
        keys.rotate(_named(entries, name), key, grace_s, time.time())
        return f"key {name!r} rotated; the old one " + (f"stays valid for {grace}" if grace_s else "is refused now")

    said, where = _edit(obj, node_name, "rotate", rotate)
    click.echo(f"{said}; {where}")
    click.echo("the new key (shown this once):")
    click.echo(key)


@keys_group.command("revoke")
@click.argument("name")
@_node_option
@click.pass_obj
def keys_revoke(obj, name, node_name):
    """Remove NAME's key (and any rotated one): refused from the gateway's next look; its usage stays."""

    def revoke(entries):
        entries.remove(_named(entries, name))
        return f"key {name!r} revoked"

    said, where = _edit(obj, node_name, "revoke", revoke)
    click.echo(f"{said}; {where}")


@keys_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="As JSON (no key or hash in it).")
@_node_option
@click.pass_obj
def keys_list(obj, as_json, node_name):
    """The named keys and their limits (never a key)."""
    with _Place(obj, node_name) as at:
        entries = store.read_keys(at.host, at.folder)
    now = time.time()
    rows = [e.public(now) for e in entries]
    if as_json:
        click.echo(json.dumps({"node": at.node, "folder": at.folder, "keys": rows}, indent=2))
        return
    if not rows:
        click.echo(f"no named keys on {at.node} (add one: sparkcluster gateway keys add NAME)")
    for r in rows:
        limits = [
            f"{r[k]} {label}"
            for k, label in (
                ("requests_per_minute", "requests/min"),
                ("tokens_per_day", "tokens/day"),
                ("max_concurrent", "in flight"),
            )
            if r[k]
        ]
        line = f"{r['name']}{' (admin)' if r['admin'] else ''}: models {', '.join(r['models']) or 'all'}"
        line += f"; limits {', '.join(limits) or 'none'}"
        if r["expires"]:
            line += f"; expires {_iso(r['expires'])}" + (" (EXPIRED)" if r["expires"] <= now else "")
        if r["rotated_valid_until"]:
            line += f"; its previous key valid until {_iso(r['rotated_valid_until'])}"
        click.echo(line)


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


FIELDS = ("hour", "key", "model", "requests", "prompt_tokens", "completion_tokens", "errors", "ttft_avg_s")


def usage_rows(raw: list[dict]) -> list[dict]:
    """The ledger's rows as shown: the hour in ISO 8601 (UTC), the mean time to first token."""
    out = []
    for r in raw:
        n = r.get("ttft_count") or 0
        out.append(
            {
                **{k: r.get(k) for k in FIELDS[1:7]},
                "hour": _iso(r["hour"]),
                "ttft_avg_s": round(r["ttft_s_sum"] / n, 4) if n else None,
            }
        )
    return [{k: row[k] for k in FIELDS} for row in out]


def render_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=FIELDS, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


@click.command("usage")
@click.option("--since", default="30d", show_default=True, help="From this long ago (e.g. 24h, 7d) or a date.")
@click.option("--key", "key_name", default=None, help="Only this key's (a name, or env:N).")
@click.option("--model", default=None, help="Only this model's.")
@click.option("--csv", "as_csv", is_flag=True, help="As CSV.")
@click.option("--json", "as_json", is_flag=True, help="As JSON.")
@_node_option
@click.pass_obj
def usage(obj, since, key_name, model, as_csv, as_json, node_name):
    """Requests, tokens, errors and time to first token, per key, model and hour (UTC)."""
    if as_csv and as_json:
        raise InputError("--csv and --json go one at a time", "choose one")
    try:
        start = time.time() - duration(since, "--since")
    except InputError:
        start = moment(since, "--since")
    with _Place(obj, node_name) as at:
        rows = usage_rows(store.usage(at.host, at.folder, int(start), key_name, model))
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    elif as_csv:
        click.echo(render_csv(rows), nl=False)
    elif not rows:
        click.echo(f"no usage since {_iso(start)} on {at.node}")
    else:
        for r in rows:
            ttft = f", ttft {r['ttft_avg_s']}s" if r["ttft_avg_s"] is not None else ""
            click.echo(
                f"{r['hour']} {r['key']} {r['model']}: {r['requests']} requests, {r['prompt_tokens']} prompt + "
                f"{r['completion_tokens']} completion tokens, {r['errors']} errors{ttft}"
            )
