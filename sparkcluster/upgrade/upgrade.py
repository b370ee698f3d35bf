"""`upgrade` and `rollback` (issue 39 item 5): a new image or model revision is kept only once it has
shown it serves as well as the last good serve did; otherwise the last good serve comes back by itself,
and the reason is kept.

Why a plan of steps: an upgrade is several `up`s and a judgement between them, and an owner must be
able to read all of it, the rollback included, before anything moves (`--dry-run`). The steps are
the step engine's (`steps/base.Step`, one `Stage` declaration per stage below), walked by its walk
(`steps/walk.walk`, as `up`'s executor walks), so each ends as the same structured `step` event:

  traffic   the gateway in front of the deployment, where one runs, drains and holds its requests
            (deployment/gateway_hold)
  baseline  the last good serve's canary answers and one-stream speed, from the known-good record;
            measured on the serving deployment first when the record has none yet
  up        `up` of the profile with the new image or revision: its own plan (distribute: image and
            weights stages; then containers, ray, probe, serve), printed nested in the dry run
  canary    the probe (/health and one token), the fixed greedy completions (`node/canary`) against
            the last good ones
  bench     decode tokens/s at concurrency 1 after a few warm-up requests, against a bound times the
            last good serve's figure
  prune     only if all of that held: the old image and the old revision's files removed, the new serve
            recorded as good with its canary (one record, `deployment/known_good`, extended, not a second)
  rollback  only if any of it failed: `up` of the last good image and revision, the new image removed
            from every node, the record of why kept (`known_good.UpgradeOutcome`)

One lock on the deployment's nodes is held for the whole of it (`held`): from before the new `up` to
after the rollback's `up` or the prune, so no other `up` or `down` starts between the new serve and its
judgement or its undoing (a concurrent one is refused, naming this run); the `up`s inside take none.

The old image and revision stay on disk until the new ones are good, so the preflight disk check of the
new `up` sees them as used space (it asks room for the new image beside the old). A failing step never
raises out of the walk: it is kept as the reason, and the steps after it read it to decide whether they
run (their `when` says so in the plan).
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit

import docker.errors
import httpx

from sparkcluster import log, redact
from sparkcluster.config import profile as profiles
from sparkcluster.config.flags import supervised_argv
from sparkcluster.config.images import check_image_ref, image_ref
from sparkcluster.config.inventory import Inventory
from sparkcluster.deployment import deployments, endpoint, head_records, known_good
from sparkcluster.errors import InputError, SparkError
from sparkcluster.movement import hfcache
from sparkcluster.node import canary
from sparkcluster.remote.fanout import ConnectedHosts
from sparkcluster.remote.lock import NodeLocks
from sparkcluster.steps.base import Stage, Step, render_steps
from sparkcluster.steps.walk import StageProgress, walk

_log = log.get(__name__)
T = TypeVar("T")

SPEED_BOUND = 0.8  # the new serve keeps at least this share of the last good serve's one-stream speed
PROBE_TIMEOUT_S = 60.0
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


# ---- what is judged (pure) ---------------------------------------------------------------------------


def judge(
    up_failed: str = "",
    probe: str = "",
    verdict: canary.Verdict | None = None,
    tok_s: float | None = None,
    good_tok_s: float = 0.0,
    bound: float = SPEED_BOUND,
    chat: str = "",
) -> str:
    """Why the new serve is refused, or "" when it is good: its `up` failed, its probe did not answer, a
    deterministic canary answer changed, a chat request its profile enables (tools, reasoning) did not
    answer a well-formed 200, or its one-stream speed fell below `bound` x the last good one."""
    if up_failed:
        return f"up failed: {up_failed}"
    if probe:
        return f"the probe failed: {probe}"
    if verdict is not None and verdict.problem:
        return verdict.says
    if chat:
        return chat
    if tok_s is not None and good_tok_s > 0 and tok_s < bound * good_tok_s:
        return (
            f"one-stream decode {tok_s:.1f} tok/s is below {bound:.0%} of the last good serve's {good_tok_s:.1f} tok/s"
        )
    return ""


def with_image(prof: profiles.Profile, ref: str, vllm_version: str | None = None) -> profiles.Profile:
    """The profile with another base image (`repository:tag`); the vLLM version it ships when given."""
    check_image_ref(ref)
    base, _, tag = ref.rpartition(":")
    doc = prof.model_dump()
    doc["image"] = {**doc["image"], "base": base, "tag": tag, "vllm_version": vllm_version}
    return _valid(doc, "--image")


def with_revision(prof: profiles.Profile, revision: str) -> profiles.Profile:
    return _valid({**prof.model_dump(), "revision": revision}, "--revision")


def _valid(doc: dict, flag: str) -> profiles.Profile:
    from pydantic import ValidationError

    try:
        return profiles.Profile.model_validate(doc)
    except ValidationError as e:
        first = e.errors()[0]
        raise InputError(f"{flag}: {first['msg']}", f"check the value given to {flag}") from None


def profile_at(prof: profiles.Profile, rec: known_good.GoodRecord, pin: bool = True) -> profiles.Profile:
    """The profile as it served when `rec` was recorded: its base image and, with `pin` (the revision is
    what changes), the commit the record names where it is not the profile's own revision."""
    out = with_image(prof, rec.base_image, rec.vllm_version or None) if rec.base_image else prof
    if pin and _COMMIT.match(rec.model_revision) and rec.model_revision != (prof.revision or ""):
        out = with_revision(out, rec.model_revision)
    return out


