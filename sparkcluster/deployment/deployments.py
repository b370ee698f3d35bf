"""Deployments: a profile on a set of nodes (issue 20). A TP=2 profile spans the pair; a TP=1
profile runs on one node (`up --node NAME`), so a pair can serve one model across both nodes, or
one model per node. What runs is read from the hosts themselves: the containers' labels name the
profile and the deployment's node set.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sparkcluster import log
from sparkcluster.config import lint
from sparkcluster.config.inventory import MAX_SLOTS, Inventory
from sparkcluster.config.profile import Profile
from sparkcluster.errors import InputError
from sparkcluster.facts.parsers import ContainerInspect
from sparkcluster.labels import (
    CLUSTER_LABEL,
    MEMORY_LABEL,
    NODES_LABEL,
    ON_DEMAND_LABEL,
    PORT_LABEL,
    PROFILE_LABEL,
    RESERVED_LABEL,
    ROLE_LABEL,
    SERVICE_ROLE,
    is_gateway,
    slot_of,
)
from sparkcluster.node import memory_fit

_log = log.get(__name__)


@dataclass
class Deployment:
    profile: str
    nodes: tuple[str, ...]
    containers: dict[str, list[str]] = field(default_factory=dict)  # node -> container names
    slot: int = 0  # its slot on its nodes (issue 60): its container names and port block
    ids: dict[str, set[str]] = field(default_factory=dict)  # node -> container IDs (what `down` removes)
    fraction: float | None = None  # its engine's gpu_memory_utilization (the memory label), None: unlabelled
    service: bool = False  # a profile of kind "service" (issue 60 item 2): its containers' role says so
    reserved_gb: float | None = None  # a service's reservation per node (its label), GB
    port: int | None = None  # a service's port (its label): where it answers
    on_demand: bool = False  # its engine starts on demand (its label): it takes turns with others on demand

    @property
    def key(self) -> str:
        return f"{self.profile}@{'+'.join(self.nodes)}"

    def inventory(self, full: Inventory) -> Inventory:
        """The deployment's own inventory: its nodes, at its slot (its ports)."""
        return full.only(list(self.nodes)).at_slot(self.slot)

    def describe(self) -> str:
        return f"'{self.profile}' on {', '.join(self.nodes)}"


def width(prof) -> int:
    """GPUs the profile's engine spans: tensor parallel x pipeline parallel."""
    return prof.serve.tensor_parallel_size * prof.serve.pipeline_parallel_size


def node_flags(nodes) -> str:
    """` --node A --node B` as the command line names the nodes (empty for the whole inventory)."""
    return "".join(f" --node {n}" for n in ([nodes] if isinstance(nodes, str) else nodes or ()))


def target(inv: Inventory, prof, nodes: tuple[str, ...] | str | None) -> Inventory:
    """The nodes a run of `prof` touches: those named (`--node`, repeatable), or the whole inventory.
    A profile narrower than the inventory needs its nodes named: two single-node deployments may
    share a pair, two pairs a four-node inventory."""
    if nodes:
        names = [nodes] if isinstance(nodes, str) else list(nodes)
        try:
            part = inv.only(names)
        except InputError as e:
            raise _fit_fix(e, inv, prof, names) from None
        if not spans(prof, part):
            have = sum(n.gpus for n in part.nodes)
            fit = fitting(inv, prof, names)
            err = InputError(
                f"profile '{prof.name}' spans {width(prof)} GPU(s) (tensor parallel {prof.serve.tensor_parallel_size}"
                f" x pipeline parallel {prof.serve.pipeline_parallel_size}); {' + '.join(names)} "
                f"{'has' if len(names) == 1 else 'have'} {have}",
                _run_on(inv, prof, fit),
            )
            err.nodes = fit
            raise err
        return part
    if len(inv.nodes) > 1 and width(prof) < inv.gpu_count:
        one = width(prof) <= max(n.gpus for n in inv.nodes)
        fit = fitting(inv, prof, [])
        choices = " or ".join(n.name for n in inv.nodes) if one else "repeat --node for each"
        err = InputError(
            f"profile '{prof.name}' runs on {width(prof)} GPU(s), "
            f"{'one node' if one else 'some of the nodes'} of this inventory ({inv.gpu_count} GPUs): "
            f"name {'it' if one else 'them'} with --node ({choices})",
            _run_on(inv, prof, fit),
        )
        err.nodes = fit
        raise err
    return inv


