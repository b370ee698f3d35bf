"""The weights stage: for every repository the profile needs (`config.repos`: the model, a separate
tokenizer, a draft model, a plugin file), resolve it to a commit on the hub, check every node's HF
cache against it, and when some node lacks files: check free disk everywhere (for all of them at
once), download once on the head (a throwaway container of the cluster image, resumable), then send
each worker only the files it lacks over the control link (the image transfer's one-shot receiver:
no bytes through the controller, no new trust) and verify them there. With every snapshot complete
everywhere it moves no bytes: one request to the hub per repository and one stat per file per node.

`Staging` holds the mechanics so `sparkcluster weights pull` runs them without a plan.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sparkcluster.config import lint, repos
from sparkcluster.config import profile as profiles
from sparkcluster.deployment import server
from sparkcluster.errors import InputError
from sparkcluster.movement import chain, hfcache, transfer
from sparkcluster.remote.fanout import run_each
from sparkcluster.steps.base import Step, fail
from sparkcluster.up.stages import weights_chain

if TYPE_CHECKING:
    from sparkcluster.steps.walk import StageProgress
    from sparkcluster.up.execute import UpRun
    from sparkcluster.up.plan import Plan

STAGE = "weights"
_BYTES = re.compile(r"@@bytes (\d+)")
DISK_MARGIN = 1.02  # the cache's own files (locks, refs, stamps) and filesystem slack


def endpoint(inv) -> str:
    return inv.cluster.hf_endpoint or hfcache.PUBLIC_HUB


def wanted(prof) -> list[repos.Need]:
    """The repositories the profile needs from the hub, each checked; empty when none (a model that
    is a path inside the container, and nothing else from the hub)."""
    for need in repos.needed(prof):
        hfcache.check_repo(need.repo)
        hfcache.check_revision(need.revision)
    return repos.needed(prof)


@dataclass
class Staging:
    cluster: object
    inv: object
    image: str
    repo: str
    revision: str
    secrets: dict[str, str]
    progress: StageProgress
    need: repos.Need | None = None  # which files of the snapshot are staged; None: all of them
    manifest: hfcache.Manifest | None = None
    state: dict[str, dict] = field(default_factory=dict)  # node -> the node program's last `check`
    moved: dict[str, int] = field(default_factory=dict)  # "hub -> head" / worker -> bytes

    @property
    def cache(self) -> str:
        """The head's HF cache (each node's may differ: `~` is each SSH user's home)."""
        return self.inv.hf_cache(self.inv.head.name)

    def lacking(self) -> list[str]:
        return [n for n, s in self.state.items() if s["missing"]]

    @property
    def cap_bytes_s(self) -> float | None:
        """The inventory's cap on a replication between nodes, in bytes a second (None: none)."""
        cap = self.inv.cluster.replication_max_mb_s
        return cap * 1e6 if cap else None

    def resolve(self) -> hfcache.Manifest:
        head = self.cluster.head
        res = head.run(
            hfcache.resolve_command(endpoint(self.inv), self.repo, self.revision),
            timeout=60,
            stdin=self.secrets.get("HF_TOKEN", "").encode(),
        )
        try:
            self.manifest = self._only(hfcache.parse_resolve(res.stdout, self.repo, self.revision, endpoint(self.inv)))
        except hfcache.HubUnavailable as e:
            # weights already staged need no hub: go on with the listing the head kept when it
            # verified them (the check on every node still decides whether anything is missing)
            got = head.run(hfcache.cached_command(self.cache, self.repo, self.revision), timeout=60, warn=True)
            kept = hfcache.parse_cached(got.stdout, self.repo, self.revision) if got.ok else None
            if kept is None:
                raise e from None
            self.progress.info(f"{e.message}; using the snapshot {kept.commit[:12]} the head verified before")
            self.manifest = kept
        return self.manifest

    @property
    def role(self) -> str:
        return self.need.role if self.need else "model"

    @property
    def only(self) -> tuple[str, ...] | None:
        """The files to download when not the whole snapshot (after `resolve`)."""
        if self.need is None or (self.need.files is None and self.need.weights):
            return None
        return tuple(f.path for f in self.manifest.files)

    def _only(self, m: hfcache.Manifest) -> hfcache.Manifest:
        if self.need is None:
            return m
        lost = [p for p in self.need.files or () if p not in {f.path for f in m.files}]
        if lost:
            raise InputError(
                f"{', '.join(lost)} is not in {self.repo}@{self.revision} ({self.role})",
                f"check the URL in the profile against {endpoint(self.inv).rstrip('/')}/{self.repo}",
            )
        return dataclasses.replace(m, files=tuple(f for f in m.files if self.need.keeps(f.path)))

    def check(self, node: str, hash_unverified: bool = True, rehash: bool = False) -> dict:
        res = self.cluster.hosts[node].run(
            hfcache.check_command(self.inv.hf_cache(node)),
            timeout=3600,
            stdin=self.manifest.request(hash_unverified, rehash).encode(),
        )
        self.state[node] = got = hfcache.parse_json(res.stdout)
        return got

    def check_all(self, rehash: bool = False) -> None:
        run_each([(n.name, n.name) for n in self.inv.nodes], lambda n: self.check(n, rehash=rehash)).values_or_raise(
            STAGE
        )

    def disk(self) -> None:
        disk([self])

    def need_bytes(self, node: str) -> int:
        s = self.state[node]
        return s["missing_bytes"] - s["partial_bytes"] if s["missing"] else 0

    def write_token(self) -> None:
        if "HF_TOKEN" in self.secrets:
            self.cluster.head.run(
                server.token_file_command(self.cache), timeout=30, stdin=self.secrets["HF_TOKEN"].encode()
            )

    def download(self) -> str:
        head, m = self.cluster.head, self.manifest
        before = self.state[head.name]["present_bytes"]
        cmd = hfcache.download_command(
            self.image, self.cache, self.inv.cluster.hf_endpoint, m, self.only, user=self.inv.owner(head.name)
        )
        proc = head.start(transfer.bash(cmd), timeout=24 * 3600)
        t0 = time.monotonic()
        try:
            for line in proc.stderr_lines():
                # the reporter thread's lines can run into the download's own stderr (a traceback)
                got = _BYTES.match(line)
                if got:
                    self.progress.bytes(f"hub -> {head.name}", min(int(got[1]), m.size), m.size)
            res = proc.wait()
        except BaseException:
            # what arrived stays as .incomplete files for the next run to resume
            head.run(hfcache.stop_download_command(), timeout=60, warn=True)
            raise
        if not res.ok:
            raise fail(
                STAGE,
                head.name,
                "download the weights",
                f"the download of {self.repo}@{m.commit[:12]} failed "
                f"(exit {res.exit_code}); what arrived is kept and the next run resumes it",
                hfcache.describe_download(self.image, m, endpoint(self.inv), self.cache),
                res.tail(),
                f"check the head's link to {endpoint(self.inv)}, then sparkcluster up",
            )
        after = self.check(head.name)
        if after["missing"]:
            raise fail(
                STAGE,
                head.name,
                "verify the weights",
                f"{len(after['missing'])} file(s) of {self.repo} did not match their hash after the download "
                "(removed; the next run fetches them again)",
                fix="sparkcluster up",
            )
        self.moved[f"hub -> {head.name}"] = after["present_bytes"] - before
        return f"downloaded {(after['present_bytes'] - before) / 1e9:.2f} GB in {time.monotonic() - t0:.1f}s"

    def replicate(self, worker_name: str) -> str:
        """The files `worker_name` lacks, from the head over the control link, verified there."""
        got = weights_chain.stream_files(
            self, self.cluster.hosts, self.inv, [chain.control(self.inv, self.inv.head.name, worker_name)]
        )
        return f"sent to {worker_name}: {got.rate}, verified"

    def replicate_all(self, facts: dict | None = None) -> list[str]:
        """`weights pull`: every worker lacking files gets them as `up` sends them: one stream along
        the chain when two or more lack some (each hop on a data-plane subnet its nodes share, from
        `facts`, else over their control IPs), else the one alone. A note per worker."""
        lacking = [n.name for n in self.inv.workers if self.state[n.name]["missing"]]
        if len(lacking) < 2:
            return [self.replicate(n) for n in lacking]
        hops = chain.plan(self.inv, facts or {}, lacking)
        got = weights_chain.stream_files(self, self.cluster.hosts, self.inv, hops)
        return [
            f"{h.dst}: received from {h.src} along the chain ({h.src_ip} -> {h.dst_ip}): {got.rate}, verified"
            for h in hops
        ]


