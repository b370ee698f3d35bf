"""The weights along the chain (issue 27): when two or more workers lack files of a snapshot, the
head sends the files any of them lacks once, along head -> w1 -> w2 -> ... (movement/chain), each
worker's receiver extracting its copy while it relays the stream to the next. Every worker then
checks what arrived against the snapshot's hashes and adopts only the files that match (as with
one worker): a file cut mid-way or altered is dropped, never served. A failed chain names the node
where it failed (stream.culprit); the nodes after it got a cut stream, and the next run sends
each only what it still lacks. One worker lacking files: the head sends to it alone
(Staging.replicate), the same `stream_files` over one hop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sparkcluster.movement import chain, hfcache, stream
from sparkcluster.steps.base import fail

if TYPE_CHECKING:
    from sparkcluster.up.execute import UpRun

STAGE = "weights"


@dataclass
class WeightsChained:
    """The weights stage's chain state: repository index -> worker -> what its step reports."""

    notes: dict[int, dict[str, str]] = field(default_factory=dict)


def replicate(r: UpRun, st, k: int, worker: str) -> str:
    """`worker`'s replicate step of repository `k`: the first such step that runs moves the files to
    every worker that lacks some (along the chain when there are two or more); each step then says
    what reached its worker."""
    done = r.find(WeightsChained) or r.put(WeightsChained())
    if k not in done.notes:
        lacking = [n.name for n in r.inv.workers if st.state[n.name]["missing"]]
        done.notes[k] = distribute(r, st, lacking) if len(lacking) >= 2 else {}
    note = done.notes[k].get(worker)
    return note if note is not None else st.replicate(worker)


def reached(r: UpRun, k: int, worker: str) -> bool:
    """Whether repository `k`'s chain, run by an earlier worker's step, brought `worker` its files
    (its step then reports that, rather than being skipped as holding them all along)."""
    done = r.find(WeightsChained)
    return done is not None and worker in done.notes.get(k, {})


def distribute(r: UpRun, st, lacking: list[str]) -> dict[str, str]:
    """One stream along the chain through the workers `lacking`; returns a note per worker."""
    got = stream_files(st, r.cluster.hosts, r.inv, chain.plan(r.inv, r.facts, lacking))
    return {
        h.dst: f"received from {h.src} along the chain ({h.src_ip} -> {h.dst_ip}): {got.rate}, verified"
        for h in got.hops
    }


def stream_files(st, hosts, inv, hops: list[chain.Hop]) -> stream.Streamed:
    """The files any receiving node of `hops` lacks, in one stream along them (one hop: a single
    worker). Each node then checks what arrived against the snapshot's hashes: whatever arrived
    whole is adopted (it matches its name), the rest is dropped, never served. Fails naming the
    node at fault (stream.culprit), or one where a file did not match."""
    head, first, nodes = hops[0].src, hops[0], [h.dst for h in hops]
    blobs = list(dict.fromkeys(b for n in nodes for b in st.state[n]["missing"]))
    total = max(st.state[n]["missing_bytes"] for n in nodes)
    bar = f"{head} -> {first.dst}" if len(hops) == 1 else f"{head} -> chain of {len(hops)}"
    got = stream.run(
        STAGE,
        hosts,
        hops,
        receive=lambda h, fwd: hfcache.receive_command(inv.hf_cache(h.dst), st.repo, h.dst_ip, h.src_ip, fwd),
        send=lambda port: hfcache.send_command(
            st.cache, st.repo, blobs, first.dst_ip, port, first.src_ip, rate=st.cap_bytes_s
        ),
        on_sent=lambda n: st.progress.bytes(bar, min(n, total), total),
        sink="the extractor (each file hashed as it is written)",
        timeout=24 * 3600,
    )
    after = {n: st.check(n) for n in nodes}
    if got.blame is not None:
        still = ", ".join(f"{n}: {len(a['missing'])} file(s) still missing" for n, a in after.items() if a["missing"])
        raise got.failure(
            STAGE,
            "replicate the weights",
            f"the transfer failed at {got.blame} (exit {got.result.exit_code}); {still} "
            "(the next run sends only those)",
            f"the files of {st.repo} in the HF cache",
        )
    for h in hops:
        if after[h.dst]["missing"]:
            raise fail(
                STAGE,
                h.dst,
                "verify the weights",
                f"{len(after[h.dst]['missing'])} file(s) that reached {h.dst} did not match their hash (removed)",
                fix=f"check the link between {h.src} and {h.dst} ({h.via}), then sparkcluster up",
            )
    for n in nodes:
        st.moved[n] = got.sent
    return got
