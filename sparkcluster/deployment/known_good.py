"""The known-good record (issue 39 item 4): what every node was when a deployment last served well,
so that `doctor` and `status` can say what drifted since, node by node ("kernel 6.17.0-1032-nvidia ->
7.0.0-1019-nvidia on spark-b since the serve of 11-20").

`up` appends a record each time it ends serving with its probe answered (a fresh bring-up, or "already
serving" confirmed by the one-token probe): per node the kernel, driver, ConnectX-7 firmware, NCCL
build and image ID; for the deployment the vLLM version, the model's revision and the profile's hash.
A short history (HISTORY records) is kept on the controller beside the other per-deployment state
(`status --on-change`'s memory): `<state>/known-good-<cluster>.json`, newest last.

The issue on published speed keeps a correctness canary's "record of its last good serve"; this is
meant to be that record (its answers a field of it), not a second one. Everything but the file is pure.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime

from sparkcluster.checks.registry import Result
from sparkcluster.log import state_dir
from sparkcluster.node import canary

HISTORY = 20
# what a node record holds, as a drift line names it
NODE_FIELDS = {
    "kernel": "kernel",
    "driver": "driver",
    "cx7_firmware": "ConnectX-7 firmware",
    "nccl": "NCCL",
    "image_id": "image",
}


@dataclass(frozen=True)
class NodeRecord:
    kernel: str = ""
    driver: str = ""
    cx7_firmware: str = ""  # the data-plane HCAs' fw_ver, distinct values joined by ","
    nccl: str = ""  # the NCCL the image loads ("2.28.9 pip"), else the version the ranks logged
    image_id: str = ""


@dataclass(frozen=True)
class GoodRecord:
    deployment: str  # PROFILE@NODE+NODE
    at: str  # ISO UTC
    profile: str
    profile_hash: str
    image: str
    vllm_version: str
    model: str
    model_revision: str  # the commit the weights resolved to (else the profile's revision)
    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    # what `upgrade` and `rollback` return to (issue 39 item 5): the profile's base image as served
    base_image: str = ""
    # the canary of this serve (bench/canary's answers, as JSON) and its one-stream speed, once an
    # `upgrade` measured them: the next upgrade's canary is judged against these
    canary: list[dict] = field(default_factory=list)
    canary_deterministic: bool = True
    canary_tok_s: float = 0.0
    # the serve the canary's answers were taken on (at, image_id, model_revision, vllm_version,
    # profile_hash): they stay the reference across later serves until taken anew, so a difference
    # says what changed since they were taken (node/canary.since)
    canary_taken: dict = field(default_factory=dict)
    # the base image's registry digest on the head at this serve (its RepoDigests entry, `repo@sha256:...`;
    # "" where the image was built or loaded, not pulled): what `profile import --pin` pins a mutable tag to
    base_digest: str = ""

    def canary_answers(self) -> list[canary.Answer]:
        return answers_from(self.canary)

    def canary_record(self) -> canary.CanaryRecord | None:
        """The canary as the comparison reads it (None: none taken on this deployment yet)."""
        if not self.canary:
            return None
        t = self.canary_taken
        return canary.CanaryRecord(
            deployment=self.deployment,
            profile=self.profile,
            taken_at=t.get("at", self.at),
            deterministic=self.canary_deterministic,
            answers=self.canary_answers(),
            profile_hash=t.get("profile_hash", ""),
            image_id=t.get("image_id", ""),
            model_revision=t.get("model_revision", ""),
            vllm_version=t.get("vllm_version", ""),
        )

    def to_json(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_json(d: dict) -> GoodRecord:
        nodes = {n: NodeRecord(**{k: v for k, v in r.items() if k in NODE_FIELDS}) for n, r in d["nodes"].items()}
        keep = {k: d[k] for k in GoodRecord.__dataclass_fields__ if k != "nodes" and k in d}
        for k in ("deployment", "at", "profile", "profile_hash", "image", "vllm_version", "model", "model_revision"):
            keep.setdefault(k, "")
        return GoodRecord(**keep, nodes=nodes)

    def day(self) -> str:
        """The serve's day as a drift line says it: MM-DD."""
        return self.at[5:10]


