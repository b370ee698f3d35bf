"""The serve stage: the HF token file on every node, the reasoning-parser plugin, the old server
stopped when one runs in a kept container, `vllm serve` started inside the head container, the
wait until it really answers, then one warm-up request, the transport every rank's NCCL chose, and
the correctness canary (taken on the first good serve, else compared with the kept answers)."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import docker.errors

from sparkcluster import redact
from sparkcluster.config import bounds, repos
from sparkcluster.config.profile import profile_hash
from sparkcluster.deployment import (
    canary_watch,
    endpoint,
    engine_ranks,
    failed_serve,
    gateway_registry,
    known_good,
    server,
    supervision,
    teardown,
)
from sparkcluster.errors import SparkError, StageError, StepFailure
from sparkcluster.fabric import engine_nccl
from sparkcluster.labels import container_name
from sparkcluster.node import canary, contract, engine_log
from sparkcluster.remote import retry
from sparkcluster.remote.dockerapi import UNREACHABLE
from sparkcluster.steps.base import Step, fail
from sparkcluster.up.stages import weights
from sparkcluster.up.stages.image import HeadImage

if TYPE_CHECKING:
    from sparkcluster.config import profile as profiles
    from sparkcluster.config.inventory import Inventory
    from sparkcluster.up.execute import UpRun
    from sparkcluster.up.plan import Plan

STAGE = "serve"
SUPERVISOR_CONFIRM_S = 10.0  # its looks are 2 s apart; one of them probes with the profile's bound
# one canary answer (16 tokens) within this, else `up` says the canary was not asked and ends serving
CANARY_TIMEOUT_S = 30.0


def steps(plan: Plan) -> list[Step]:
    sv, inv = plan.serve, plan.inventory
    if sv is None:
        return []
    head = inv.head.name
    out = []
    if "HF_TOKEN" in plan.secret_names:
        # Every rank downloads weights, but vLLM must not copy HF_TOKEN into the worker ranks' Ray
        # runtime_env (it shows on their command lines); huggingface_hub reads the token file in
        # the mounted cache instead, as after `huggingface-cli login`
        for n in inv.nodes:
            out.append(
                Step(
                    STAGE,
                    n.name,
                    "hf-token",
                    "write the HF token file",
                    f"{server.token_file_command(inv.hf_cache(n.name))}  (HF_TOKEN=****** on stdin over SSH)",
                    run=lambda r, n=n.name: write_token(r, n),
                    parallel="hf-token",
                )
            )
    if sv.plugin and not repos.plugin_file(sv.plugin[0]):
        # a plugin from a hub repository is staged and linked by the weights stage on every node
        out.append(
            Step(
                STAGE,
                head,
                "plugin",
                "stage the reasoning-parser plugin",
                f"docker exec --user {inv.owner(head) or 'root'} -e HF_TOKEN=****** {sv.container} "
                + shlex.join(server.stage_plugin_command(*sv.plugin)),
                run=stage_plugin,
            )
        )
    if plan.old_server is not None and not plan.containers:
        pid = plan.old_server.pid
        out.append(
            Step(
                STAGE,
                head,
                "stop-old",
                f"stop the running vllm serve (pid {pid})",
                f"the supervisor is told no server is wanted, then stops pid {pid} (SIGTERM, "
                f"SIGKILL after {teardown.STOP_GRACE_S:g}s)",
                when=f"pid {pid} still runs as the recorded server",
                skip=lambda r: _old_gone(r, pid),
                run=lambda r: teardown.stop_server(r.cluster.head, r.plan.serve.container),
            )
        )
    if plan.profile.on_demand.enabled:
        # on demand (issue 36): handed over on standby; a request through the gateway starts it
        out.append(
            Step(
                STAGE,
                head,
                "standby",
                "hand vllm serve to the supervisor on standby",
                f"{sv.describe()}; on demand: not started now (no memory held); a request through the "
                f"gateway wakes it (a wake token, 0600 in {sv.container}), each start admitted against every "
                f"node's memory; stopped after {plan.profile.on_demand.idle_ttl_s:g}s idle",
                run=standby,
            )
        )
        return out
    out.append(Step(STAGE, head, "start", "start vllm serve", sv.describe(), run=start))
    out.append(
        Step(
            STAGE,
            head,
            "ready",
            "wait until ready",
            f"/health is 200 and a one-token chat completion succeeds, within {plan.profile.ready_timeout_s}s; "
            "then the supervisor reports it serving",
            run=wait_ready,
        )
    )
    out.append(
        Step(
            STAGE,
            head,
            "warm-up",
            "one warm-up request",
            "an 8-token chat completion, so the first user request does not pay for JIT compilation",
            run=warm_up,
        )
    )
    out += _rank_checks(plan, head)
    out.append(
        Step(
            STAGE,
            head,
            "canary",
            "the correctness canary",
            f"the {len(canary.PROMPTS)} fixed prompts answered greedily (token ids, seed {canary.SEED}, "
            f"{canary.MAX_TOKENS} tokens), one at a time: taken (twice: do they repeat?) on the deployment's first "
            "good serve, else compared with the answers kept in its known-good record; a difference is a "
            "journal event and a status line, never a failed up",
            run=ask_canary,
        )
    )
    return out


def _rank_checks(plan: Plan, head: str) -> list[Step]:
    """What the engine's ranks say once it serves on several nodes: the NCCL transport and the
    all-reduce backend each rank took (one node: nothing to judge between ranks)."""
    if len(plan.inventory.nodes) <= 1:
        return []
    return [
        Step(
            STAGE,
            head,
            "nccl",
            "the engine's NCCL transport on every rank",
            "each container's NCCL init files (NCCL_DEBUG_FILE): TCP sockets where the nodes have RoCE "
            "links fails the stage (an engine without NCCL writes none: nothing to judge)",
            run=engine_transport,
        ),
        Step(
            STAGE,
            head,
            "all-reduce",
            "the engine's all-reduce backend on every rank",
            "each rank's 'Using [...] all-reduce backends' line in its serve log: a profile that asks for "
            "RoCEnante (VLLM_ENABLE_ROCE_ALLREDUCE=1) while a rank runs without it, or ranks that disagree, "
            "fail the stage (an engine that names none, the CPU build: not reported)",
            run=engine_all_reduce,
        ),
    ]


def summary(done: list[tuple[Step, object]]) -> str:
    if any(s.action == "standby" for s, _ in done):
        return "on standby (starts on demand)"
    return f"ready after {sum(v for s, v in done if s.action in ('ready', 'warm-up')):.1f}s"


def write_token(r: UpRun, node: str) -> None:
    r.cluster.hosts[node].run(
        server.token_file_command(r.inv.hf_cache(node)), timeout=30, stdin=r.secrets["HF_TOKEN"].encode()
    )


def stage_plugin(r: UpRun) -> None:
    sv, head = r.plan.serve, r.cluster.head
    api = head.docker().api
    env = {k: v for k, v in r.secrets.items() if k == "HF_TOKEN"}
    argv = server.stage_plugin_command(*sv.plugin)
    # as the SSH user, so the file in its HF cache is its own (the container runs as root)
    ex = api.exec_create(sv.container, argv, environment=env, user=r.inv.owner(head.name) or "")
    out = api.exec_start(ex["Id"]).decode(errors="replace")
    if api.exec_inspect(ex["Id"]).get("ExitCode", 1) != 0:
        raise fail(
            STAGE,
            head.name,
            "stage the reasoning-parser plugin",
            f"fetch of {sv.plugin[0]} failed",
            shlex.join(argv),
            redact.mask(out),
        )


def _old_gone(r: UpRun, pid: int) -> str | None:
    rec = server.current(r.cluster.head.docker().api, r.plan.serve.container)
    return None if rec is not None and rec.pid == pid else "it no longer runs"


def start(r: UpRun) -> None:
    _hand(r, server.start, "start vllm serve")
    hand_wake_token(r, on_demand=False)


def standby(r: UpRun) -> None:
    _hand(r, server.standby, "hand vllm serve to the supervisor on standby")
    hand_wake_token(r)


def hand_wake_token(r: UpRun, on_demand: bool = True) -> None:
    """Every running gateway that routes this deployment, on any node of the inventory that answers
    (the gateway may run outside the deployment's nodes: `gateway up --node`), gets the wake token
    the head holds now: a new head container has a new token, and the gateway's old one would be
    refused (401 on every wake: 503 for its clients until the next `gateway up`). A node where the
    look fails is said, never a failed `up`: `sparkcluster gateway up` hands the token over too."""
    key = deployment_key(r.inv, r.plan.profile)
    token = server.read_wake_token(r.cluster.head.docker().api, r.plan.serve.container)
    if not token:
        return
    for name, host in (r.reach or r.cluster.hosts).items():
        try:
            api = host.docker().api
            got = gateway_registry.routing(api, r.inv.cluster.name, key)
            if got is None:
                continue
            container, doc = got
            routes = [d for d in doc["deployments"] if d.get("key") == key]
            fields = ("wake_token", "agent_token") if on_demand else ("agent_token",)
            if all(d.get(f) == token for d in routes for f in fields):
                continue
            for d in routes:
                d.update(dict.fromkeys(fields, token))
            gateway_registry.write_doc(api, container, doc)
        except (SparkError, docker.errors.DockerException, ValueError, *UNREACHABLE) as e:
            r.progress.info(
                redact.mask(
                    f"could not look for a gateway routing {key} on {name} ({type(e).__name__}: {e}); if one "
                    "runs there, sparkcluster gateway up gives it the new wake token"
                )
            )
            continue
        r.progress.info(f"gateway {container} on {name}: the new wake token of {key} handed over")


def _hand(r: UpRun, how, what: str) -> None:
    """The server handed to the head's supervisor (`how`: server.start, or server.standby on
    demand), its Record or Standby kept in the run; a supervisor that does not take it fails the step."""
    prof = r.plan.profile
    try:
        r.put(
            how(
                r.cluster.head.docker().api,
                r.plan.serve,
                r.secrets,
                prof.name,
                bounds.profile_policy(prof),
                rank_apis={n: r.cluster.hosts[n].docker().api for n, _c, _a in r.plan.serve.ranks},
            )
        )
    except server.NotReady as e:
        raise failed_start(r, what, e) from None


def failed_start(r: UpRun, step: str, e: server.NotReady) -> StageError:
    """The stage's error for a server that did not come up: the first failure among the ranks' logs
    (never the shutdown noise after it), named by rank and node, those logs kept on the controller
    before the rollback removes the containers (deployment/failed_serve), the folder in the fix."""
    head = r.cluster.head.name
    logs = {
        n.name: failed_serve.read_logs(
            r.cluster.hosts[n.name].docker().api,
            container_name(r.inv.cluster.name, "head" if n.name == head else "worker", n.name, r.inv.slot),
        )
        for n in r.inv.nodes
        if n.name in r.cluster.hosts
    }
    kept = failed_serve.keep(deployment_key(r.inv, r.plan.profile), logs)
    found = kept.error({str(n.control_ip): n.name for n in r.inv.nodes})
    offline = weights.offline_miss(e.tail or "", r.plan.profile.model)
    if offline or not found:
        reason, tail = offline or e.reason, e.tail
    else:
        reason, tail = f"{e.reason}: {found[0]}", found[1]
    cause = kept.cause()
    fix = (cause.fix + "; " if cause and not offline else "") + (
        f"the engine's logs are kept in {kept.folder} (sparkcluster logs says where); fix, then sparkcluster up"
    )
    return fail(STAGE, head, step, reason, r.plan.serve.describe(), tail, fix)


def waiting(r: UpRun):
    """What `up` does while the engine is not ready: says so, and follows the ranks' warm-up."""
    watch = WarmupWatch(r)

    def on_wait(why: str, s: float) -> None:
        r.progress.info(f"waiting for the server ({s:.0f}s): {why}")
        watch(why, s)

    return on_wait