def same_serve(a: known_good.GoodRecord, b: known_good.GoodRecord) -> bool:
    return (a.base_image or a.image, a.model_revision) == (b.base_image or b.image, b.model_revision)


def rollback_target(history: list[known_good.GoodRecord], deployment: str) -> known_good.GoodRecord | None:
    """What `rollback` returns to: the newest good serve of the deployment other than the newest one."""
    mine = [r for r in history if r.deployment == deployment]
    if not mine:
        return None
    return next((r for r in reversed(mine[:-1]) if not same_serve(r, mine[-1])), None)


# ---- the gateway's hook ------------------------------------------------------------------------------


class Traffic(Protocol):
    """A gateway in front of a deployment: `hold` queues new requests (none dropped) while the
    deployment behind it restarts; `release` lets them through again. Each returns what it did."""

    def hold(self) -> str: ...
    def release(self) -> str: ...


def gateway_for(inv: Inventory, deployment: str) -> Traffic | None:
    """Every gateway that routes this deployment (issue 36), if one runs: the plan's traffic steps
    hold and release through them (deployment/gateway_hold.Holds)."""
    # lazy: only an upgrade or rollback runs it
    from sparkcluster.deployment import gateway_hold

    return gateway_hold.find(inv, deployment)


class Up(Protocol):
    """`up` as the command line hands it in (up/bringup.run): the new serve, the rollback's serve and
    the dry run's nested plan. `upgrade` names no other command; the CLI composes them."""

    def __call__(
        self,
        inv: Inventory,
        prof: profiles.Profile,
        secrets: dict[str, str],
        progress: StageProgress,
        *,
        dry_run: bool = False,
        node: tuple[str, ...] | None = None,
        command: str = "up",
        locked: bool = False,
    ) -> Any: ...


# ---- the run -----------------------------------------------------------------------------------------


@dataclass
class UpgradeRun:
    """What an upgrade's steps share: the inventory, both profiles, the last good record, and the state
    each step leaves (by its type, as `UpRun` keeps it). `refused` is the first reason to roll back."""

    inv: Inventory
    nodes: tuple[str, ...]
    new: profiles.Profile
    old: profiles.Profile
    good: known_good.GoodRecord
    secrets: dict[str, str]
    progress: StageProgress
    up: Up
    bound: float = SPEED_BOUND
    traffic: Traffic | None = None
    stage: str = ""
    refused: str = ""
    owned: dict[type, Any] = field(default_factory=dict, repr=False)

    @property
    def deployment(self) -> str:
        return self.good.deployment

    @property
    def target(self) -> Inventory:
        return deployments.target(self.inv, self.new, self.nodes)

    def put(self, value: T) -> T:
        self.owned[type(value)] = value
        return value

    def find(self, kind: type[T]) -> T | None:
        return self.owned.get(kind)


@dataclass(frozen=True)
class Baseline:
    answers: tuple
    deterministic: bool
    tok_s: float