def spans(prof, part: Inventory) -> bool:
    """Whether `prof` runs on the nodes of `part` as they are: lint's `tp-pp-gpus` judged on them."""
    return not lint.RULES["tp-pp-gpus"].check(prof, part)


def fitting(inv: Inventory, prof, near: list[str]) -> tuple[str, ...] | None:
    """The nodes to name for `prof` (() for the whole inventory: no --node at all), those nearest to
    `near` (the names given, a mistyped one's close match among them): a stretch of the inventory's
    nodes, in its order, whose GPUs make the profile's width and which the cabling serves. None: no
    such nodes in this inventory."""
    if not isinstance(prof, Profile):
        return None
    names = [n.name for n in inv.nodes]
    if width(prof) == inv.gpu_count:
        return ()
    best: tuple[int, int, tuple[str, ...]] | None = None
    for size in range(1, len(names)):
        for start in range(len(names) - size + 1):
            cand = tuple(names[start : start + size])
            try:
                ok = spans(prof, inv.only(list(cand)))
            except InputError:  # a part the cabling does not serve
                continue
            if ok:
                rank = (-len(set(cand) & set(near)), start, cand)
                best = rank if best is None or rank < best else best
    return best[2] if best else None


def _run_on(inv: Inventory, prof, fit: tuple[str, ...] | None) -> str:
    """The fix for a node set that does not fit `prof` (the CLI puts `fit` in the command line as typed)."""
    if fit is None:
        return (
            f"no nodes of this inventory make {width(prof)} GPU(s): run a profile whose tensor x pipeline "
            f"parallel matches your nodes (sparkcluster profile list)"
        )
    return f"sparkcluster up --profile {prof.name}{node_flags(fit)}" + ("" if fit else " (the whole inventory)")


def _fit_fix(e: InputError, inv: Inventory, prof, names: list[str]) -> InputError:
    """An unknown node name's error, its suggestion made one the profile runs on: a close name is
    offered only when the profile spans that node (set), else the nodes that fit."""
    if e.replace is None:  # nodes the cabling does not join: the nearest that it does, as the fix
        fit = fitting(inv, prof, names)
        if fit is not None:
            e.fix, e.nodes = _run_on(inv, prof, fit), fit
        return e
    wrong, close = e.replace
    offered = [close if n == wrong else n for n in names]
    try:
        if spans(prof, inv.only(offered)):
            return e
    except InputError:
        pass
    fit = fitting(inv, prof, offered)
    out = InputError(
        f"no node named {wrong!r} in the inventory ({', '.join(n.name for n in inv.nodes)}); profile "
        f"'{prof.name}' spans {width(prof)} GPU(s)"
        + (f": {' + '.join(fit or [n.name for n in inv.nodes])}" if fit is not None else ""),
        _run_on(inv, prof, fit),
    )
    out.nodes = fit
    return out


def group(inv: Inventory, containers_by_node: dict[str, list[dict | ContainerInspect]]) -> list[Deployment]:
    """Pure: containers (as the Engine API lists them, or as `docker inspect` describes them:
    status reads them in its SSH round trip) -> deployments, in inventory order. A container
    without the node-set label (made before deployments existed) belongs to every node of its profile."""
    found: dict[tuple[str, tuple[str, ...]], Deployment] = {}
    for n in inv.nodes:
        for c in containers_by_node.get(n.name, []):
            name, labels = (c.name or "?", c.labels) if isinstance(c, ContainerInspect) else _listed(c)
            cid = (c.id if isinstance(c, ContainerInspect) else c.get("Id")) or name
            if labels.get(CLUSTER_LABEL) != inv.cluster.name or is_gateway(labels):
                continue  # the gateway (issue 36) serves no model of its own: it is no deployment
            prof = labels.get(PROFILE_LABEL, "?")
            nodes = tuple(x for x in (labels.get(NODES_LABEL) or "").split(",") if x)
            if not nodes:
                nodes = tuple(m.name for m in inv.nodes)
            slot = slot_of(labels)
            d = found.setdefault((prof, nodes, slot), Deployment(prof, nodes, slot=slot))
            d.containers.setdefault(n.name, []).append(name)
            d.ids.setdefault(n.name, set()).add(cid)
            d.on_demand = d.on_demand or labels.get(ON_DEMAND_LABEL) == "1"
            if labels.get(ROLE_LABEL) == SERVICE_ROLE:
                d.service = True
                d.port = int(labels[PORT_LABEL]) if str(labels.get(PORT_LABEL, "")).isdigit() else d.port
            try:
                d.fraction = float(labels[MEMORY_LABEL]) if MEMORY_LABEL in labels else d.fraction
                d.reserved_gb = float(labels[RESERVED_LABEL]) if RESERVED_LABEL in labels else d.reserved_gb
            except ValueError:
                pass
    return list(found.values())


