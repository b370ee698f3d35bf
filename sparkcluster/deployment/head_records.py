"""The controller's records, copied to the head for the gateway's web console: each bench run's
summary (`bench`) and the upgrade history (`up`, `upgrade`, `rollback`: the good serves and each
upgrade's outcome). The controller's own copies stay where they are and stay the source; these are
what the console's speed and upgrades pages read, in the gateway's folder (FOLDER, bound into its
container), under RECORDS. Written over the node's SSH connection from stdin, aside and renamed (the
console never reads half a file); a copy that cannot be written is said in one line and never fails
the command that made the record.
"""

from __future__ import annotations

import dataclasses
import json
import shlex

from sparkcluster.errors import SparkError

FOLDER = ".local/share/sparkcluster/gateway"  # under the SSH user's home, then the cluster's name (gateway/store)
RECORDS = "records"  # in that folder: bench/RUN.json, upgrades.json
BENCH_KEPT = 30  # bench summaries kept on the head, newest


def folder(host, cluster: str) -> str:
    """The gateway's folder on the node (the SSH user's home read there: Docker binds need a path)."""
    home = host.run('printf %s "$HOME"', timeout=10).stdout.strip()
    if not home.startswith("/"):
        raise SparkError(
            f"{host.name}: could not read the SSH user's home (got {home!r})",
            f"check that `ssh {host.address} 'echo $HOME'` prints a path",
        )
    return f"{home.rstrip('/')}/{FOLDER}/{cluster}"


def write(host, cluster: str, name: str, doc: dict) -> str:
    """`doc` as RECORDS/NAME.json in the gateway's folder on `host`; its path. Folders 0700."""
    base = f"{folder(host, cluster)}/{RECORDS}"
    target = f"{base}/{name}.json"
    parent = target.rsplit("/", 1)[0]
    q = shlex.quote
    host.run(
        f"umask 077 && mkdir -p {q(parent)} && cat > {q(target)}.new && mv -f {q(target)}.new {q(target)}",
        timeout=30,
        stdin=json.dumps(doc, sort_keys=True).encode(),
    )
    if name.startswith("bench/"):  # the newest BENCH_KEPT runs stay
        host.run(f"cd {q(base)}/bench && ls -1t | tail -n +{BENCH_KEPT + 1} | xargs -r rm -f --", timeout=30, warn=True)
    return target


def publish(host, cluster: str, name: str, doc: dict, say) -> None:
    """`write`, a failure said in one line (`say`) rather than raised: the record is the controller's."""
    try:
        write(host, cluster, name, doc)
    except Exception as e:  # noqa: BLE001 (the copy is the console's; the controller's record is the source)
        said = e.message if isinstance(e, SparkError) else f"{type(e).__name__}: {e}"
        say(f"the console's copy of {name} was not written on {getattr(host, 'name', 'the head')}: {said}")


def bench_doc(summary: dict, deployment: str, at: str) -> dict:
    """A bench run's summary (orchestrate.BenchResult.to_json) as the console shows it: the levels,
    the standing against a record with its ranked causes; no path of the controller's."""
    against = summary.get("against") or None
    if against:
        against = {k: v for k, v in against.items() if k not in ("chart", "csv")}
    return {
        "at": at,
        "deployment": deployment,
        "profile": summary.get("profile"),
        "vllm_version": summary.get("vllm_version"),
        "image_id": summary.get("image_id"),
        "rows": summary.get("rows") or [],
        "regressions": summary.get("regressions", 0),
        "interrupted": summary.get("interrupted", False),
        "failed": summary.get("failed"),
        "against": against,
    }


def history_doc(records: list, outcomes: list) -> dict:
    """The upgrade history (deployment/known_good's good serves, without their canary answers, and
    each upgrade's outcome)."""
    good = [{k: v for k, v in dataclasses.asdict(r).items() if k != "canary"} for r in records]
    return {"good": good, "outcomes": [dataclasses.asdict(o) for o in outcomes]}