@dataclass(frozen=True)
class Started:
    at: str  # when the new `up` began: records from then on are the new serve's


@dataclass(frozen=True)
class Measured:
    answers: tuple = ()
    verdict: canary.Verdict | None = None
    tok_s: float | None = None


@dataclass(frozen=True)
class Address:
    host: str  # the head as the controller reaches it (its SSH connection's address), as `bench` asks it


def _address(r: UpgradeRun, prof: profiles.Profile) -> tuple[str, int]:
    got = r.find(Address)
    if got is None:
        t = r.target
        with ConnectedHosts.connect(t, [t.head]) as cluster:
            got = r.put(Address(cluster.head.address))
    return got.host, prof.serve.port or r.target.cluster.api_port


@contextlib.contextmanager
def _reached(r: UpgradeRun, prof: profiles.Profile) -> Iterator[tuple[str, int]]:
    """(address, port) at which the controller asks the engine, for the block's length: the head's
    address, or a port forwarded through its SSH connection when engines listen only on the
    cluster's addresses (the gateway the only door: deployment/endpoint.reached)."""
    if r.target.cluster.engines_listen != "control":
        yield _address(r, prof)
        return
    t, port = r.target, prof.serve.port or r.target.cluster.api_port
    with ConnectedHosts.connect(t, [t.head]) as cluster, endpoint.reached(cluster.head, t, port) as base:
        at = urlsplit(base)
        yield at.hostname or "127.0.0.1", at.port or port


def _guarded(r: UpgradeRun, why, what, *args):
    """A step of the new serve: a failure becomes the reason to roll back (`why` words it), never an
    exception."""
    try:
        return what(r, *args)
    except SparkError as e:
        r.refused = r.refused or why(e.message)
        return r.refused


def take_baseline(r: UpgradeRun) -> Baseline:
    g = r.good
    if g.canary and g.canary_tok_s > 0:
        return r.put(Baseline(tuple(g.canary_answers()), g.canary_deterministic, g.canary_tok_s))
    model = r.old.served_model_name
    try:
        with _reached(r, r.old) as (address, port):
            first = endpoint.ask_canary(address, port, model, r.secrets)
            second = endpoint.ask_canary(address, port, model, r.secrets)
            tok_s = endpoint.ask_speed(address, port, model, r.secrets)
    except SparkError as e:
        raise SparkError(
            f"the last good serve's canary is not recorded and the deployment does not answer it now: {e.message}",
            f"sparkcluster up --profile {r.old.name}, then sparkcluster upgrade again",
        ) from None
    took = canary.take(first, second, deployment=r.deployment, profile=r.old.name, taken_at=known_good.now_utc())
    known_good.replace_newest(
        r.inv.cluster.name,
        replace(
            g,
            canary=known_good.answers_json(first),
            canary_deterministic=took.deterministic,
            canary_tok_s=round(tok_s, 3),
        ),
    )
    return r.put(Baseline(tuple(first), took.deterministic, tok_s))


def bring_up(r: UpgradeRun, prof: profiles.Profile, command: str) -> str:
    # the upgrade holds the nodes' locks across every step (`held`): this `up` takes none of its own
    r.up(r.inv, prof, r.secrets, r.progress, node=r.nodes or None, command=command, locked=True)
    return f"serving {prof.image.ref}"


def up_new(r: UpgradeRun) -> str:
    r.put(Started(known_good.now_utc()))
    return _guarded(r, lambda m: judge(up_failed=m), bring_up, r.new, f"upgrade --profile {r.new.name}")


def ask_probe(r: UpgradeRun) -> str:
    """/health, then a one-token completion of the new serve; a SparkError says what did not answer."""
    with _reached(r, r.new) as (address, port), httpx.Client() as client:
        base = f"http://{address}:{port}"
        code = endpoint.health(client, base)
        if code != 200:
            raise SparkError(f"/health answers {code or 'nothing'}")
        ok, why = endpoint.one_token(
            client, base, r.new.served_model_name, endpoint.headers(r.secrets), PROBE_TIMEOUT_S
        )
    if not ok:
        raise SparkError(why)
    return "answers"


def probe(r: UpgradeRun) -> str:
    return _guarded(r, lambda m: judge(probe=m), ask_probe)