def engine_image(api, cluster: str) -> str | None:
    """The image a model's container of `cluster` on the node runs (the cluster's own image: python3
    and what the node agent needs), or None where no model's container is there. The gateway runs
    from it, and so does a service's supervisor (container/service_container)."""
    for c in api.containers(all=True, filters={"label": f"{CLUSTER_LABEL}={cluster}"}):
        labels = c.get("Labels") or {}
        if labels.get(ROLE_LABEL) in ("head", "worker") and c.get("Image"):
            return c["Image"]
    return None


def _listed(c: dict) -> tuple[str, dict[str, str]]:
    """A container's name and labels as the Engine API's list (`docker ps`) gives them."""
    return (c.get("Names") or ["?"])[0].lstrip("/"), c.get("Labels") or {}


def on(cluster, inv: Inventory) -> tuple[list[Deployment], dict[str, str]]:
    """The deployments on the connected nodes of `cluster`, and the nodes whose containers could
    not be read, with why (their Docker does not answer): what runs there is unknown, never "none"."""
    lists = cluster.each(
        lambda h: h.docker().api.containers(all=True, filters={"label": f"{CLUSTER_LABEL}={inv.cluster.name}"})
    )
    unread = {n: str(o.error) for n, o in lists.items() if not o.ok}
    return group(inv, {n: o.value for n, o in lists.items() if o.ok}), unread


def conflicts(found: list[Deployment], sub: Inventory, prof_name: str) -> list[Deployment]:
    """Deployments that share a node with `sub` and are not this very deployment."""
    mine = tuple(n.name for n in sub.nodes)
    return [d for d in found if set(d.nodes) & set(mine) and (d.profile, d.nodes) != (prof_name, mine)]


def select(found: list[Deployment], node: str | None, profile: str | None) -> list[Deployment]:
    return [d for d in found if (node is None or node in d.nodes) and (profile is None or d.profile == profile)]


def free_slot(found: list[Deployment], nodes: tuple[str, ...]) -> int:
    """The lowest slot no deployment sharing one of `nodes` holds (issue 60): slot 0 first, so that
    a node's only deployment keeps the names and ports of before."""
    taken = {d.slot for d in found if set(d.nodes) & set(nodes)}
    for slot in range(MAX_SLOTS):
        if slot not in taken:
            return slot
    raise InputError(
        f"{len(taken)} deployments already share {', '.join(nodes)}: no slot is left for another",
        "sparkcluster down --profile NAME for one of them (sparkcluster status lists them)",
    )


def slot_for(found: list[Deployment], nodes: tuple[str, ...], profile: str) -> int:
    """This deployment's slot: the one it holds where it runs already, else the lowest free one."""
    for d in found:
        if (d.profile, d.nodes) == (profile, nodes):
            return d.slot
    return free_slot(found, nodes)


def held(d: Deployment) -> memory_fit.Held:
    """A deployment's claim on each of its nodes' memory, as the admission counts it: a service's
    reservation (its label), else its engine's share of MemTotal (`share`)."""
    if d.reserved_gb is not None:
        return memory_fit.Held(f"'{d.profile}'", None, int(d.reserved_gb * memory_fit.GB))
    return memory_fit.Held(f"'{d.profile}'", share(d))


def share(d: Deployment) -> float | None:
    """A deployment's memory share: its label, else its profile's gpu_memory_utilization where this
    machine has the profile (a container made before the label), else None (unknown)."""
    if d.fraction is not None:
        return d.fraction
    from sparkcluster.config import profile as profiles  # only for a container made before the memory label

    try:
        return profiles.load_profile(d.profile).serve.gpu_memory_utilization
    except Exception:  # a profile not on this machine, or no longer valid: its share is unknown
        return None