@dataclass(frozen=True)
class Change:
    node: str
    what: str  # a NODE_FIELDS key
    before: str
    after: str
    since: str  # the record's day

    def line(self) -> str:
        return f"{NODE_FIELDS[self.what]} {self.before} -> {self.after} on {self.node} since the serve of {self.since}"


def _ids(v) -> tuple[int, ...] | None:
    return tuple(int(i) for i in v) if isinstance(v, list) else None


def answers_json(answers: list) -> list[dict]:
    """bench/canary's answers as the record keeps them."""
    return [
        {"prompt": a.prompt, "text": a.text, "token_ids": list(a.token_ids) if a.token_ids is not None else None}
        for a in answers
    ]


def answers_from(docs: list[dict]) -> list[canary.Answer]:
    """The record's answers (JSON) as node/canary's."""
    return [canary.Answer(a["prompt"], a.get("text", ""), _ids(a.get("token_ids"))) for a in docs]


@dataclass(frozen=True)
class UpgradeOutcome:
    """What an `upgrade` or a `rollback` ended as, kept beside the good records: after a refused upgrade
    nothing is left of the new image or revision but this (what was tried, and why it was refused)."""

    deployment: str
    at: str
    image: str  # the base image tried
    model_revision: str
    outcome: str  # "kept" | "rolled back" | "rollback"
    reason: str = ""
    returned_to: str = ""  # the good serve returned to (its `at`), when rolled back

    def line(self) -> str:
        why = f": {self.reason}" if self.reason else ""
        back = f" (returned to the serve of {self.returned_to})" if self.returned_to else ""
        return f"{self.at} {self.deployment} {self.image}@{self.model_revision[:12]} {self.outcome}{why}{back}"


def node_now(f) -> NodeRecord:
    """A node's record from its facts (`facts.HostFacts`)."""
    t = f.traits
    fw = ",".join(sorted({x.fw for x in t.hca_links.values() if x.fw}))
    nccl = f.image_nccl
    return NodeRecord(
        kernel=t.kernel,
        driver=f.gpus[0].driver if f.gpus else "",
        cx7_firmware=fw,
        nccl=f"{nccl.version} {nccl.build}" if nccl is not None and nccl.version else "",
        image_id=f.image_id or "",
    )


def drift(record: GoodRecord, now: dict[str, NodeRecord]) -> list[Change]:
    """Pure: what differs, node by node, between the record and what the nodes are now. A value
    unknown on either side is not drift (a probe that did not answer says nothing changed)."""
    out = []
    for node, then in record.nodes.items():
        cur = now.get(node)
        if cur is None:
            continue
        for what in NODE_FIELDS:
            a, b = getattr(then, what), getattr(cur, what)
            if a and b and a != b:
                out.append(Change(node, what, _short(a), _short(b), record.day()))
    return out


def _short(v: str) -> str:
    return v[:19] if v.startswith("sha256:") else v


def last_for_node(history: list[GoodRecord], node: str) -> GoodRecord | None:
    return next((r for r in reversed(history) if node in r.nodes), None)


def last_for(history: list[GoodRecord], deployment: str) -> GoodRecord | None:
    return next((r for r in reversed(history) if r.deployment == deployment), None)


def now_utc() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- the file --------------------------------------------------------------------------------------


def path_for(cluster: str):
    return state_dir() / f"known-good-{cluster}.json"


def _doc(cluster: str) -> dict:
    try:
        doc = json.loads(path_for(cluster).read_text())
        return doc if isinstance(doc, dict) else {}
    except (OSError, ValueError):
        return {}


def load(cluster: str) -> list[GoodRecord]:
    try:
        return [GoodRecord.from_json(d) for d in _doc(cluster).get("records", [])]
    except (KeyError, TypeError, AttributeError):
        return []