def image_changed(r: UpgradeRun) -> bool:
    """Whether the new serve runs another image than the last good one: its canary is then judged
    by agreement, not identity (node/canary: vLLM repeats itself only on one version and hardware)."""
    before = r.good.base_image or r.old.image.ref
    return bool(before) and before != r.new.image.ref


def ask_answers(r: UpgradeRun) -> str:
    def ask(r: UpgradeRun) -> str:
        base = r.find(Baseline)
        kinds = canary.chat_kinds(supervised_argv(r.new))
        with _reached(r, r.new) as (address, port):
            fresh = endpoint.ask_canary(address, port, r.new.served_model_name, r.secrets)
            chats = [endpoint.ask_chat(address, port, r.new.served_model_name, r.secrets, k) for k in kinds]
        stored = canary.CanaryRecord(
            r.deployment, r.old.name, r.good.at, base.deterministic, list(base.answers), image_id=r.good.base_image
        )
        verdict = canary.compare(stored, fresh, image_changed(r), image_id=r.new.image.ref)
        r.put(Measured(tuple(fresh), verdict))
        chat = "; ".join(c for c in chats if c)
        r.refused = r.refused or judge(verdict=verdict, chat=chat)
        if chat and not verdict.problem:
            return chat
        told = f"; chat requests ({', '.join(kinds)}) answer well-formed" if kinds and not chat else ""
        return verdict.says + told

    return _guarded(r, str, ask)


def bench_speed(r: UpgradeRun) -> str:
    def ask(r: UpgradeRun) -> str:
        with _reached(r, r.new) as (address, port):
            tok_s = endpoint.ask_speed(address, port, r.new.served_model_name, r.secrets)
        got = r.find(Measured) or Measured()
        r.put(Measured(got.answers, got.verdict, tok_s))
        why = judge(tok_s=tok_s, good_tok_s=r.find(Baseline).tok_s, bound=r.bound)
        r.refused = r.refused or why
        return why or f"{tok_s:.1f} tok/s (last good: {r.find(Baseline).tok_s:.1f})"

    return _guarded(r, str, ask)


def _connected(r: UpgradeRun):
    return ConnectedHosts.connect(r.target)


def remove_image(r: UpgradeRun, node: str, ref: str) -> str:
    """One image reference removed from a node (the image itself goes with its last reference)."""

    with _connected(r) as cluster:
        try:
            cluster.hosts[node].docker().api.remove_image(ref)
        except docker.errors.NotFound:
            return f"{ref} was not there"
        except docker.errors.APIError as e:  # in use by a container: kept, and said so
            _log.warning("could not remove an image", node=node, image=ref, error=str(e))
            return f"{ref} kept: {e.explanation or e}"
    return f"removed {ref}"


def remove_revision(r: UpgradeRun, node: str, repo: str, commit: str) -> str:
    with _connected(r) as cluster:
        got = cluster.hosts[node].run(hfcache.rm_command(r.target.hf_cache(node), repo, commit), timeout=600, warn=True)
    return f"removed {repo}@{commit[:12]}" if got.ok else f"{repo}@{commit[:12]} kept: {got.stderr.strip()[-200:]}"


def record_good(r: UpgradeRun) -> str:
    """The new serve's record (`up` appended it) extended with the canary it just passed."""
    got = r.find(Measured) or Measured()
    newest = known_good.last_for(known_good.load(r.inv.cluster.name), r.deployment)
    if newest is not None and got.answers:
        known_good.replace_newest(
            r.inv.cluster.name,
            replace(
                newest,
                canary=known_good.answers_json(list(got.answers)),
                canary_deterministic=r.find(Baseline).deterministic,
                canary_tok_s=round(got.tok_s or 0.0, 3),
            ),
        )
    known_good.note_outcome(
        r.inv.cluster.name,
        known_good.UpgradeOutcome(
            r.deployment,
            known_good.now_utc(),
            r.new.image.ref,
            newest.model_revision if newest else "",
            "kept",
            f"{got.tok_s or 0:.1f} tok/s",
        ),
    )
    publish_history(r)
    return "recorded as the last good serve"