def _reached(r: UpRun):
    """The engine's base URL from here, for the block's length (through the head's SSH connection
    when engines listen only on the cluster's addresses)."""
    return endpoint.reached(r.cluster.head, r.inv, r.plan.serve.port)


def wait_ready(r: UpRun) -> float:
    sv, head = r.plan.serve, r.cluster.head
    api = head.docker().api
    try:
        with _reached(r) as base:
            took = server.wait_ready(
                api,
                r.get(server.Record),
                sv,
                base,
                r.secrets,
                r.plan.profile.ready_timeout_s,
                on_wait=waiting(r),
            )
    except server.NotReady as e:
        raise failed_start(r, "wait until ready", e) from None

    # `up` says serving only once the supervisor watches a server it has seen answer: a wedge in the
    # next second is then its to catch (it only judges an engine it has seen ready)
    def watching() -> bool | None:
        st = supervision.state(api, sv.container)
        return True if st and st.kind == contract.SERVING and st.generation == r.get(server.Record).generation else None

    bound = SUPERVISOR_CONFIRM_S + r.plan.profile.supervisor.probe_timeout_s
    if retry.poll(watching, timeout=bound, interval=0.25, what="the supervisor") is None:
        st = supervision.state(api, sv.container)
        raise fail(
            STAGE,
            head.name,
            "wait until ready",
            f"the server answers, but the supervisor has not seen it serve within {bound:g}s "
            f"(its state: {st.state if st else 'none'})",
            sv.describe(),
            server.supervisor_tail(api, sv.container),
            "sparkcluster events shows what the supervisor saw; sparkcluster up again",
        )
    return took