def load_outcomes(cluster: str) -> list[UpgradeOutcome]:
    try:
        return [UpgradeOutcome(**d) for d in _doc(cluster).get("upgrades", [])]
    except (KeyError, TypeError):
        return []


def _write(cluster: str, records: list[GoodRecord], outcomes: list[UpgradeOutcome]) -> None:
    p = path_for(cluster)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    doc = {"records": [r.to_json() for r in records[-HISTORY:]], "upgrades": [asdict(o) for o in outcomes[-HISTORY:]]}
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(p)  # never half written


def digest_seen(image: str) -> GoodRecord | None:
    """The newest good serve, of any cluster this controller has served, whose base image was `image`
    (a tag) and whose head had pulled it from a registry (`base_digest`); None where none did."""
    found = []
    for p in sorted(state_dir().glob("known-good-*.json")):
        cluster = p.name[len("known-good-") : -len(".json")]
        found += [r for r in load(cluster) if r.base_image == image and r.base_digest]
    return max(found, key=lambda r: r.at, default=None)


def repo_digest(image: str, repo_digests: list[str]) -> str:
    """The RepoDigests entry (`repo@sha256:...`) of `image`'s repository, "" where it has none (an image
    built or loaded on the node carries no digest of a registry)."""
    repo = image.split("@", 1)[0]
    last = repo.rsplit("/", 1)[-1]
    if ":" in last:
        repo = repo[: -(len(last) - last.index(":"))]
    return next((d for d in repo_digests if d.split("@", 1)[0] == repo), "")


def append(cluster: str, rec: GoodRecord) -> None:
    """Add a record (newest last), keeping the last HISTORY; the file is replaced whole."""
    _write(cluster, [*load(cluster), rec], load_outcomes(cluster))


def replace_newest(cluster: str, rec: GoodRecord) -> None:
    """The deployment's newest record replaced by `rec` (the canary measured on the serve it records)."""
    records = load(cluster)
    for i in range(len(records) - 1, -1, -1):
        if records[i].deployment == rec.deployment:
            records[i] = rec
            break
    else:
        records.append(rec)
    _write(cluster, records, load_outcomes(cluster))


def forget_since(cluster: str, deployment: str, at: str) -> None:
    """The deployment's records taken at or after `at` dropped: an upgrade whose canary failed was never good."""
    records = [r for r in load(cluster) if r.deployment != deployment or r.at < at]
    _write(cluster, records, load_outcomes(cluster))


def note_outcome(cluster: str, o: UpgradeOutcome) -> None:
    _write(cluster, load(cluster), [*load_outcomes(cluster), o])


# --- what doctor says ------------------------------------------------------------------------------


def doctor_results(cluster: str, history: list[GoodRecord], facts: dict, nodes: list[str]) -> list:
    """`drift.since_good`, one row per node: WARN naming what changed on the host since the last good
    serve that included it, OK when nothing did. The image and its NCCL are left to `status`, which
    knows the deployment (doctor judges whichever profile it is given)."""
    out = []
    for node in nodes:
        f = facts.get(node)
        if f is None:
            out.append(Result("drift.since_good", node, "skip", "unreachable"))
            continue
        rec = last_for_node(history, node)
        if rec is None:
            out.append(Result("drift.since_good", node, "skip", "no good serve recorded with this node yet"))
            continue
        changes = drift(rec, {node: replace(node_now(f), image_id="", nccl="")})
        if changes:
            out.append(
                Result(
                    "drift.since_good",
                    node,
                    "warn",
                    "; ".join(c.line() for c in changes) + f" ({rec.deployment})",
                    f"nothing to do while it serves as it did; if it no longer does, start with this change "
                    f"(the other checks judge each against the known-bad list; history in {path_for(cluster)})",
                )
            )
        else:
            out.append(Result("drift.since_good", node, "ok", f"as at the serve of {rec.at[:10]} ({rec.deployment})"))
    return out
