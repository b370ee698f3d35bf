"""`weights pull` and `weights rm` as steps: `up`'s weights stage alone, made by its own `Plan` and
walked by its own run (`UpRun`), and the removal of cached snapshots, a step per node and commit.

`pull` connects, learns the homes (the HF cache's `~`), picks the image the download runs in (the
cluster image once `up` built it, else the profile's base image: vLLM ships huggingface_hub), and
makes a plan that holds only the weights stage's steps; `--dry-run` prints them, the walk runs the
same ones under the cluster lock. The facts the chain of workers needs (the data plane) are gathered
only if a chain runs. `rm` reads what each node caches, then makes one step per snapshot to remove.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from sparkcluster import facts as facts_mod
from sparkcluster.config import profile as profiles
from sparkcluster.config.images import image_ref
from sparkcluster.config.inventory import Inventory
from sparkcluster.errors import InputError
from sparkcluster.facts.access import learn_homes
from sparkcluster.movement import hfcache
from sparkcluster.remote.fanout import ConnectedHosts
from sparkcluster.remote.lock import ClusterLock
from sparkcluster.steps import walk
from sparkcluster.steps.base import Step
from sparkcluster.steps.walk import CommandRun, StageProgress
from sparkcluster.up.execute import UpRun
from sparkcluster.up.plan import Plan
from sparkcluster.up.stages import weights as weights_stage
from sparkcluster.up.stages.image import image_id

STAGE = weights_stage.STAGE


class _FactsOnDemand(Mapping):
    """The nodes' facts, gathered from every node the first time any is asked for (only a chain of
    two or more workers reads them: its hops go over the data plane where two nodes share a subnet)."""

    def __init__(self, cluster: ConnectedHosts, inv: Inventory) -> None:
        self._cluster, self._inv, self._got = cluster, inv, None

    def _all(self) -> dict:
        if self._got is None:
            self._got = self._cluster.each(lambda h: facts_mod.gather(h, self._inv, None, ray=False)).values_or_raise(
                "facts"
            )
        return self._got

    def __getitem__(self, node: str):
        return self._all()[node]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


def _image_step(inv: Inventory, prof: profiles.Profile, head: str) -> Step:
    """The image the download runs in, found on the head only when the head lacks files: the
    cluster image once `up` built it, else the profile's base image (vLLM ships huggingface_hub), so
    weights can be staged first; neither is said before any byte moves."""
    cluster_image = image_ref(inv, prof)

    def run(r: UpRun) -> str:
        for image in (cluster_image, prof.image.ref):
            if image_id(r.cluster.head, image) is not None:
                for st in weights_stage.stagings(r):
                    st.image = image
                return image
        raise InputError(
            f"the head has neither the cluster image {cluster_image} nor its base "
            f"{prof.image.ref}, one of which does the download",
            f"docker pull {prof.image.ref} on {head}, or sparkcluster up --profile "
            f"{prof.name} (it builds the image and stages the weights)",
        )

    return Step(
        STAGE,
        head,
        "download-image",
        "find the image the download runs in on the head: the cluster image, else its base",
        f"docker image inspect {cluster_image}, else {prof.image.ref}",
        when="the head lacks files",
        skip=lambda r: (
            None
            if any(st.state[head]["missing"] for st in weights_stage.stagings(r))
            else "the head holds every snapshot"
        ),
        run=run,
    )


def pull_plan(inv: Inventory, prof: profiles.Profile, secret_names, rehash: bool) -> Plan:
    """Pure: a plan of the weights stage's staging alone (no container, no serve)."""
    image = image_ref(inv, prof)
    plan = Plan(inv, prof, image, "", None, [], {}, [], None, secret_names=frozenset(secret_names), rehash=rehash)
    # the staging alone: the model's shape against TP x PP and the plugin's link are `up`'s business
    steps = [s for s in weights_stage.stage_steps(plan) if s.action not in ("shape", "plugin")]
    at = next(i for i, s in enumerate(steps) if s.action == "disk") + 1
    steps.insert(at, _image_step(inv, prof, inv.head.name))
    plan._steps = steps
    return plan