def engine_transport(r: UpRun) -> dict[str, str]:
    """What every rank's NCCL chose, read from the containers once the engine answers (its ranks have
    initialised NCCL by then); sockets while the deployment has RoCE links fails `up` on that node."""
    texts = r.cluster.each(
        lambda h: engine_nccl.read_node(h, r.inv.cluster.name), [r.cluster.hosts[n.name] for n in r.inv.nodes]
    ).values_or_raise(STAGE)
    seen, problems = engine_nccl.summaries(r.inv, texts)
    if problems:
        raise StageError(
            STAGE,
            [StepFailure(node, "the engine's NCCL transport", what) for node, what in problems],
            "`sparkcluster doctor --fabric` names the cause; fix it, then sparkcluster up",
        )
    return seen


def engine_all_reduce(r: UpRun) -> str:
    """The backend that serves the TP all-reduce, as every rank's log names it (issue 59); kept for
    the perf record. A profile's request the ranks did not follow fails `up`."""
    outs = r.cluster.each(
        lambda h: engine_ranks.read_node(h, r.inv.cluster.name), [r.cluster.hosts[n.name] for n in r.inv.nodes]
    ).values_or_raise(STAGE)
    status, serving, what, fix = engine_ranks.all_reduce(outs)
    if status == "fail":
        raise StageError(STAGE, [StepFailure(r.inv.head.name, "the engine's all-reduce backend", what)], fix)
    return serving