def disk(stagings: list[Staging]) -> None:
    """Every node that lacks files of any repository has room for all of them (one HF cache)."""
    for n in {n for st in stagings for n in st.lacking()}:
        lacking = [st for st in stagings if n in st.lacking()]
        s, need = lacking[0].state[n], sum(st.need_bytes(n) for st in lacking) * DISK_MARGIN
        if s["free"] < need:
            what = ", ".join(st.repo for st in lacking)
            raise fail(
                STAGE,
                n,
                "check free disk",
                f"not enough disk for {what}: {hfcache.gib(s['free'])} free in {s['free_path']}, "
                f"the missing files need {hfcache.gib(need)}",
                fix=f"free {hfcache.gib(need - s['free'])} in {s['free_path']} on {n} (`sparkcluster weights status` "
                "lists the cached models; `sparkcluster weights rm` removes one), then sparkcluster up",
            )


def steps(plan: Plan) -> list[Step]:
    """`up`'s weights stage: the weights' steps when the plan serves, none otherwise."""
    return [] if plan.serve is None else stage_steps(plan)


def stage_steps(plan: Plan) -> list[Step]:
    """Every repository the profile needs, resolved, checked on every node, and staged where some
    node lacks files: `up`'s weights stage, and `weights pull` alone (up/weights_only)."""
    want = wanted(plan.profile)
    if not want:
        return []
    inv, head = plan.inventory, plan.inventory.head.name
    ep = endpoint(inv)
    token = " (HF token on stdin)" if "HF_TOKEN" in plan.secret_names else ""
    out = []
    for k, need in enumerate(want):
        out.append(
            Step(
                STAGE,
                head,
                _act("resolve", k, need),
                f"resolve the {need.describe()} to a commit on the hub",
                f"GET {ep}/api/models/{need.repo}/revision/{need.revision} from {head}{token}",
                run=lambda r, k=k: _resolve(r, k),
            )
        )
    for k, need in enumerate(want):
        for n in inv.nodes:
            out.append(
                Step(
                    STAGE,
                    n.name,
                    _act("check", k, need),
                    f"check the HF cache against {need.repo} ({need.role})",
                    f"in {hfcache.hub_dir(inv.hf_cache(n.name))}: every file's size, the hash of any file not "
                    "verified before; links the snapshot when complete",
                    run=lambda r, n=n.name, k=k: stagings(r)[k].check(n, rehash=r.plan.rehash),
                    parallel=f"weights-check-{k}",
                )
            )
    lacks = "a node lacks files of a snapshot"
    out.append(
        Step(
            STAGE,
            head,
            "disk",
            "check free disk on every node that lacks files",
            "the HF cache's filesystem has room for the missing files of every repository",
            when=lacks,
            skip=lambda r: None if any(st.lacking() for st in stagings(r)) else "every node holds every snapshot",
            run=lambda r: disk(stagings(r)),
        )
    )
    if "HF_TOKEN" in plan.secret_names:
        out.append(
            Step(
                STAGE,
                head,
                "hf-token",
                "write the HF token file for the download",
                f"{server.token_file_command(inv.hf_cache(head))}  (HF_TOKEN=****** on stdin over SSH)",
                when="the head lacks files",
                skip=lambda r: (
                    None
                    if any(not _head_complete(r, k) for k in range(len(stagings(r))))
                    else "the head holds every snapshot"
                ),
                run=lambda r: stagings(r)[0].write_token(),
            )
        )
    for k, need in enumerate(want):
        out.append(
            Step(
                STAGE,
                head,
                _act("download", k, need),
                f"download {need.repo} ({need.role}) once, into the head's HF cache",
                hfcache.describe_download(plan.image, None, ep, inv.hf_cache(head), need.repo, inv.owner(head)),
                when="the head lacks files",
                skip=lambda r, k=k: _head_complete(r, k),
                run=lambda r, k=k: stagings(r)[k].download(),
            )
        )
        out += [_replicate_step(inv, head, k, need, wk) for wk in inv.workers]
    if "model" in want[0].roles:
        tp, pp = plan.profile.serve.tensor_parallel_size, plan.profile.serve.pipeline_parallel_size
        out.append(
            Step(
                STAGE,
                head,
                "shape",
                f"check the model's heads and layers against TP={tp} x PP={pp}",
                f"cat config.json of the verified snapshot of {want[0].repo}",
                run=_shape,
            )
        )
    plugin = plugin_link(plan.profile, inv.hf_cache(head))
    if plugin:
        k, path, _ = plugin
        for n in inv.nodes:
            out.append(
                Step(
                    STAGE,
                    n.name,
                    "plugin",
                    "link the reasoning-parser plugin where the serve command reads it",
                    f"ln -sfn <its file in the verified snapshot of {want[k].repo}> {path}",
                    run=lambda r, n=n.name: _link_plugin(r, n),
                    parallel="weights-plugin",
                )
            )
    return out


