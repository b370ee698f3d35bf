"""`status --on-change CMD`: remember each deployment's last state on this machine and run the
owner's command when one changes (seed 004 wires its fleet check to an alert this way).

The command runs through `sh -c` with the facts in its environment, never on its argv, so a problem
text with quotes or `$(...)` in it is data, not shell."""

from __future__ import annotations

import json
import os
import subprocess

from sparkcluster import log, redact
from sparkcluster.log import state_dir

_log = log.get(__name__)
HOOK_TIMEOUT_S = 60.0


def memory_path(cluster: str):
    return state_dir() / f"fleet-{cluster}.json"


def changes(before: dict[str, str], now: dict[str, str]) -> list[tuple[str, str, str]]:
    """Pure: (deployment, previous state or "", new state) for each that changed, appeared or went."""
    out = [(k, before.get(k, ""), v) for k, v in now.items() if before.get(k) != v]
    out += [(k, v, "gone") for k, v in before.items() if k not in now and v != "gone"]
    return out


def hook_env(deployment: str, previous: str, state: str, st=None) -> dict[str, str]:
    profile, _, nodes = deployment.partition("@")
    return {
        "SPARKCLUSTER_DEPLOYMENT": deployment,
        "SPARKCLUSTER_PROFILE": profile,
        "SPARKCLUSTER_NODES": nodes.replace("+", ","),
        "SPARKCLUSTER_STATE": state,
        "SPARKCLUSTER_PREVIOUS_STATE": previous,
        "SPARKCLUSTER_PROBLEMS": redact.mask("\n".join(st.problems)) if st is not None else "",
    }


def notify_changes(cluster: str, sts: list, command: str) -> list[str]:
    """Runs `command` once per changed deployment; returns a warning line for each run that failed
    (non-zero exit, timeout, could not start). A failed run's change is not remembered, so the next
    `status` offers it again: an alert that did not go out is not lost."""
    path = memory_path(cluster)
    try:
        before = json.loads(path.read_text())
    except (OSError, ValueError):
        before = {}
    by_key = {(st.deployment or f"-@{'+'.join(n.node for n in st.nodes)}"): st for st in sts}
    now = {k: st.state for k, st in by_key.items()}
    remembered = dict(before)
    warnings = []
    for key, previous, state in changes(before, now):
        env = {**os.environ, **hook_env(key, previous, state, by_key.get(key))}
        why = ""
        try:
            res = subprocess.run(["sh", "-c", command], env=env, timeout=HOOK_TIMEOUT_S)
            if res.returncode != 0:
                why = f"exited {res.returncode}"
        except subprocess.TimeoutExpired:
            why = f"did not finish within {HOOK_TIMEOUT_S:g}s"
        except OSError as e:
            why = f"could not start: {e}"
        if why:
            _log.warning("on-change command failed", deployment=key, state=state, why=why)
            warnings.append(
                redact.mask(
                    f"--on-change command {why} for {key} ({previous or 'new'} -> {state}); "
                    "it runs again for this change at the next status"
                )
            )
            continue
        _log.info("on-change command ran", deployment=key, state=state)
        if state == "gone":
            remembered.pop(key, None)
        else:
            remembered[key] = state
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(remembered))
    return warnings