def publish_history(r: UpgradeRun) -> None:
    """The upgrade history, copied to the head for the gateway's console (deployment/head_records)."""
    name = r.inv.cluster.name
    doc = head_records.history_doc(known_good.load(name), known_good.load_outcomes(name))
    try:
        with _connected(r) as cluster:
            head_records.publish(cluster.head, name, "upgrades", doc, r.progress.info)
    except Exception as e:  # noqa: BLE001 (the controller's record is kept: the console's copy waits for the next)
        said = e.message if isinstance(e, SparkError) else f"{type(e).__name__}: {e}"
        r.progress.info(f"the console's copy of the upgrade history was not written: {said}")


def return_to_good(r: UpgradeRun) -> str:
    """`up` of the last good image and revision, then the new serve's records dropped."""
    started = r.find(Started)
    tried = known_good.last_for(known_good.load(r.inv.cluster.name), r.deployment)
    if started is not None:  # the new serve's own "good" record (its probe answered) was not good
        known_good.forget_since(r.inv.cluster.name, r.deployment, started.at)
    bring_up(r, r.old, f"upgrade --profile {r.old.name} (rolling back)")
    revision = tried.model_revision if tried is not None and started and tried.at >= started.at else ""
    known_good.note_outcome(
        r.inv.cluster.name,
        known_good.UpgradeOutcome(
            r.deployment, known_good.now_utc(), r.new.image.ref, revision, "rolled back", r.refused, r.good.at
        ),
    )
    publish_history(r)
    return f"serving {r.old.image.ref} again"


def hold(r: UpgradeRun) -> str:
    return r.traffic.hold()


def release(r: UpgradeRun) -> str:
    return r.traffic.release()


# ---- the plan ----------------------------------------------------------------------------------------


def _no_gateway(r: UpgradeRun) -> str | None:
    return None if r.traffic is not None else "no gateway fronts the deployment: clients see the restart"


def _after_failure(r: UpgradeRun) -> str | None:
    return f"refused: {r.refused}" if r.refused else None


def _unless_good(r: UpgradeRun) -> str | None:
    return None if r.refused else "the new serve is good"


@dataclass
class UpgradePlan:
    """An upgrade's steps, and the `up` plan of the new serve the `up` step walks (None in a rollback)."""

    title: str
    all_steps: list[Step]
    up_plan: Any = None  # up.plan.Plan: printed under the up step

    def steps(self) -> list[Step]:
        return list(self.all_steps)

    def render(self) -> str:
        def up_plan(s: Step) -> list[str]:
            if s.stage == "up" and s.action == "new" and self.up_plan is not None:
                return ["      " + ln for ln in self.up_plan.render().splitlines()]
            return []

        return redact.mask("\n".join([self.title, *render_steps(self.all_steps, up_plan)]))

    def as_json(self) -> list[dict]:
        out = []
        for s in self.all_steps:
            out.append(s.public())
            if s.stage == "up" and s.action == "new" and self.up_plan is not None:
                out += [{**x, "within": s.id} for x in (p.public() for p in self.up_plan.steps())]
        return out


def _hold_step(head: str) -> Step:
    return Step(
        "hold",
        head,
        "gateway",
        "hold the gateway's requests",
        when="a gateway fronts the deployment",
        run=hold,
        skip=_no_gateway,
    )


def _release_step(head: str) -> Step:
    return Step(
        "release",
        head,
        "gateway",
        "release the gateway's held requests",
        when="a gateway fronts the deployment",
        run=release,
        skip=_no_gateway,
    )


def _remove_image_step(
    stage: str, node: str, ref: str, which: str, when: str, skip: Callable[[UpgradeRun], str | None]
) -> Step:
    return Step(
        stage,
        node,
        f"rmi-{ref}",
        f"remove the {which} image {ref}",
        f"docker image rm {ref}",
        when=when,
        skip=skip,
        run=lambda r: remove_image(r, node, ref),
    )


