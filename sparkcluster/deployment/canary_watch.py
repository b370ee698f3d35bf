"""The correctness canary from the controller (issue 38 item 4): taken when a deployment first serves
well, compared after every serve `up` starts (an image change, an upgrade's new serve, a flag change)
and on request (`bench --canary`); the supervisor compares after its own restarts (node/canary).

One record: the reference answers live in the deployment's known-good record (deployment/known_good), the
record of its last good serve, carried from serve to serve of the same model until taken anew
(`bench --canary-retake`, after a change you meant): a changed answer stays reported on every later
restart until then. Each comparison is handed to the head container, so that the journal (`events`)
and `status` tell it whoever made it: the reference for the supervisor (contract.CANARY_PATH), the
check (contract.CANARY_CHECK_PATH) and a `canary: ...` journal entry.

Nothing here fails or delays a serve beyond its own requests: `up`'s step reports what it could not
do and carries on.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from sparkcluster import log
from sparkcluster.deployment import known_good
from sparkcluster.node import canary, contract

_log = log.get(__name__)


@dataclass(frozen=True)
class Kept:
    """The canary fields the serve's known-good record gets, and what was found."""

    canary: list[dict]
    deterministic: bool
    taken: dict  # node/canary's provenance: at, image_id, model_revision, vllm_version, profile_hash
    verdict: canary.Verdict | None = None  # None: taken now
    check: dict = field(default_factory=dict)  # what the head keeps for status (canary.check_doc)

    def says(self) -> str:
        if self.verdict is None:
            how = "deterministic" if self.deterministic else "NOT deterministic: later differences are only told"
            return f"canary taken ({how})"
        return self.verdict.says


def must_take(before: known_good.GoodRecord | None, model: str) -> bool:
    """No reference yet for this deployment, or the one kept was taken of another model."""
    return before is None or before.canary_record() is None or before.model != model


def take(ask: Callable[[], list], now: dict, at: str) -> Kept:
    """Two passes: they agree or the model is nondeterministic by design (node/canary's rule)."""
    first, second = ask(), ask()
    rec = canary.take(first, second, deployment="", profile="", taken_at=at)
    doc = {
        "at": at,
        "after": "",
        "state": "taken",
        "changed": [],
        "since": [],
        "says": "taken: " + ("deterministic" if rec.deterministic else "nondeterministic by design"),
    }
    return Kept(known_good.answers_json(first), rec.deterministic, {"at": at, **now}, None, doc)


def compare(before: known_good.GoodRecord, ask: Callable[[], list], now: dict, at: str, after: str) -> Kept:
    """Fresh answers against the kept ones. The reference stays; when the answers are the same, its
    provenance becomes this serve's (what a later difference is said to be "since")."""
    stored = before.canary_record()
    verdict = canary.judge(stored, ask, **now)
    taken = {**before.canary_taken, "at": at, **now} if verdict.state == "same" else before.canary_taken
    return Kept(before.canary, before.canary_deterministic, taken, verdict, canary.check_doc(verdict, at, after))


def reference(deployment: str, profile: str, kept: Kept) -> canary.CanaryRecord:
    t = kept.taken
    return canary.CanaryRecord(
        deployment=deployment,
        profile=profile,
        taken_at=t.get("at", ""),
        deterministic=kept.deterministic,
        answers=known_good.answers_from(kept.canary),
        profile_hash=t.get("profile_hash", ""),
        image_id=t.get("image_id", ""),
        model_revision=t.get("model_revision", ""),
        vllm_version=t.get("vllm_version", ""),
    )


def hand(api, container: str, ref: canary.CanaryRecord, check: dict) -> None:
    """The reference and the check into the head container, and the check as a journal entry."""
    # lazy: the Docker SDK, loaded only when a check is handed over (status and bench import this module)
    from sparkcluster.container.spec import files_tar
    from sparkcluster.remote.dockerapi import run_in  # (the same)

    api.put_archive(
        container,
        "/",
        files_tar({contract.CANARY_PATH: json.dumps(ref.to_json()), contract.CANARY_CHECK_PATH: json.dumps(check)}),
    )
    entry = {"ts": _ts(), "event": f"canary: {check['state']}", "by": "controller", **_detail(check)}
    run_in(api, container, ["sh", "-c", 'printf "%s\\n" "$1" >> "$2"', "sh", json.dumps(entry), contract.JOURNAL_PATH])


def _detail(check: dict) -> dict:
    return {k: check[k] for k in ("after", "says", "changed") if check.get(k)}


def _ts() -> float:
    import time

    return round(time.time(), 3)


def after_serve(
    before: known_good.GoodRecord | None,
    model: str,
    ask: Callable[[], list],
    now: dict,
    after: str,
) -> Kept:
    """Take the canary, or compare with the kept one (raises what `ask` raises)."""
    at = known_good.now_utc()
    return take(ask, now, at) if must_take(before, model) else compare(before, ask, now, at, after)