def _replicate_step(inv, head: str, k: int, need, wk) -> Step:
    """A worker's replication of repository `k` from the head (weights_chain: along the chain when
    two or more workers lack files)."""
    return Step(
        STAGE,
        wk.name,
        _act("replicate", k, need),
        f"receive the files of {need.repo} it lacks from the head, verify them",
        f"{head}: the missing blobs, four files at a time | tcp {inv.head.control_ip} -> {wk.control_ip} | "
        f"{wk.name}: each file written and hashed as it arrives, adopted once it matches "
        "(one connection, head's address only)"
        + (
            f", at most {inv.cluster.replication_max_mb_s:g} MB/s (replication_max_mb_s)"
            if inv.cluster.replication_max_mb_s
            else ""
        )
        + (
            "; with two or more workers lacking files, one stream along the chain head -> "
            "worker -> ..., each relaying to the next as it receives"
            if len(inv.workers) > 1
            else ""
        ),
        when="this node lacks files",
        skip=lambda r, n=wk.name, k=k: (
            None if stagings(r)[k].state[n]["missing"] or weights_chain.reached(r, k, n) else "it holds the snapshot"
        ),
        run=lambda r, n=wk.name, k=k: weights_chain.replicate(r, stagings(r)[k], k, n),
    )


def _act(action: str, k: int, need: repos.Need) -> str:
    """Step actions stay unique: the model's as before, the others' named by their role."""
    return action if k == 0 else f"{action}-{need.roles[0].replace(' ', '-')}"