@dataclass
class Pulled:
    """What `weights pull` did, per repository: its commit, size, whether it was staged now or
    already complete, and what the download and each worker's replication said."""

    repos: list[dict] = field(default_factory=list)
    notes: list[list[str]] = field(default_factory=list)


def pull(
    inv: Inventory,
    prof: profiles.Profile,
    secrets: dict[str, str],
    progress: StageProgress,
    *,
    rehash: bool = False,
    dry_run: bool = False,
) -> tuple[Plan, Pulled | None]:
    """Connect, make the plan; unless `dry_run`, walk it under the cluster lock."""
    want = weights_stage.wanted(prof)
    if not want:
        raise InputError(
            f"profile '{prof.name}' serves {prof.model}, a path inside the container, not a hub model",
            "nothing to pull: place that path on every node yourself",
        )
    with ConnectedHosts.connect(inv) as cluster:
        learn_homes(cluster)  # the HF cache's `~`, and whom the download's files belong to
        plan = pull_plan(inv, prof, secrets, rehash)
        if dry_run:
            return plan, None
        r = UpRun(cluster, plan, _FactsOnDemand(cluster, inv), secrets, progress, stage=STAGE)
        with ClusterLock(cluster.head, inv.cluster.name, f"weights pull --profile {prof.name}"):
            done = walk.walk(r, plan.steps())
    return plan, _pulled(want, weights_stage.stagings(r), done)


def _pulled(want, sts, done) -> Pulled:
    out = Pulled()
    for k, (need, st) in enumerate(zip(want, sts)):
        moved = {weights_stage._act(a, k, need) for a in ("download", "replicate")}
        notes = [v for s, v in done if s.action in moved and isinstance(v, str) and v]
        m = st.manifest
        state = "staged" if notes else "complete"
        out.repos.append({"repo": m.repo, "commit": m.commit, "role": st.role, "bytes": m.size, "state": state})
        out.notes.append(notes)
    return out


def cached(cluster: ConnectedHosts, inv: Inventory) -> dict[str, list[dict]]:
    """Per node, the snapshots in its HF cache (the homes learnt first: the cache's `~`)."""
    learn_homes(cluster)
    got = cluster.each(
        lambda h: hfcache.parse_json(h.run(hfcache.status_command(inv.hf_cache(h.name)), timeout=120).stdout)
    )
    return got.values_or_raise("weights")


@dataclass
class Removal:
    """`weights rm`: the snapshots found per node and a step for each; walked under the lock."""

    cluster: ConnectedHosts
    inventory: Inventory
    repo: str
    targets: dict[str, list[str]]
    steps: list[Step]

    def walk(self) -> list[dict]:
        """Every step walked: each snapshot removed and the space freed."""
        with ClusterLock(self.cluster.head, self.inventory.cluster.name, f"weights rm {self.repo}"):
            done = walk.walk(CommandRun(stage=STAGE), self.steps)
        return [v for _, v in done]

    def __enter__(self) -> Removal:
        return self

    def __exit__(self, *exc) -> None:
        self.cluster.close()


def removal(inv: Inventory, repo: str, commit: str | None) -> Removal:
    """Connect, read what every node caches, and make a step per snapshot of `repo` (or `commit`)."""
    hfcache.check_repo(repo)
    cluster = ConnectedHosts.connect(inv)
    try:
        per_node = cached(cluster, inv)
    except BaseException:
        cluster.close()
        raise
    targets = {
        n: sorted({s["commit"] for s in snaps if s["repo"] == repo and (commit is None or s["commit"] == commit)})
        for n, snaps in per_node.items()
    }
    steps = [_rm_step(cluster, inv, repo, n, c) for n, cs in targets.items() for c in cs]
    return Removal(cluster, inv, repo, targets, steps)


def _rm_step(cluster: ConnectedHosts, inv: Inventory, repo: str, node: str, commit: str) -> Step:
    command = hfcache.rm_command(inv.hf_cache(node), repo, commit)

    def run(r) -> dict:
        got = hfcache.parse_json(cluster.hosts[node].run(command, timeout=600).stdout)
        return {"node": node, "repo": repo, "commit": commit, "freed_bytes": got["freed"]}

    return Step(STAGE, node, f"rm-{commit[:12]}", f"remove {repo}@{commit[:12]} from the HF cache", run=run)