def upgrade_steps(
    inv: Inventory, head: str, new: profiles.Profile, old: profiles.Profile, good: known_good.GoodRecord, bound: float
) -> list[Step]:
    """Pure: every step of an upgrade from `old` (the last good serve, `good`) to `new`, rollback included."""
    nodes = sorted(good.nodes) or [head]
    old_ref, new_ref = image_ref(inv, old), image_ref(inv, new)

    # only what sparkcluster made or sent: the base image an owner pulled onto the head is theirs (and
    # `rollback` rebuilds the old cluster image from it)
    def ours(ref: str, prof: profiles.Profile, node: str) -> list[str]:
        return [] if node == head and ref == prof.image.ref else [ref]

    gone = {n: ours(old_ref, old, n) if old_ref != new_ref else [] for n in nodes}
    fresh = {n: ours(new_ref, new, n) if old_ref != new_ref else [] for n in nodes}
    rev_old = good.model_revision if _COMMIT.match(good.model_revision) and old.model == new.model else ""
    failed = "any step of the new serve failed"
    kinds = canary.chat_kinds(supervised_argv(new))
    out = [
        _hold_step(head),
        Step(
            "baseline",
            head,
            "canary",
            f"the last good serve's canary ({good.at}, {good.base_image or good.image})",
            "from the known-good record; when it has none yet: the canary's prompts twice and a one-stream "
            "bench asked of the serving deployment, kept in the record",
            run=take_baseline,
        ),
        Step(
            "up",
            head,
            "new",
            f"up --profile {new.name} with image {new.image.ref}"
            + (f", revision {new.revision}" if new.revision and new.revision != old.revision else ""),
            "distributes what is new (image, weights), then recreates the containers and serves; the old image "
            "and revision stay until the canary passes",
            run=up_new,
        ),
        Step(
            "canary",
            head,
            "probe",
            "the probe: /health and a one-token completion",
            f"timeout {PROBE_TIMEOUT_S:g}s",
            run=probe,
            skip=_after_failure,
        ),
        Step(
            "canary",
            head,
            "answers",
            f"the canary's {len(canary.PROMPTS)} fixed greedy completions against the last good serve's"
            + (f", and one chat request of each kind the profile enables ({', '.join(kinds)})" if kinds else ""),
            "/v1/completions temperature 0, seed 0, max_tokens "
            f"{canary.MAX_TOKENS}; a changed answer of a deterministic model refuses the upgrade"
            + (
                f" (across an image change: each answer must agree with the last good one over its first "
                f"{canary.IMAGE_CHANGE_AGREEMENT:.0%} of tokens)"
                if (good.base_image or old.image.ref) != new.image.ref
                else " (the same image: the same token IDs)"
            )
            + ("; a chat answer other than a well-formed 200 refuses it" if kinds else ""),
            run=ask_answers,
            skip=_after_failure,
        ),
        Step(
            "bench",
            head,
            "speed",
            "one-stream decode speed after 2 warm-up requests",
            f"4 requests of 64 tokens at concurrency 1; refused below {bound:.0%} of the last good serve's figure",
            run=bench_speed,
            skip=_after_failure,
        ),
    ]
    for n in nodes:
        for ref in gone[n]:
            out.append(_remove_image_step("prune", n, ref, "old", "the canary and the bench passed", _after_failure))
        if rev_old and new.revision and new.revision != rev_old:
            out.append(
                Step(
                    "prune",
                    n,
                    f"rm-{rev_old[:12]}",
                    f"remove the old revision's files {old.model}@{rev_old[:12]}",
                    "sparkcluster weights rm --commit",
                    when="the canary and the bench passed",
                    skip=_after_failure,
                    run=lambda r, n=n: remove_revision(r, n, old.model, rev_old),
                )
            )
    out.append(
        Step(
            "prune",
            head,
            "record",
            "record the new serve as the last good one, with its canary",
            when="the canary and the bench passed",
            run=record_good,
            skip=_after_failure,
        )
    )
    out.append(
        Step(
            "rollback",
            head,
            "up-good",
            f"up --profile {old.name} with the last good image {old.image.ref}, revision {good.model_revision}",
            "its plan is made then, from the facts of that moment; the new serve's record is dropped and "
            "the reason kept",
            when=failed,
            run=return_to_good,
            skip=_unless_good,
        )
    )
    for n in nodes:
        for ref in fresh[n]:
            out.append(_remove_image_step("rollback", n, ref, "new", failed, _unless_good))
    out.append(_release_step(head))
    return out


