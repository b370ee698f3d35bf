"""`up`: from bare Sparks to an endpoint that answers.

The flow is the architecture: lint, connect, lock, gather facts and check (preflight), make a plan
from the facts (`plan.make_plan`: the ordered steps of every stage), then execute those same steps
(`execute`). `--dry-run` prints the plan and stops. This module keeps only the order, the lock,
the rollback and the summary.

Rollback follows what existed before the run: what this run created (its containers, its server)
is removed; what was already there is left alone unless the plan itself replaced it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from sparkcluster import log
from sparkcluster.config import bounds, lint
from sparkcluster.config import profile as profiles
from sparkcluster.config.flags import engine_host, reached_at
from sparkcluster.config.images import image_ref
from sparkcluster.config.inventory import Inventory
from sparkcluster.deployment import canary_watch, deployments, endpoint, head_records, known_good, server, teardown
from sparkcluster.errors import InputError, StageError, StepFailure
from sparkcluster.fabric import engine_nccl
from sparkcluster.labels import ROLE_LABEL
from sparkcluster.node import contract, memory_fit
from sparkcluster.remote.fanout import ConnectedHosts, connect_reachable, unreachable_error
from sparkcluster.remote.lock import NodeLocks
from sparkcluster.steps.walk import StageProgress
from sparkcluster.up.execute import UpRun, execute, record_before_plan
from sparkcluster.up.plan import Plan, make_offline_plan, make_plan
from sparkcluster.up.stages import gate, serve
from sparkcluster.up.stages.containers import Created
from sparkcluster.up.stages.replace import Away

_log = log.get(__name__)
# how long a serving engine may take to answer one token before `up` calls it wedged
WEDGE_PROBE_S = 20.0


class Monitoring(Protocol):
    """What monitoring does around planned work (monitor/planned.planned, which the CLI hands in, as
    `down` composes it): a context manager over the run, given the connected hosts by name, the whole
    inventory, the nodes the run touches and why."""

    def __call__(self, hosts: dict, inv: Inventory, nodes: list[str], why: str) -> AbstractContextManager: ...


@dataclass
class UpSummary:
    unchanged: bool
    endpoint: str
    model: str
    pid: int | None
    seconds: dict[str, float]
    slot: int = 0  # the deployment's slot on its nodes (issue 60): its container names and ports


def lint_fix(prof: profiles.Profile, full: Inventory, node, problems: list[lint.Problem]) -> str:
    """What to change, in which file, and the check that judges it as `up` did (the same inventory and
    nodes: without them `profile lint` skips the rules about the cluster, and may answer "ok")."""
    import shlex

    what = problems[0].fix if len(problems) == 1 else "make each fix above"
    where = f" in {prof.path}" if prof.path else ""
    try:
        named = prof.path is not None and profiles.find(prof.name).resolve() == prof.path
    except InputError:
        named = False
    check = shlex.join(
        ["sparkcluster", *(["-i", str(full.path)] if full.path else []), "profile", "lint"]
        + [prof.name if named or prof.path is None else str(prof.path)]
    )
    return f"{what}{where}; then check with: {check}{deployments.node_flags(node)}"


def run(
    inv: Inventory,
    prof: profiles.Profile,
    secrets: dict[str, str],
    progress: StageProgress,
    *,
    monitoring: Monitoring,
    dry_run: bool = False,
    offline: bool = False,
    replace: bool = False,
    command: str = "up",
    node: tuple[str, ...] | str | None = None,
    locked: bool = False,
    beside: bool = False,
) -> UpSummary | Plan:
    """`inv` is the whole inventory; the run touches the deployment's nodes only (`node`, or all).
    `locked`: the caller holds the locks of those nodes for longer than this run (an upgrade holds
    them across its new `up`, its canary and its rollback's `up`), so this run takes none of its own.
    `monitoring`: what monitoring does around the run (the CLI hands in monitor/planned.planned).
    `beside`: start beside the deployments on these nodes, each in a slot of its own (issue 60), when
    every node's memory holds all of them plus the floor (`_admit`); `replace` takes them down."""
    full, inv = inv, deployments.target(inv, prof, node)
    found = lint.lint(prof, inv)
    for w in found:
        if w.severity == "warn":
            progress.info(f"lint: {w.line()}")
    problems = lint.failures(found)
    if problems:
        raise InputError(
            f"profile '{prof.name}' fails lint ({len(problems)} problem(s))",
            lint_fix(prof, full, node, problems),
            details=[p.line() for p in problems],
        )
    if offline:  # the plan before any node answers (or exists): a dry run that connects to nothing
        return make_offline_plan(inv, prof, secret_names=secrets.keys())
    t0 = time.monotonic()
    progress.stage(gate.STAGE)
    # one connection per node for the whole run; a node this run does not touch may be away
    everyone, unreachable = connect_reachable(full)
    with everyone:
        found, _ = deployments.on(everyone, full)  # an unread node this run touches fails preflight
        others = deployments.conflicts(found, inv, prof.name)
        mine = tuple(n.name for n in inv.nodes)
        slot, away, beside = placement(found, others, mine, prof.name, replace, beside)
        if others and not replace and not beside:
            what = "; ".join(d.describe() for d in others)
            flag = deployments.node_flags(node)
            raise InputError(
                f"{what} runs on the node(s) this deployment needs; up --profile {prof.name}{flag} "
                "would replace it (they share the nodes' memory)",
                f"sparkcluster up --profile {prof.name}{flag} --replace (or --beside: start it beside "
                "them if the nodes' memory holds all of them; or sparkcluster down first)",
            )
        inv = inv.at_slot(slot)
        touched = full.only(sorted({n.name for n in inv.nodes} | {x for d in away for x in d.nodes}))
        all_reachable(touched, unreachable)
        # a dry run changes nothing, so it neither takes nor waits for the lock
        with (
            contextlib.nullcontext() if dry_run or locked else NodeLocks(everyone, touched, command),
            # monitoring, where it runs: the touched nodes silenced, the new deployment scraped after
            contextlib.nullcontext()
            if dry_run
            else monitoring(everyone.hosts, full, [n.name for n in touched.nodes], f"sparkcluster {command}"),
        ):
            cluster = ConnectedHosts(inv, {n.name: everyone.hosts[n.name] for n in inv.nodes})
            return _run_locked(
                cluster,
                inv,
                prof,
                secrets,
                progress,
                dry_run,
                replace,
                t0,
                away=[Away(d, d.inventory(full)) for d in away],
                reach=everyone.hosts,
                beside=[d for d in others if beside],
            )


def placement(
    found: list[deployments.Deployment],
    others: list[deployments.Deployment],
    mine: tuple[str, ...],
    profile: str,
    replace: bool,
    beside: bool,
) -> tuple[int, list[deployments.Deployment], bool]:
    """Pure: where a deployment of `profile` on `mine` goes (issue 60): (its slot, the deployments
    taken down first, whether it runs beside others). Beside the others when asked, or when it
    already runs beside them (admitted by memory once the facts are in); with `replace` in slot 0,
    alone, every other deployment sharing its nodes taken down whole (a pair, when one of its nodes
    is wanted alone; another slot's, itself included: their containers are not slot 0's to remove).
    Otherwise its own slot where it runs already (never moved, so never recreated), else the lowest
    free one: 0 where nothing runs, so a lone deployment keeps the names and ports of before."""
    beside = bool(others) and not replace and (beside or _runs_beside(found, mine, profile))
    if replace:
        away = [d for d in others if set(d.nodes) != set(mine) or d.slot != 0]
        away += [d for d in found if (d.profile, d.nodes) == (profile, mine) and d.slot != 0]
        return 0, away, False
    if others and not beside:
        return 0, [], False  # refused by the caller: it names them
    return deployments.slot_for(found, mine, profile), [], beside


def _runs_beside(found: list[deployments.Deployment], mine: tuple[str, ...], profile: str) -> bool:
    """This deployment runs already in a slot of its own beside others (an `up --beside` before)."""
    return (
        any((d.profile, d.nodes) == (profile, mine) for d in found)
        and len({d.slot for d in found if set(d.nodes) & set(mine)}) > 1
    )


def _admit(inv: Inventory, prof: profiles.Profile, facts: dict, beside: list) -> None:
    """Issue 60's admission, through the one memory arithmetic (node/memory_fit.admit): on every node
    of this deployment, the deployments already there and this one, each its gpu_memory_utilization
    of MemTotal, leave the supervisor's memory floor. A refusal names who holds how much."""
    floor = int(
        bounds.profile_policy(prof).get("memory_floor_gib", contract.Policy().memory_floor_gib) * memory_fit.GiB
    )
    want = memory_fit.Held(f"'{prof.name}'", prof.serve.gpu_memory_utilization)
    totals = {n: facts[n].mem.total if n in facts and facts[n].mem else None for n in facts}
    if prof.on_demand.enabled:
        # models taking turns: one on demand need not fit beside the others on demand, only beside
        # what always runs; which of them is awake is decided at each start (its supervisor admits it
        # against the memory as it is then, and the gateway asks an idle one to yield by the rule)
        beside = [d for d in beside if not d.on_demand]
    admit_beside(inv, prof.name, want, floor, totals, beside, "gpu_memory_utilization")


def admit_beside(
    inv: Inventory, name: str, want: memory_fit.Held, floor: int, totals: dict, beside: list, knob: str
) -> None:
    """On every node of `inv` where others run: `want` beside what they hold (deployments.held) and
    the floor, of that node's MemTotal (`totals`), else the refusal naming who holds how much. `knob`:
    the profile's key that lowers what it asks (a model's gpu_memory_utilization, a service's memory_gb)."""
    lines = []
    for n in inv.nodes:
        there = [d for d in beside if n.name in d.nodes]
        if not there:
            continue
        total = totals.get(n.name)
        if not total:
            lines.append(f"{n.name}: MemTotal was not read, so {want.deployment} cannot be counted beside the others")
        elif why := memory_fit.admit(total, [deployments.held(d) for d in there], want, floor):
            lines.append(f"{n.name}: {why}")
    if lines:
        names = ", ".join(sorted({d.profile for d in beside}))
        raise InputError(
            f"the memory of {len(lines)} node(s) does not hold '{name}' beside {names}",
            f"sparkcluster down --profile {sorted({d.profile for d in beside})[0]} (or lower "
            f"{knob} in profile '{name}'), then sparkcluster up --profile {name}"
            f"{deployments.node_flags([n.name for n in inv.nodes])} --beside",
            details=lines,
        )


def all_reachable(touched: Inventory, unreachable: dict) -> None:
    """Every node the run touches answered, or the error naming each that did not."""
    missing = {n.name: unreachable[n.name] for n in touched.nodes if n.name in unreachable}
    if not missing:
        return
    raise unreachable_error(missing)


def _base_digest(cluster: ConnectedHosts | None, image: str) -> str:
    """The base image's registry digest on the head (known_good.repo_digest), "" where it is not known."""
    if cluster is None:
        return ""
    try:
        got = cluster.head.docker().api.inspect_image(image)
    except Exception:  # noqa: BLE001 (built or loaded, gone since, or Docker not answering: no digest to record)
        return ""
    return known_good.repo_digest(image, list(got.get("RepoDigests") or []))


def _old_server(cluster: ConnectedHosts, inv: Inventory, facts) -> server.Record | None:
    """The server that runs in our head container now, if any. An engine that does not answer
    fails here (EngineUnreachable): it is never taken for "no server", which would restart one."""
    heads = [c for c in facts[inv.head.name].ours if c.labels.get(ROLE_LABEL) == "head" and c.running]
    return server.current(cluster.head.docker().api, heads[0].id) if heads else None


def _endpoint(cluster: ConnectedHosts, inv: Inventory, port: int) -> str:
    """The endpoint `up` prints: where the engine listens on the cluster's side (its head's control
    address, loopback on a one-node cluster: the gateway the only door, clients go through it); at
    the head's address when the owner lets engines listen on every address."""
    host = inv.engine_address() if inv.cluster.engines_listen == "control" else cluster.head.address
    return f"http://{host}:{port}/v1"


def _wedged(cluster: ConnectedHosts, inv: Inventory, prof: profiles.Profile, secrets: dict[str, str]) -> str:
    """Why the server that runs this profile does not serve, or "": `/health` alone says 200 while
    an engine is stuck, so "already serving" needs a one-token completion too."""
    port = prof.serve.port or inv.cluster.api_port
    with endpoint.reached(cluster.head, inv, port) as base:
        view = endpoint.look(base, secrets.get("VLLM_API_KEY"), prof.served_model_name, probe_timeout=WEDGE_PROBE_S)
    if view.health != 200:
        return f"/health answers {view.health or 'nothing'}"
    return "" if view.responds is not False else f"/health is 200 but {view.probe}"


def _run_locked(
    cluster: ConnectedHosts,
    inv: Inventory,
    prof: profiles.Profile,
    secrets: dict[str, str],
    progress: StageProgress,
    dry_run: bool,
    replace: bool,
    t0: float,
    away: list | None = None,
    reach: dict | None = None,
    beside: list | None = None,
) -> UpSummary | Plan:
    report = gate.check(cluster, inv, prof)
    if beside:
        _admit(inv, prof, report.facts, beside)
    old = _old_server(cluster, inv, report.facts)
    wanted = {k: v for k, v in secrets.items() if k in profiles.secret_env_names(prof)}
    # the same profile serves only when its server runs, started with the same secrets and watched
    # by the supervisor with the profile's bounds
    policy = bounds.profile_policy(prof)
    # ... and asked at the address it listens on now (the inventory's engines_listen, issue 36)
    asked = reached_at(engine_host(inv, prof))
    serving = bool(
        old
        and old.profile == prof.name
        and old.started_with(wanted)
        and old.policy == policy
        and (old.host or "127.0.0.1") == asked
    )
    wedged = _wedged(cluster, inv, prof, secrets) if serving else ""
    serving = serving and not wedged
    plan = make_plan(
        inv, prof, report.facts, serving, replace, old_server=old, secret_names=secrets.keys(), away=away or ()
    )
    if wedged:
        plan.notes.insert(0, f"the running vllm serve (pid {old.pid}) is wedged: {wedged}; it is restarted")
    progress.done(gate.STAGE, time.monotonic() - t0, f"{len(report.results)} checks")
    if dry_run:
        return plan
    record_before_plan(plan)
    for note in plan.notes:
        progress.info(note)
    if plan.unchanged:
        port = prof.serve.port or inv.cluster.api_port
        remember_good(inv, prof, report.facts, report.facts[inv.head.name].image_id or "", "", cluster, unchanged=True)
        return UpSummary(True, _endpoint(cluster, inv, port), prof.served_model_name, old.pid, {}, inv.slot)
    r = UpRun(cluster, plan, report.facts, secrets, progress, reach=dict(reach or cluster.hosts))
    try:
        execute(r)
    except BaseException as e:  # a failed stage, Ctrl-C, or a bug: undo this run's changes, then report
        progress.info("rolling back what this run created")
        try:
            rollback(r)
        except Exception as rb:  # report the original failure; the rollback's goes to the log
            _log.warning("rollback failed", error=str(rb))
        lost = {h.name: h.lost for h in cluster.hosts.values() if getattr(h, "lost", "")}
        if lost and not isinstance(e, KeyboardInterrupt):
            # the root cause: a host stopped answering; what failed on it after is only a symptom
            others = [f for f in getattr(e, "failures", []) if f.host not in lost]
            fix = (
                f"rolled back on the hosts that answer; {', '.join(lost)} could not be rolled back: check its "
                "network, then sparkcluster down (removes what is left there) and sparkcluster up"
            )
            raise StageError(
                r.stage, [StepFailure(n, r.stage, why, fix=fix) for n, why in lost.items()] + others, fix
            ) from e
        raise
    if r.find(server.Standby) is None:  # on standby (on demand) nothing has served yet: no good serve to record
        remember_good(
            inv,
            prof,
            report.facts,
            serve.served_image_id(r),
            serve.served_revision(r),
            cluster,
            r.find(canary_watch.Kept),
        )
    return UpSummary(
        False,
        _endpoint(cluster, inv, plan.serve.port),
        plan.serve.model,
        rec.pid if (rec := r.find(server.Record)) else None,  # None: on standby (on demand)
        r.seconds,
        inv.slot,
    )


def _nccl_loaded(cluster: ConnectedHosts, inv: Inventory) -> dict[str, str]:
    """Per node, the NCCL version the serving ranks loaded, from their NCCL files ({} on a CPU engine)."""
    texts = cluster.each(
        lambda h: engine_nccl.read_node(h, inv.cluster.name),
        [cluster.hosts[n.name] for n in inv.nodes if n.name in cluster.hosts],
    )
    return engine_nccl.versions({n: o.value for n, o in texts.items() if o.ok})


def remember_good(
    inv: Inventory,
    prof: profiles.Profile,
    facts: dict,
    image_id: str,
    revision: str,
    cluster: ConnectedHosts | None = None,
    kept: canary_watch.Kept | None = None,
    unchanged: bool = False,
) -> None:
    """The known-good record (issue 39): `up` ends serving and its probe answered. Never fails `up`.
    Its canary (issue 38) is what the serve stage's canary step kept, else (nothing restarted) the
    deployment's last one, carried while the model is the same. `unchanged`: the deployment served
    already and nothing was restarted; the NCCL its ranks loaded is the last record's when that
    record is of the same profile and image on every node (the same library in the same image),
    not read again from their files (a second round trip with a `docker exec` per container:
    0.44 s of an `up` on a serving cluster on the testbed, issue 40 item 6)."""
    try:
        key = serve.deployment_key(inv, prof)
        before = known_good.last_for(known_good.load(inv.cluster.name), key)
        if not revision and before is not None and before.profile_hash == profiles.profile_hash(prof):
            revision = before.model_revision  # "already serving": the weights stage did not run
        carried = (
            {n: r.nccl for n, r in before.nodes.items()}
            if unchanged
            and before is not None
            and before.profile_hash == profiles.profile_hash(prof)
            and all(n.name in before.nodes and before.nodes[n.name].image_id == image_id for n in inv.nodes)
            else None
        )
        nccl = carried if carried is not None else _nccl_loaded(cluster, inv) if cluster is not None else {}
        nodes = {}
        for n in inv.nodes:
            if n.name in facts:
                rec = known_good.node_now(facts[n.name])
                nodes[n.name] = known_good.NodeRecord(
                    rec.kernel, rec.driver, rec.cx7_firmware, rec.nccl or nccl.get(n.name, ""), image_id or rec.image_id
                )
        rec = known_good.GoodRecord(
            deployment=key,
            at=known_good.now_utc(),
            profile=prof.name,
            profile_hash=profiles.profile_hash(prof),
            image=image_ref(inv, prof),
            vllm_version=prof.image.vllm_version or "",
            model=prof.model,
            model_revision=revision or prof.revision or "main",
            nodes=nodes,
            base_image=prof.image.ref,
            base_digest=_base_digest(cluster, prof.image.ref),
        )
        same = before is not None and (before.profile, before.base_image, before.model_revision) == (
            rec.profile,
            rec.base_image,
            rec.model_revision,
        )
        if same:  # the same model, revision and image serve again: its one-stream speed still holds
            rec = dataclasses.replace(rec, canary_tok_s=before.canary_tok_s)
        if kept is not None:
            rec = dataclasses.replace(
                rec, canary=kept.canary, canary_deterministic=kept.deterministic, canary_taken=kept.taken
            )
        elif before is not None and before.model == rec.model:  # the reference answers stay until taken anew
            rec = dataclasses.replace(
                rec,
                canary=before.canary,
                canary_deterministic=before.canary_deterministic,
                canary_taken=before.canary_taken,
            )
        known_good.append(inv.cluster.name, rec)
        if cluster is not None:  # the history, copied to the head for the gateway's console
            name = inv.cluster.name
            doc = head_records.history_doc(known_good.load(name), known_good.load_outcomes(name))
            head_records.publish(cluster.head, name, "upgrades", doc, lambda line: _log.warning(line))
    except Exception as e:  # the record is for later diagnosis; serving matters more
        _log.warning("could not record the known-good serve", error=str(e))


def rollback(r: UpRun) -> None:
    """Stop what this run started and remove what it created; leave everything else alone."""
    if r.find(server.Record) is not None:
        try:
            teardown.stop_server(r.cluster.head, r.plan.serve.container)
        except Exception as e:  # keep rolling back
            _log.warning("rollback: stopping vllm serve failed", error=str(e))
    created = r.find(Created)
    if created is not None:
        if not created.settle():
            _log.warning("rollback: a container create did not answer; `sparkcluster down` removes what it left")
        for node, o in teardown.down(r.cluster, only_ids=created.containers).items():
            if not o.ok:
                _log.warning("rollback: could not clean a node", node=node, errors=o.errors)
