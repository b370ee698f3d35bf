"""The image to two or more workers along a chain (issue 27): one `docker save` on the head feeds
the first worker's receiver, which forwards every frame to the next worker's as it arrives, and so
on, so the head's port carries one copy whatever the number of workers. The layers left out are
those every receiving worker holds; each node's `docker load` and the image-ID comparison verify
its own copy. A failure names the first node where it happened; the nodes after it got a cut
stream and loaded nothing.

One step per worker: the first one that runs moves the image to all (receivers started from the
chain's tail back, each told its downstream's port, then the sender); each verifies its own node.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sparkcluster import log
from sparkcluster.errors import StageError
from sparkcluster.movement import chain, layers, transfer
from sparkcluster.up.stages import image
from sparkcluster.up.stages.base import Step, fail

if TYPE_CHECKING:
    from sparkcluster.up.execute import UpRun
    from sparkcluster.up.plan import Plan

_log = log.get(__name__)
STAGE = image.STAGE


def steps(plan: "Plan") -> list[Step]:
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
            f"{head}: one docker save {plan.image} for the {len(hops)} workers, leaving out the layers every one "
            f"of them holds ({planned_layers(plan, [x.dst for x in hops])}); "
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


def planned_layers(plan: "Plan", workers: list[str]) -> str:
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


def receive(r: "UpRun", worker: str) -> str:
    done = r.find(Chained) or r.put(Chained(distribute(r)))
    note = done.notes.get(worker)
    if note is None:  # not in the chain run (it held the image then): nothing of ours moved to it
        return image.send(r, worker)
    got = image.image_id(r.cluster.hosts[worker], r.plan.image)
    head_id = image.head_image(r)["Id"]
    if got != head_id:
        raise fail(
            STAGE,
            worker,
            "verify the image",
            f"image ID after the transfer is {got} on {worker}, {head_id} on {r.inv.head.name}",
        )
    return note


def distribute(r: "UpRun") -> dict[str, str]:
    """Moves the image to every worker of the plan that lacks it now; returns a note per worker."""
    info = image.head_image(r)
    need = [w for w in r.plan.send_to if r.facts[w].image_id != info["Id"]]
    if len(need) < 2:
        return {w: image.send(r, w) for w in need}
    hops = chain.plan(r.inv, r.facts, need)
    wfs = [r.facts[h.dst] for h in hops]
    d = layers.shared_delta(image.head_layers(r), [(f.layer_chains, image._elides(f)) for f in wfs])
    size, image_layers = info.get("Size", 0), (info.get("RootFS") or {}).get("Layers") or []
    for h in hops:
        image.check_disk(r, h.dst, d, size, image_layers)
    try:
        sent, secs = _stream(r, hops, d, d.move_bytes if d.elide and d.move_bytes else size)
    except StageError as e:
        # a worker lost a layer since preflight: docker load names the missing file; the whole
        # image then goes along the chain once more
        if not d.skip or "no such file" not in " ".join(f.output_tail for f in e.failures).lower():
            raise
        _log.warning("a worker lacks a layer it held at preflight; sending the whole image along the chain")
        d = layers.Delta(d.total, 0, None, d.elide)
        sent, secs = _stream(r, hops, d, size)
    what = (
        layers.describe(d, "each").replace(" to each", "")
        if d.elide
        else "the whole image: a containerd image store in the chain cannot skip layers it holds"
    )
    rate = f"{sent / 1e6:.1f} MB in {secs:.1f}s, {sent / 1e6 / max(secs, 1e-3):.1f} MB/s"
    return {h.dst: f"received from {h.src} along the chain ({h.src_ip} -> {h.dst_ip}): {rate} ({what})" for h in hops}


def _stream(r: "UpRun", hops: list[chain.Hop], d: layers.Delta, expect: int) -> tuple[int, float]:
    """Receivers from the tail back, then the one sender; returns (bytes sent, seconds)."""
    head = r.cluster.head
    procs: dict[str, object] = {}
    port = 0
    for i in reversed(range(len(hops))):
        h, nxt = hops[i], (hops[i + 1] if i + 1 < len(hops) else None)
        fwd = transfer.next_hop(nxt.dst_ip, port, nxt.src_ip) if nxt else None
        host = r.cluster.hosts[h.dst]
        recv = host.start(transfer.bash(transfer.receive_command(h.dst_ip, h.src_ip, fwd)), timeout=3600)
        procs[h.dst] = recv
        got = transfer.announced_port(recv)
        if got is None:
            res = recv.wait()
            _close(procs, h.dst)
            if res.exit_code == transfer.RELAY_FAILED and nxt:
                raise fail(
                    STAGE,
                    h.dst,
                    "start the relay",
                    f"{h.dst} cannot reach {nxt.dst} at {nxt.dst_ip}:{port} from {nxt.src_ip}",
                    "python3 receiver (runs docker load, relays)",
                    res.tail(),
                    f"check the link between {h.dst} and {nxt.dst} ({nxt.via}), then sparkcluster up",
                )
            raise fail(
                STAGE,
                h.dst,
                "start the receiver",
                "the receiver did not start",
                "python3 receiver (runs docker load)",
                res.tail(),
            )
        port = got
    t0 = time.monotonic()
    first = hops[0]
    snd = head.start(
        transfer.bash(transfer.send_command(r.plan.image, first.dst_ip, port, first.src_ip, d.skip, d.keep)),
        timeout=3600,
    )
    sent = transfer.follow_sender(snd, lambda n: r.progress.bytes(first.dst, n, max(expect, n)))
    sres = snd.wait()
    results = {h.dst: procs[h.dst].wait() for h in hops}
    bad = culprit(sres.ok, [(h.dst, results[h.dst].exit_code) for h in hops], head.name)
    if bad is None:
        return sent, time.monotonic() - t0
    order = [h.dst for h in hops]
    after = [w for w in order[order.index(bad) + 1 :]] if bad in order else order
    cut = [w for w in after if results[w].exit_code == transfer.STREAM_CUT]
    res = sres if bad == head.name else results[bad]
    up = next((h for h in hops if h.dst == bad), None)
    how = (
        "could not forward to the next node: its own copy is whole"
        if res.exit_code == transfer.RELAY_FAILED
        else f"transfer failed (exit {res.exit_code})"
    )
    raise fail(
        STAGE,
        bad,
        "send the image",
        how + (f"; {', '.join(cut)} got a cut stream and loaded nothing" if cut else ""),
        res.command[:160],
        res.tail(),
        (
            f"check free disk on {bad} and the link between {up.src} and {bad} ({up.via})"
            if up
            else f"check `docker save {r.plan.image}` on {head.name}"
        )
        + ", then sparkcluster up",
    )


def culprit(sender_ok: bool, codes: list[tuple[str, int]], head: str) -> str | None:
    """The node to name for a chain that failed, or None when every hop succeeded. `codes`: each
    receiver's exit status in chain order. A failure of a node's own (its docker load, the node
    lost) comes first; then the head's sender (everything after it is only cut); then a relay that
    could not forward; then the first node whose stream was cut under it."""
    own = [n for n, c in codes if c not in (0, transfer.STREAM_CUT, transfer.RELAY_FAILED)]
    if own:
        return own[0]
    if not sender_ok:
        return head
    for want in (transfer.RELAY_FAILED, transfer.STREAM_CUT):
        hit = [n for n, c in codes if c == want]
        if hit:
            return hit[0]
    return None


def _close(procs: dict, but: str) -> None:
    """Ends the receivers already started (they would wait a minute for a sender that never comes)."""
    for n, p in procs.items():
        if n != but:
            p.close()