class WarmupWatch:
    """`up`'s look at the ranks' warm-up phases while it waits for the engine (issue 59): every
    EVERY_S it reads each node's serve log; ranks in different phases for the profile's
    `warmup_drift_s` are a verdict naming each rank's phase, before the 1800 s barrier kills them."""

    EVERY_S = 10.0

    def __init__(self, r: UpRun):
        self.r, self.clock, self.read_at = r, engine_log.DriftClock(), float("-inf")

    def __call__(self, why: str, waited: float) -> None:
        bound = self.r.plan.profile.warmup_drift_s
        if not bound or waited - self.read_at < self.EVERY_S or len(self.r.inv.nodes) < 2:
            return
        self.read_at = waited
        got = self.r.cluster.each(
            lambda h: engine_ranks.read_node(h, self.r.inv.cluster.name),
            [self.r.cluster.hosts[n.name] for n in self.r.inv.nodes],
        )
        outs = {n: o.value for n, o in got.items() if o.ok}
        ph = engine_log.phases(engine_ranks.split(outs)[1])
        apart = self.clock.see(ph, waited)
        if apart >= bound:
            raise fail(
                STAGE,
                self.r.inv.head.name,
                "wait until ready",
                f"the ranks have been in different warm-up phases for {apart:.0f}s (warmup_drift_s {bound}): "
                + engine_log.drift_text(ph),
                self.r.plan.serve.describe(),
                "",
                "a rank behind in autotuning tunes from scratch: keep FlashInfer's autotune cache on every node "
                "or set env.flashinfer_autotune_sync in the profile (vllm-project/vllm PR #52292; ainode#134); "
                "a rank behind in weights reads slower storage; then sparkcluster up",
            )


