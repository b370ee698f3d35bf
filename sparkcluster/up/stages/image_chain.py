"""The image to two or more workers along a chain (issue 27): one read of the image on the head (the
layers the workers lack from its layer store, else `docker save`: image.stream_image) feeds the
first worker's receiver, which forwards every frame to the next worker's as it arrives, and so
on, so the head's port carries one copy whatever the number of workers. The layers left out are
those every receiving worker holds; each node's `docker load` and the image-ID comparison verify
its own copy. A failure names the first node where it happened; the nodes after it got a cut
stream and loaded nothing.

One step per worker: the first one that runs moves the image to all (receivers started from the
chain's tail back, each told its downstream's port, then the sender); each verifies its own node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sparkcluster.movement import chain, layers
from sparkcluster.steps.base import Step
from sparkcluster.up.stages import image

if TYPE_CHECKING:
    from sparkcluster.up.execute import UpRun
    from sparkcluster.up.plan import Plan

STAGE = image.STAGE


def steps(plan: Plan) -> list[Step]:
    """One "receive" step per worker of plan.send_to, in chain order, when there are several (one
    worker gets the image from `image.send`)."""
    if len(plan.send_to) < 2:  # one docker save feeds a chain through the workers (issue 27)
        return []
    inv, head = plan.inventory, plan.inventory.head.name
    hops = chain.plan(inv, plan.facts, plan.send_to)
    when = "the head's image ID, read after the build, differs from this node's" if plan.build is not None else ""
    out = []
    for i, h in enumerate(hops):
        first = (
            f"{head}: one read of {plan.image} for the {len(hops)} workers, leaving out the layers every one "
            f"of them holds ({planned_layers(plan, [x.dst for x in hops])}): "
            + (
                "from the head's layer store (a throwaway container, the docker root read-only), else docker save; "
                if image._reads_store(plan, [x.dst for x in hops])
                else "docker save; "
            )
            if i == 0
            else ""
        )
        out.append(
            Step(
                STAGE,
                h.dst,
                "receive",
                f"receive the image from {h.src} along the chain",
                first + chain.describe(hops, i) + f"; {h.dst}: docker load (one connection, {h.src}'s "
                "address only; image ID verified after)",
                run=lambda r, w=h.dst: receive(r, w),
                when=when,
                skip=(lambda r, w=h.dst: image._same_image(r, w)) if when else None,
            )
        )
    return out


def planned_layers(plan: Plan, workers: list[str]) -> str:
    """Which layers (count, size) the one stream carries, from the facts gathered in preflight."""
    hf = plan.facts.get(plan.inventory.head.name)
    wfs = [plan.facts.get(w) for w in workers]
    if hf is None or any(f is None for f in wfs):
        return "layers: unknown (no facts)"
    if plan.build is None and hf.image_layers is not None:
        d = layers.shared_delta(hf.image_layers, [(f.layer_chains, image._elides(f)) for f in wfs])
        return layers.describe(d, "each").replace("(it holds", "(they hold").replace("; it holds", "; they hold")
    return "the whole image, or the layers the build adds (known only after it)"


@dataclass(frozen=True)
class Chained:
    """What the chain delivered (the image stage's state): a note per worker that received."""

    notes: dict[str, str]


def receive(r: UpRun, worker: str) -> str:
    done = r.find(Chained) or r.put(Chained(distribute(r)))
    note = done.notes.get(worker)
    if note is None:  # not in the chain run (it held the image then): nothing of ours moved to it
        return image.send(r, worker)
    image.verify(r, worker)
    return note


def distribute(r: UpRun) -> dict[str, str]:
    """Moves the image to every worker of the plan that lacks it now; returns a note per worker."""
    info = image.head_image(r)
    need = [w for w in r.plan.send_to if r.facts[w].image_id != info["Id"]]
    if len(need) < 2:
        return {w: image.send(r, w) for w in need}
    hops = chain.plan(r.inv, r.facts, need)
    wfs = [r.facts[h.dst] for h in hops]
    d = layers.shared_delta(image.head_layers(r), [(f.layer_chains, image._elides(f)) for f in wfs])
    got, d = image.stream_image(r, hops, d)
    what = (
        layers.describe(d, "each").replace(" to each", "")
        if d.elide
        else "the whole image: a containerd image store in the chain cannot skip layers it holds"
    )
    return {
        h.dst: f"received from {h.src} along the chain ({h.src_ip} -> {h.dst_ip}): {got.rate} ({what})"
        + image.head_time(got, info.get("Size", 0))
        for h in hops
    }
