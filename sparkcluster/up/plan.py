"""The plan: what `up` will do, as the ordered steps of every stage, made from the facts alone.

`make_plan` is pure over the inventory, the profile and the facts (no host is touched): it decides
the policy (build or not, which workers get the image, which containers to replace, whether to
serve), then asks each stage for its steps. `render` and `as_json` print those steps; the executor
runs those same steps.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from sparkcluster import redact
from sparkcluster.checks.runtime import env_verdict
from sparkcluster.config import profile as profiles
from sparkcluster.config.flags import engine_host, rank_args, reached_at, supervised_argv
from sparkcluster.config.images import RAY_VERSION, image_ref, served_as_pulled
from sparkcluster.config.inventory import Inventory
from sparkcluster.container.spec import ContainerSpec, node_rank, spec_for
from sparkcluster.deployment import server
from sparkcluster.errors import InputError
from sparkcluster.facts import HostFacts
from sparkcluster.facts.parsers import ContainerInspect
from sparkcluster.labels import CONFIG_LABEL, PROFILE_LABEL
from sparkcluster.steps.base import Stage, Step, render_steps
from sparkcluster.up.stages import STAGES


@dataclass
class Plan:
    inventory: Inventory
    profile: profiles.Profile
    image: str
    head_container: str
    build: dict[str, str] | None  # build args when the head lacks the image
    send_to: list[str]  # workers that get the head's image
    remove: dict[str, list[str]]  # node -> our containers to remove before creating
    containers: list[ContainerSpec]  # to create, head first; empty when the current ones fit
    serve: server.ServeSpec | None  # None when the same profile already serves
    facts: dict[str, HostFacts] = field(default_factory=dict, repr=False)
    old_server: server.Record | None = None  # the server running in the head container before this run
    secret_names: frozenset[str] = frozenset()  # which secrets this run has (never their values)
    unchanged: bool = False
    notes: list[str] = field(default_factory=list)
    away: list = field(default_factory=list)  # other deployments taken down first (replace.Away)
    _steps: list[Step] = field(default_factory=list, repr=False)

    def steps(self) -> list[Step]:
        return list(self._steps)

    def render(self) -> str:
        lines = [
            f"plan for profile '{self.profile.name}' on cluster '{self.inventory.cluster.name}' (image {self.image}):"
        ]
        lines += [f"  note: {n}" for n in self.notes]
        if self.unchanged:
            lines.append("  nothing to do: the cluster already serves this profile")
        lines += render_steps(self._steps)
        return redact.mask("\n".join(lines))

    def as_json(self) -> str:
        """The steps as a JSON list (id, stage, host, description), secrets masked."""
        return redact.mask(json.dumps([s.public() for s in self._steps], indent=2))


def _build_args(inv: Inventory, prof: profiles.Profile) -> dict[str, str]:
    build = {"BASE_IMAGE": prof.image.ref, "RAY_VERSION": RAY_VERSION}
    if inv.cluster.pip_index_url:
        build["PIP_INDEX_URL"] = inv.cluster.pip_index_url
        if inv.cluster.pip_index_url.startswith("http://"):
            # pip ignores a plain-http index unless its host is trusted by name
            build["PIP_TRUSTED_HOST"] = urlsplit(inv.cluster.pip_index_url).hostname
    return build


def _names(current: dict[str, list[ContainerInspect]]) -> str:
    return ", ".join(c.name for cs in current.values() for c in cs)


def make_plan(
    inv: Inventory,
    prof: profiles.Profile,
    facts: dict[str, HostFacts],
    serving: bool,
    replace: bool,
    *,
    old_server: server.Record | None = None,
    secret_names: Iterable[str] = (),
    away: Iterable = (),
) -> Plan:
    image = image_ref(inv, prof)
    head = inv.head.name
    head_id = facts[head].image_id
    pulled = served_as_pulled(len(inv.nodes), prof)
    if head_id is None and pulled:  # served as it is: nothing to build (issue 28)
        raise InputError(
            f"{head} has no {image}: {pulled} serves the profile's base image as it is",
            f"on {head}: docker pull {image} (nvcr.io needs `docker login nvcr.io` first), then "
            "sparkcluster up: the workers get it from the head",
        )
    build = _build_args(inv, prof) if head_id is None else None
    send_to = [w.name for w in inv.workers if head_id is None or facts[w.name].image_id != head_id]

    # the compile cache's key needs the image's ID: the head's (each worker gets the head's image);
    # pending where the head lacks it, until the image stage has built it (config/compile_cache)
    specs = {n.name: spec_for(inv, prof, n, image, head_id) for n in inv.nodes}
    current = {n.name: list(facts[n.name].ours) for n in inv.nodes}
    other_profiles = sorted({c.labels.get(PROFILE_LABEL, "?") for cs in current.values() for c in cs} - {prof.name})
    notes = []
    if other_profiles:
        what = f"profile '{', '.join(other_profiles)}' (containers: " + _names(current) + ")"
        if not replace:
            raise InputError(
                f"the cluster runs {what}; up --profile {prof.name} would replace it",
                f"sparkcluster up --profile {prof.name} --replace (or sparkcluster down first)",
            )
        notes.append(f"replacing {what}")

    def fits(node: str) -> bool:
        cs = current[node]
        if len(cs) != 1:
            return False
        c = cs[0]
        # the labels are what was asked; the container's own env is what its ranks get (a
        # container recreated by hand can carry our labels without the forwarded variables).
        # The config hash leaves the profile out: another profile's container can match it, and
        # kept, it would still carry that profile's label.
        return (
            c.running
            and c.labels.get(PROFILE_LABEL) == prof.name
            and c.labels.get(CONFIG_LABEL) == specs[node].config_hash()
            and env_verdict(c.env, specs[node].env).ok
            and facts[node].image_id is not None
            and c.image_id == facts[node].image_id
            and node not in send_to
            and build is None
        )

    keep = all(fits(n.name) for n in inv.nodes)
    if (
        not keep
        and not other_profiles
        and any(current.values())
        and (not all(current.values()) or not all(c.running for cs in current.values() for c in cs))
    ):
        # what a killed run leaves (a head holding the GCS port, no worker): say so, then replace it
        notes.append(
            "stale state left behind, not a running cluster (containers: "
            + _names(current)
            + "): removed first, as `sparkcluster down --purge-gcs` would"
        )
    notes[:0] = door_notes(inv, prof)
    notes += secret_notes(prof, secret_names)
    common = dict(
        facts=facts, old_server=old_server, secret_names=frozenset(secret_names), notes=notes, away=list(away)
    )
    if keep and serving and not common["away"]:
        plan = Plan(inv, prof, image, specs[head].name, None, [], {}, [], None, unchanged=True, **common)
        # nothing to do: the plan holds only the steps that ran before it
        return _with_steps(plan, [s for s in STAGES.values() if s.before_plan])
    remove = {} if keep else {n: [c.name for c in cs] for n, cs in current.items() if cs}
    to_create = [] if keep else [specs[inv.head.name], *[specs[w.name] for w in inv.workers]]
    bind = engine_host(inv, prof)  # the head's control address only, when the gateway is the only door
    sv = server.ServeSpec(
        container=specs[head].name,
        argv=supervised_argv(prof, port=inv.cluster.api_port, hf_cache=inv.hf_cache(inv.head.name), host=bind)
        + _rank(inv, prof, head),
        secret_names=[n for n in profiles.secret_env_names(prof) if n in common["secret_names"]],
        model=prof.served_model_name,
        port=prof.serve.port or inv.cluster.api_port,
        plugin=profiles.reasoning_plugin(prof, inv.hf_cache(inv.head.name)),
        ranks=tuple(
            (
                w.name,
                specs[w.name].name,
                tuple(
                    supervised_argv(prof, port=inv.cluster.api_port, hf_cache=inv.hf_cache(w.name))
                    + _rank(inv, prof, w.name)
                ),
            )
            for w in inv.workers
            if _rank(inv, prof, w.name)
        ),
        host=reached_at(bind),
    )
    return _with_steps(
        Plan(inv, prof, image, specs[head].name, build, send_to, remove, to_create, sv, **common), STAGES.values()
    )


def door_notes(inv: Inventory, prof: profiles.Profile) -> list[str]:
    """The warning every `up` says (its dry run too) while the owner lets the engine listen on the
    LAN: vLLM's key covers only some routes (vLLM's security guide,
    https://docs.vllm.ai/en/stable/usage/security/: --api-key checks only the /v1, /v2, /inference
    and /cohere prefixes; /invocations, /pause and others answer without it)."""
    if inv.cluster.engines_listen != "all":
        return []
    where = f"{engine_host(inv, prof)} on {inv.head.name}"
    return [
        f'warning: engines_listen = "all" in the inventory: the engine listens at {where}, the LAN included, '
        "where vLLM's API key leaves /invocations, /pause and other routes open; remove the line (the default, "
        '"control", makes the gateway the only door: sparkcluster gateway up)'
    ]


def secret_notes(prof: profiles.Profile, present: Iterable[str]) -> list[str]:
    """What the plan says, before anything starts, of each secret the engine would be passed but
    that was not found (never a value)."""
    have = set(present)
    out = []
    for name in profiles.secret_env_names(prof):
        if name in have:
            continue
        if name == "VLLM_API_KEY":
            out.append(
                "VLLM_API_KEY is not set: up generates one first and writes it, mode 0600, to the .env it reads "
                "(it says where); the engine never serves without a key"
            )
        else:
            out.append(
                f"warning: {name} is not set, so it is not passed (profile '{prof.name}' lists it): "
                f"a gated model's download is refused; {redact.set_fix(name)}"
            )
    return out


# what an offline plan assumes in place of each fact it would read: said in the plan, so the reader
# knows which of its steps may change once the nodes answer
OFFLINE_ASSUMED = (
    "made from the inventory and the profile alone (--offline): no node was asked",
    "waits for facts: whether the head holds the cluster image (assumed: {image})",
    "waits for facts: which workers lack the head's image (assumed: every worker)",
    "waits for facts: which of sparkcluster's containers exist (assumed: none, so all are created)",
    "waits for facts: the SSH user's home on each node (the HF cache is shown as {hf_cache})",
    "waits for facts: which weight files each node caches, and the model's shape (checked by the weights stage)",
    "waits for facts: whether the same profile already serves (assumed: nothing serves)",
    "waits for facts: whether another deployment runs on these nodes (assumed: none; up would need --replace)",
    "waits for facts: the checks of preflight (doctor's), which can stop the run before any step",
)


def offline_facts(inv: Inventory, prof: profiles.Profile) -> dict[str, HostFacts]:
    """Facts of nodes that have nothing yet: no container, no image on a worker. The head has the
    image only where nothing can make it there (executor "mp" serves the base image as pulled)."""
    facts = {n.name: HostFacts(n.name) for n in inv.nodes}
    if served_as_pulled(len(inv.nodes), prof):
        facts[inv.head.name].image_id = "(the head's pulled image)"
    for n in inv.nodes:
        if n.name not in inv._homes:
            inv.set_home(n.name, "~")
    return facts


def make_offline_plan(inv: Inventory, prof: profiles.Profile, secret_names: Iterable[str] = ()) -> Plan:
    """The plan from the inventory and the profile alone (`up --dry-run --offline`): the same
    `make_plan` over facts of bare nodes, with what it assumed said in its notes. Pure."""
    plan = make_plan(inv, prof, offline_facts(inv, prof), serving=False, replace=False, secret_names=secret_names)
    image = "pulled by you on the head" if served_as_pulled(len(inv.nodes), prof) else "missing, so it is built"
    hf_cache = inv.hf_cache(inv.head.name)
    plan.notes[:0] = [n.format(image=image, hf_cache=hf_cache) for n in OFFLINE_ASSUMED]
    return plan


def _rank(inv: Inventory, prof: profiles.Profile, node: str) -> list[str]:
    """Executor "mp" on several nodes: the node's rank and the head's rendezvous (issue 28)."""
    if prof.executor != "mp" or len(inv.nodes) < 2:
        return []
    return rank_args(len(inv.nodes), node_rank(inv, node), str(inv.head.control_ip), inv.cluster.master_port)


def _with_steps(plan: Plan, stages: Iterable[Stage]) -> Plan:
    for stage in stages:
        plan._steps += stage.steps(plan)
    return plan