def rollback_steps(inv: Inventory, head: str, back: profiles.Profile, to: known_good.GoodRecord) -> list[Step]:
    """Pure: `sparkcluster rollback`: the last good serve brought back (its image is kept until then)."""
    return [
        _hold_step(head),
        Step(
            "rollback",
            head,
            "up-good",
            f"up --profile {back.name} with the good serve of {to.at}: image "
            f"{back.image.ref}, revision {to.model_revision}",
            "its plan is made then, from the facts of that moment",
            run=lambda r: bring_up(r, back, f"rollback --profile {back.name}"),
        ),
        Step("rollback", head, "record", "record the rollback", run=lambda r: _note_rollback(r, to)),
        _release_step(head),
    ]


def _note_rollback(r: UpgradeRun, to: known_good.GoodRecord) -> str:
    known_good.note_outcome(
        r.inv.cluster.name,
        known_good.UpgradeOutcome(
            r.deployment,
            known_good.now_utc(),
            to.base_image or to.image,
            to.model_revision,
            "rollback",
            "asked",
            to.at,
        ),
    )
    publish_history(r)
    return "recorded"


def _summary(done: list[tuple[Step, Any]]) -> str:
    return "; ".join(str(v) for _, v in done if v)


def _of(name: str):
    return lambda plan: [s for s in plan.steps() if s.stage == name]


# the stages of an upgrade and of a rollback, in the order they run (the contract of `steps/base`)
STAGES: dict[str, Stage] = {
    name: Stage(name, _of(name), _summary, leaves=leaves)
    for name, leaves in (
        ("hold", ()),
        ("baseline", (Baseline, Address)),
        ("up", (Started,)),
        ("canary", (Measured, Address)),
        ("bench", (Measured,)),
        ("prune", ()),
        ("rollback", ()),
        ("release", ()),
    )
}


# ---- the commands ------------------------------------------------------------------------------------


class UpgradeRefused(SparkError):
    """The new serve failed its canary: the last good one serves again."""


def _good_record(inv: Inventory, prof: profiles.Profile, nodes) -> known_good.GoodRecord:
    target = deployments.target(inv, prof, nodes)
    key = f"{prof.name}@{'+'.join(n.name for n in target.nodes)}"
    rec = known_good.last_for(known_good.load(inv.cluster.name), key)
    if rec is None:
        raise InputError(
            f"no good serve of {key} is recorded on this machine: an upgrade needs one to return to",
            f"sparkcluster up --profile {prof.name}{deployments.node_flags(nodes)} (records it once it serves), "
            "then sparkcluster upgrade",
        )
    return rec


def refuse_on_demand(prof: profiles.Profile) -> None:
    """An upgrade's canary and bench ask a serving engine; an on-demand deployment's `up` leaves it on
    standby (nothing to ask), so the new serve would always be refused: said before anything moves."""
    if prof.on_demand.enabled:
        raise InputError(
            f"profile '{prof.name}' runs on demand: upgrade cannot judge a serve left on standby",
            f"set [on_demand] enabled = false in {prof.name} for the upgrade (sparkcluster upgrade serves it "
            "and canaries it), then turn it back on and run sparkcluster up",
        )


def plan_upgrade(
    inv: Inventory,
    prof: profiles.Profile,
    image: str | None = None,
    revision: str | None = None,
    *,
    vllm_version: str | None = None,
    nodes: tuple[str, ...] = (),
    bound: float = SPEED_BOUND,
) -> tuple[UpgradePlan, profiles.Profile, profiles.Profile, known_good.GoodRecord]:
    """The upgrade's plan from the last good serve (the profile as it served then) to the same with
    `image` and/or `revision`; the new profile and the old one."""
    if not image and not revision:
        raise InputError("upgrade to what?", "name a new image (--image REPO:TAG) or a new model revision (--revision)")
    refuse_on_demand(prof)
    good = _good_record(inv, prof, nodes)
    old = profile_at(prof, good, pin=bool(revision))
    new = with_image(old, image, vllm_version) if image else old
    new = with_revision(new, revision) if revision else new
    if new.image.ref == old.image.ref and (new.revision or "") == (old.revision or ""):
        raise InputError(
            f"the last good serve of {good.deployment} already has image {new.image.ref}"
            + (f" and revision {new.revision}" if new.revision else ""),
            "name a new image (--image REPO:TAG) or a new model revision (--revision)",
        )
    head = deployments.target(inv, prof, nodes).head.name
    title = (
        f"upgrade of {good.deployment} on cluster '{inv.cluster.name}': {old.image.ref} -> {new.image.ref}"
        f" (rolls back by itself unless the canary and the bench hold)"
    )
    return UpgradePlan(title, upgrade_steps(inv, head, new, old, good, bound)), new, old, good


