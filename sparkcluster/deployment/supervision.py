"""The supervisor as the controller sees it: what the supervisor on the head reports (its state
file and its journal); its bounds are the profile's (config/bounds.py). The supervisor itself is the
node agent (node/), which runs inside the head container without the controller."""

from __future__ import annotations

import io
import json
import tarfile

from sparkcluster.labels import CLUSTER_LABEL, PROFILE_LABEL, ROLE_LABEL, SERVICE_ROLE, container_name, is_gateway
from sparkcluster.node import contract


def read_file(api, container: str, path: str) -> str | None:
    import docker.errors  # here: `status` imports this module for format_entry and never needs Docker's client

    try:
        stream, _ = api.get_archive(container, path)
    except docker.errors.NotFound:
        return None
    with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
        return tar.extractfile(tar.getmembers()[0]).read().decode(errors="replace")


def state(api, container: str) -> contract.Supervised | None:
    """The supervisor's state file, or None when it has written none (no server asked for yet)."""
    text = read_file(api, container, contract.STATE_PATH)
    try:
        return contract.Supervised.of(json.loads(text)) if text else None
    except ValueError:  # caught mid-write: the next look has it
        return None


def journals(api, cluster: str, node: str, profile: str | None) -> list[tuple[str, str]]:
    """(container, profile) of each deployment's head container (a service's own, issue 60) on the node
    (of `profile` alone when given), found by label; where none carries the labels, the first slot's
    name as before issue 60. `events` reads their journals; `fabric resume` marks each."""
    import docker.errors  # here: `status` imports this module for format_entry and never needs Docker's client

    try:
        listed = api.containers(all=True, filters={"label": f"{CLUSTER_LABEL}={cluster}"})
    except docker.errors.APIError:
        listed = []
    out = []
    for c in listed:
        labels = c.get("Labels") or {}
        if labels.get(ROLE_LABEL) not in ("head", SERVICE_ROLE) or is_gateway(labels):  # a service's own (issue 60)
            continue
        if profile is None or labels.get(PROFILE_LABEL) == profile:
            out.append(((c.get("Names") or ["?"])[0].lstrip("/"), labels.get(PROFILE_LABEL, "?")))
    if out or profile is not None:
        return sorted(out)
    name = container_name(cluster, "head", node)
    try:
        api.inspect_container(name)
    except docker.errors.NotFound:
        return []
    return [(name, "")]


def journal(api, container: str, last: int | None = None) -> list[dict]:
    text = read_file(api, container, contract.JOURNAL_PATH) or ""
    entries = []
    for line in text.splitlines():
        try:
            entries.append(json.loads(line))
        except ValueError:
            continue
    return entries[-last:] if last else entries


def format_entry(e: dict) -> str:
    import time

    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(e.get("ts", 0))))
    rest = " ".join(f"{k}={v}" for k, v in e.items() if k not in ("ts", "event"))
    return f"{when}  {e.get('event', '?')}" + (f"  {rest}" if rest else "")
