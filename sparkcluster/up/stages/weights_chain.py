"""The weights along the chain (issue 27): when two or more workers lack files of a snapshot, the
head sends the files any of them lacks once, along head -> w1 -> w2 -> ... (movement/chain), each
worker's receiver extracting its copy while it relays the stream to the next. Every worker then
checks what arrived against the snapshot's hashes and adopts only the files that match (as with
one worker): a file cut mid-way or altered is dropped, never served. A failed chain names the node
where it failed (image_chain.culprit); the nodes after it got a cut stream, and the next run sends
each only what it still lacks. One worker lacking files: the head sends to it alone (Staging.replicate).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sparkcluster.movement import chain, hfcache, transfer
from sparkcluster.up.stages.base import fail
from sparkcluster.up.stages.image_chain import culprit

if TYPE_CHECKING:
    from sparkcluster.up.execute import UpRun

STAGE = "weights"


@dataclass
class WeightsChained:
    """The weights stage's chain state: repository index -> worker -> what its step reports."""

    notes: dict[int, dict[str, str]] = field(default_factory=dict)


def replicate(r: "UpRun", st, k: int, worker: str) -> str:
    """`worker`'s replicate step of repository `k`: the first such step that runs moves the files to
    every worker that lacks some (along the chain when there are two or more); each step then says
    what reached its worker."""
    done = r.find(WeightsChained) or r.put(WeightsChained())
    if k not in done.notes:
        lacking = [n.name for n in r.inv.workers if st.state[n.name]["missing"]]
        done.notes[k] = distribute(r, st, lacking) if len(lacking) >= 2 else {}
    note = done.notes[k].get(worker)
    return note if note is not None else st.replicate(worker)


def reached(r: "UpRun", k: int, worker: str) -> bool:
    """Whether repository `k`'s chain, run by an earlier worker's step, brought `worker` its files
    (its step then reports that, rather than being skipped as holding them all along)."""
    done = r.find(WeightsChained)
    return done is not None and worker in done.notes.get(k, {})


def distribute(r: "UpRun", st, lacking: list[str]) -> dict[str, str]:
    head = r.cluster.head
    hops = chain.plan(r.inv, r.facts, lacking)
    blobs = list(dict.fromkeys(b for n in lacking for b in st.state[n]["missing"]))
    total = max(st.state[n]["missing_bytes"] for n in lacking)
    procs: dict[str, object] = {}
    port = 0
    for i in reversed(range(len(hops))):
        h, nxt = hops[i], (hops[i + 1] if i + 1 < len(hops) else None)
        fwd = transfer.next_hop(nxt.dst_ip, port, nxt.src_ip) if nxt else None
        recv = r.cluster.hosts[h.dst].start(
            transfer.bash(hfcache.receive_command(r.inv.hf_cache(h.dst), st.repo, h.dst_ip, h.src_ip, fwd)),
            timeout=24 * 3600,
        )
        procs[h.dst] = recv
        got = transfer.announced_port(recv)
        if got is None:
            res = recv.wait()
            for n, p in procs.items():
                if n != h.dst:
                    p.close()
            what = (
                f"{h.dst} cannot reach {nxt.dst} at {nxt.dst_ip}:{port} from {nxt.src_ip}"
                if res.exit_code == transfer.RELAY_FAILED and nxt
                else "the receiver did not start"
            )
            raise fail(
                STAGE,
                h.dst,
                "start the receiver",
                what,
                "python3 receiver | tar -x (relays)",
                res.tail(),
                f"check the link between {h.dst} and {nxt.dst} ({nxt.via}), then sparkcluster up" if nxt else None,
            )
        port = got
    first = hops[0]
    t0 = time.monotonic()
    snd = head.start(
        transfer.bash(hfcache.send_command(st.cache, st.repo, blobs, first.dst_ip, port, first.src_ip)),
        timeout=24 * 3600,
    )
    sent = transfer.follow_sender(
        snd, lambda n: st.progress.bytes(f"{head.name} -> chain of {len(hops)}", min(n, total), total)
    )
    sres = snd.wait()
    results = {h.dst: procs[h.dst].wait() for h in hops}
    secs = time.monotonic() - t0
    # whatever arrived whole is adopted on each node (it matches its name), the rest is dropped
    after = {n: st.check(n) for n in lacking}
    bad = culprit(sres.ok, [(h.dst, results[h.dst].exit_code) for h in hops], head.name)
    if bad is not None:
        res = sres if bad == head.name else results[bad]
        still = {n: len(a["missing"]) for n, a in after.items() if a["missing"]}
        raise fail(
            STAGE,
            bad,
            "replicate the weights",
            f"the chain failed at {bad} (exit {res.exit_code}); "
            + ", ".join(f"{n}: {c} file(s) still missing" for n, c in still.items())
            + " (the next run sends only those)",
            res.command[:160],
            res.tail(),
            f"check free disk on {bad} and its links, then sparkcluster up",
        )
    for n, a in after.items():
        if a["missing"]:
            raise fail(
                STAGE,
                n,
                "verify the weights",
                f"{len(a['missing'])} file(s) that reached {n} along the chain did not match their hash (removed)",
                fix=f"check {n}'s links, then sparkcluster up",
            )
    for n in lacking:
        st.moved[n] = sent
    rate = f"{sent / 1e6:.1f} MB in {secs:.1f}s, {sent / 1e6 / max(secs, 1e-3):.1f} MB/s"
    return {h.dst: f"received from {h.src} along the chain ({h.src_ip} -> {h.dst_ip}): {rate}, verified" for h in hops}