@contextlib.contextmanager
def held(r: UpgradeRun, command: str) -> Iterator[None]:
    """The locks of the deployment's nodes, one for the whole transaction; a run that holds one already
    makes this fail at once with `LockHeld`, naming it."""
    target = r.target
    with ConnectedHosts.connect(target) as cluster, NodeLocks(cluster, target, command):
        yield


def walk_plan(r: UpgradeRun, plan: UpgradePlan) -> None:
    """Stage by stage, as `up`'s executor walks its plan; held traffic is released whatever happens."""

    def stage(st: Stage) -> None:
        mine = st.steps(plan)
        if not mine:
            return
        r.stage = st.name
        r.progress.stage(st.name)
        t = time.monotonic()
        done = walk(r, mine)
        r.progress.done(st.name, time.monotonic() - t, st.summary(done))

    try:
        for st in STAGES.values():
            if st.name != "release":
                stage(st)
    finally:
        stage(STAGES["release"])


def upgrade(
    inv: Inventory,
    prof: profiles.Profile,
    secrets: dict[str, str],
    progress: StageProgress,
    *,
    up: Up,
    image: str | None = None,
    revision: str | None = None,
    vllm_version: str | None = None,
    nodes: tuple[str, ...] = (),
    bound: float = SPEED_BOUND,
    dry_run: bool = False,
) -> UpgradePlan | str:
    plan, new, old, good = plan_upgrade(inv, prof, image, revision, vllm_version=vllm_version, nodes=nodes, bound=bound)
    if dry_run:
        plan.up_plan = up(inv, new, secrets, progress, dry_run=True, node=nodes or None)
        return plan
    r = UpgradeRun(inv, nodes, new, old, good, secrets, progress, up, bound, gateway_for(inv, good.deployment))
    try:
        with held(r, f"upgrade --profile {prof.name}"):
            walk_plan(r, plan)
    except SparkError as e:
        if not r.refused:
            raise
        raise SparkError(
            f"upgrade to {new.image.ref} refused ({r.refused}) and the rollback failed: {e.message}",
            f"sparkcluster rollback --profile {prof.name}{deployments.node_flags(nodes)} once the cause is fixed",
            details=e.details,
        ) from e
    if r.refused:
        raise UpgradeRefused(
            f"upgrade to {new.image.ref} refused and rolled back: {r.refused}",
            f"{old.image.ref} serves again; the reason is kept (sparkcluster rollback --history); fix the new "
            "image or revision, then upgrade again",
        )
    return f"{good.deployment} now serves {new.image.ref}; {old.image.ref} pruned"


def rollback(
    inv: Inventory,
    prof: profiles.Profile,
    secrets: dict[str, str],
    progress: StageProgress,
    *,
    up: Up,
    nodes: tuple[str, ...] = (),
    dry_run: bool = False,
) -> UpgradePlan | str:
    refuse_on_demand(prof)
    good = _good_record(inv, prof, nodes)
    to = rollback_target(known_good.load(inv.cluster.name), good.deployment)
    if to is None:
        raise InputError(
            f"{good.deployment} has no earlier good serve with another image or revision to return to",
            "sparkcluster rollback --history lists the recorded serves and upgrades",
        )
    back = profile_at(prof, to, pin=to.model_revision != good.model_revision)
    head = deployments.target(inv, prof, nodes).head.name
    plan = UpgradePlan(
        f"rollback of {good.deployment} on cluster '{inv.cluster.name}': to the good serve of {to.at} "
        f"({back.image.ref}, revision {to.model_revision})",
        rollback_steps(inv, head, back, to),
    )
    if dry_run:
        return plan
    r = UpgradeRun(inv, nodes, back, back, good, secrets, progress, up, traffic=gateway_for(inv, good.deployment))
    with held(r, f"rollback --profile {prof.name}"):
        walk_plan(r, plan)
    return f"{good.deployment} serves {back.image.ref} again (the good serve of {to.at})"