def warm_up(r: UpRun) -> float:
    with _reached(r) as base:
        return endpoint.warm_up(base, r.plan.serve.model, r.secrets)


def ask_canary(r: UpRun) -> str:
    """The canary of this serve (deployment/canary_watch), kept in the run for the known-good record `up`
    appends once it ends; what it found is handed to the head (journal, status). Never fails `up`."""
    prof, sv, head = r.plan.profile, r.plan.serve, r.cluster.head
    key = deployment_key(r.inv, prof)
    try:
        before = known_good.last_for(known_good.load(r.inv.cluster.name), key)
        with _reached(r) as base:  # through the head's SSH connection when the gateway is the only door
            at = urlsplit(base)
            kept = r.put(
                canary_watch.after_serve(
                    before,
                    prof.model,
                    lambda: endpoint.ask_canary(at.hostname, at.port, sv.model, r.secrets, CANARY_TIMEOUT_S),
                    served_now(r),
                    "up",
                )
            )
    except Exception as e:  # the canary reports; serving matters more
        r.progress.info(f"canary: not asked: {e}")
        return "not asked"
    if kept.verdict is not None and kept.verdict.state != "same":
        r.progress.info(f"canary: {kept.verdict.says}")
    try:
        canary_watch.hand(head.docker().api, sv.container, canary_watch.reference(key, prof.name, kept), kept.check)
    except Exception as e:
        r.progress.info(f"canary: could not hand it to the head container: {e}")
    return kept.says()


def deployment_key(inv: Inventory, prof: profiles.Profile) -> str:
    """PROFILE@NODE+NODE: the deployment's name in its known-good record."""
    return f"{prof.name}@{'+'.join(n.name for n in inv.nodes)}"


def served_now(r: UpRun) -> dict[str, str]:
    """What serves now, as the canary names what changed since it was taken (node/canary.since)."""
    prof = r.plan.profile
    return {
        "image_id": served_image_id(r),
        "model_revision": served_revision(r),  # unknown (the weights stage did not run): not compared
        "vllm_version": prof.image.vllm_version or "",
        "profile_hash": profile_hash(prof),
    }


def served_image_id(r: UpRun) -> str:
    got = r.find(HeadImage)
    return (got.info.get("Id", "") if got else "") or r.facts[r.inv.head.name].image_id or ""


def served_revision(r: UpRun) -> str:
    """The commit the profile's model resolved to in the weights stage ("" when it did not run)."""
    got = r.find(weights.Stagings)
    first = got.items[0] if got and got.items else None
    return first.manifest.commit if first is not None and first.manifest is not None else ""