def plugin_link(prof, hf_cache: str) -> tuple[int, str, str] | None:
    """(index of its repository in `wanted`, the path the serve command passes, the file in the repo)
    of a reasoning-parser plugin staged from the hub, else None."""
    got, at = repos.plugin_file(prof.serve.reasoning_parser_plugin_url), profiles.reasoning_plugin(prof, hf_cache)
    if not got or not at:
        return None
    k = next(i for i, need in enumerate(wanted(prof)) if (need.repo, need.revision) == got[:2])
    return k, at[1], got[2]


def _link_plugin(r: UpRun, node: str) -> str:
    k, path, file = plugin_link(r.plan.profile, r.inv.hf_cache(r.inv.head.name))
    st = stagings(r)[k]
    target = hfcache.snapshot_file(r.inv.hf_cache(node), st.repo, st.manifest.commit, file)
    r.cluster.hosts[node].run(hfcache.link_command(target, path), timeout=30)
    return path


def _shape(r: UpRun) -> str:
    """The model's config.json against TP x PP (config/lint.model_shape), before any container."""
    st, prof, head = stagings(r)[0], r.plan.profile, r.inv.head.name
    path = hfcache.snapshot_file(r.inv.hf_cache(head), st.repo, st.manifest.commit, "config.json")
    res = r.cluster.hosts[head].run(["cat", path], timeout=30, warn=True)
    try:
        config = json.loads(res.stdout) if res.ok else None
    except ValueError:
        config = None
    if not isinstance(config, dict):
        return "no readable config.json in the snapshot: not checked"
    tp, pp = prof.serve.tensor_parallel_size, prof.serve.pipeline_parallel_size
    bad = lint.model_shape(config, tp, pp, prof.forwarded_env())
    if bad:
        raise fail(STAGE, head, "shape", f"{st.repo}: {bad[0].message}", f"cat {path}", fix=bad[0].fix)
    return f"TP={tp} x PP={pp} fits the model"


OFFLINE_SIGNS = ("OfflineModeIsEnabled", "outgoing traffic has been disabled", "LocalEntryNotFoundError")


def offline_miss(tail: str, model: str) -> str | None:
    """The reason to give when a rank wanted something from the hub the weights stage did not stage
    (the containers run with HF_HUB_OFFLINE=1), else None."""
    if any(s in tail for s in OFFLINE_SIGNS):
        return (
            f"a rank looked for a file of {model} that is not in its HF cache and may not reach the hub "
            "(HF_HUB_OFFLINE=1): the staged snapshot lacks what the engine asked for"
        )
    return None


@dataclass
class Stagings:
    """The weights stage's state: one Staging per repository the profile needs, in its order."""

    items: list[Staging]


def stagings(r: UpRun) -> list[Staging]:
    """One Staging per repository the profile needs, made at the stage's first step."""
    found = r.find(Stagings)
    if found is None:
        found = r.put(
            Stagings(
                [
                    Staging(r.cluster, r.inv, r.plan.image, need.repo, need.revision, r.secrets, r.progress, need)
                    for need in wanted(r.plan.profile)
                ]
            )
        )
    return found.items


def _resolve(r: UpRun, k: int) -> str:
    st = stagings(r)[k]
    return f"{st.repo}@{st.resolve().commit[:12]}"


def _head_complete(r: UpRun, k: int) -> str | None:
    return None if stagings(r)[k].state[r.inv.head.name]["missing"] else "the head holds the snapshot"


def summary(done: list[tuple[Step, object]]) -> str:
    resolved = [v for s, v in done if s.action.startswith("resolve") and v]
    notes = [v for s, v in done if s.action.startswith(("download", "replicate")) and v]
    return ", ".join(notes) or f"{', '.join(resolved)} in place on every node"
