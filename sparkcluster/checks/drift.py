"""Drift checks (issue 39): what changes on one node between a day it served and a day it does not.

Each check reads one family of host facts (`facts.probes.TRAITS`), matches them against the
known-bad list (`config/known_bad.toml`, extended beside the inventory: each entry's why, source and
fix become the row's detail and fix) and names a node whose value differs from its peers (the value
most nodes share, ties going to the head's). A node that did not report a fact (a VM without DMI, a
host without HCAs) is skipped with the reason, never judged: unknown is not bad.
"""

from __future__ import annotations

from collections import Counter

from sparkcluster.checks.registry import Context, Report, check
from sparkcluster.config import known_bad
from sparkcluster.facts.image_nccl import cuda_cache, judge_driver
from sparkcluster.facts.parsers import Traits


def _list(ctx: Context) -> known_bad.KnownBad:
    return known_bad.load(ctx.inventory.path)


def odd_ones(values: dict[str, str], head: str) -> dict[str, str]:
    """Pure: node -> the peers' value, for each node whose value differs from the one most nodes
    share (a tie goes to the head's value; a node without a value is left out)."""
    have = {n: v for n, v in values.items() if v}
    if len(set(have.values())) < 2:
        return {}
    counts = Counter(have.values()).most_common()
    top = [v for v, c in counts if c == counts[0][1]]
    ref = have[head] if head in have and have[head] in top else top[0]
    return {n: ref for n, v in have.items() if v != ref}


def _bad(r: Report, node: str, entries: list[known_bad.Entry], what: str) -> bool:
    """Report the worst matching entry on `node`; True when one was reported."""
    live = [e for e in entries if e.severity != "ok"]
    if not live:
        return False
    worst = next((e for e in live if e.severity == "fail"), live[0])
    detail = f"{what}: {worst.why} (known bad: {worst.id}; {worst.sources()})"
    (r.fail if worst.severity == "fail" else r.warn)(node, detail, worst.fix)
    return True


def _judge(ctx: Context, r: Report, name: str, value_of, signals_of, label: str, differs_fix: str) -> None:
    """One node-level fact: the known-bad list first, then a node that differs from its peers."""
    kb = _list(ctx)
    values = {n: value_of(f.traits, f) for n, f in ctx.facts.items()}
    odd = odd_ones(values, ctx.inventory.head.name)
    for n, f in ctx.facts.items():
        v = values[n]
        if not v:
            r.skip(n, f"the node did not report its {label}")
            continue
        if _bad(r, n, kb.matching(name, signals_of(f.traits, f)), f"{label} {v}"):
            continue
        if n in odd:
            r.warn(n, f"{label} {v} here, {odd[n]} on its peers", differs_fix)
        else:
            r.ok(n, v)


@check("host.kernel", "Kernel: not on the known-bad list (7.0 with KHO), the same as its peers")
def host_kernel(ctx: Context, r: Report) -> None:
    def signals(t: Traits, f) -> dict:
        known = t.cma_total_kb is not None and t.cma_free_kb is not None
        over = t.cma_free_kb - t.cma_total_kb if known else None
        return {
            "kernel": t.kernel,
            "cma_total_kb": t.cma_total_kb,
            "cma_free_kb": t.cma_free_kb,
            "cma_free_over_total_kb": over,
        }

    _judge(
        ctx,
        r,
        "host.kernel",
        lambda t, f: t.kernel,
        signals,
        "kernel",
        "boot every node into the same kernel (a node updated alone is the first place to look when one stops serving)",
    )


@check("host.bios", "BIOS: not older than the known-bad date, the same as its peers")
def host_bios(ctx: Context, r: Report) -> None:
    def value(t: Traits, f) -> str:
        return " ".join(x for x in (t.bios_version, f"({t.bios_date})" if t.bios_date else "") if x)

    _judge(
        ctx,
        r,
        "host.bios",
        value,
        lambda t, f: {"bios_vendor": t.bios_vendor, "bios_version": t.bios_version, "bios_date": t.bios_date},
        "BIOS",
        "update the firmware of the older node (sudo fwupdmgr refresh && sudo fwupdmgr update) and reboot it",
    )


def _docker(f) -> str:
    return f.docker.server_version if f.docker else ""


def _driver(f) -> str:
    return f.gpus[0].driver if f.gpus else ""


@check("host.versions", "DGX OS, Docker and the container toolkit: the same on every node")
def host_versions(ctx: Context, r: Report) -> None:
    kb = _list(ctx)
    head = ctx.inventory.head.name
    parts = {
        "DGX OS": {n: f.traits.dgx_os for n, f in ctx.facts.items()},
        "Docker": {n: _docker(f) for n, f in ctx.facts.items()},
        "container toolkit": {n: f.traits.toolkit for n, f in ctx.facts.items()},
    }
    odd = {what: odd_ones(vals, head) for what, vals in parts.items()}
    for n, f in ctx.facts.items():
        mine = {what: vals[n] for what, vals in parts.items() if vals[n]}
        signals = {"dgx_os": f.traits.dgx_os, "docker": _docker(f), "toolkit": f.traits.toolkit, "driver": _driver(f)}
        said = ", ".join(f"{w} {v}" for w, v in mine.items())
        if _bad(r, n, kb.matching("host.versions", signals), said or f"driver {_driver(f)}"):
            continue
        differs = [f"{w} {mine[w]} here, {odd[w][n]} on its peers" for w in parts if n in odd[w]]
        if differs:
            r.warn(
                n,
                "; ".join(differs),
                "update the older node (sudo apt update && sudo apt full-upgrade, as DGX OS updates) so every "
                "node runs the same stack",
            )
        elif mine:
            r.ok(n, said)
        else:
            r.skip(n, "the node reported none of DGX OS, Docker, the container toolkit")


def _hcas(ctx: Context, node: str, t: Traits) -> list[str]:
    """The inventory's data-plane HCAs this node reports links for, else every HCA it has."""
    n = next(x for x in ctx.inventory.nodes if x.name == node)
    wanted = [h for h in n.hcas if h in t.hca_links]
    return wanted or sorted(t.hca_links)


@check("rdma.pcie", "Each HCA's PCIe link at its full width and speed")
def rdma_pcie(ctx: Context, r: Report) -> None:
    kb = _list(ctx)
    for n, f in ctx.facts.items():
        links = [f.traits.hca_links[h] for h in _hcas(ctx, n, f.traits)]
        links = [x for x in links if x.width is not None]
        if not links:
            r.skip(n, "no HCA reported its PCIe link (no /sys/class/infiniband/*/device/current_link_width)")
            continue
        found = []
        for x in links:
            signals = {
                "hca": x.hca,
                "link_width": x.width,
                "link_speed_gts": x.speed_gts,
                "max_link_width": x.max_width,
                "max_link_speed_gts": x.max_speed_gts,
            }
            found += [(x, e) for e in kb.matching("rdma.pcie", signals) if e.severity != "ok"]
        names = ", ".join(dict.fromkeys(f"{y.hca} at x{y.width} {y.speed_gts or '?'} GT/s" for y, _ in found))
        if not _bad(r, n, [e for _, e in found], names):
            r.ok(n, ", ".join(f"{x.hca} x{x.width} {x.speed_gts:g} GT/s" for x in links if x.speed_gts) or "ok")


@check("rdma.firmware", "ConnectX-7 firmware: the same on every node")
def rdma_firmware(ctx: Context, r: Report) -> None:
    kb = _list(ctx)
    fw = {}
    for n, f in ctx.facts.items():
        vals = sorted({f.traits.hca_links[h].fw for h in _hcas(ctx, n, f.traits) if f.traits.hca_links[h].fw})
        fw[n] = ",".join(vals)
    odd = odd_ones(fw, ctx.inventory.head.name)
    for n, f in ctx.facts.items():
        if not fw[n]:
            r.skip(n, "no HCA reported its firmware (no /sys/class/infiniband/*/fw_ver)")
            continue
        matched = [
            e
            for h in _hcas(ctx, n, f.traits)
            for e in kb.matching("rdma.firmware", {"hca": h, "fw": f.traits.hca_links[h].fw})
        ]
        if _bad(r, n, matched, f"firmware {fw[n]}"):
            continue
        if n in odd:
            r.warn(
                n,
                f"ConnectX-7 firmware {fw[n]} here, {odd[n]} on its peers",
                "bring every node to the same firmware (sudo fwupdmgr refresh && sudo fwupdmgr update, then reboot)",
            )
        else:
            r.ok(n, fw[n])


@check("gpu.clocks", "GPU clocks: no slowdown reason active")
def gpu_clocks(ctx: Context, r: Report) -> None:
    kb = _list(ctx)
    for n, f in ctx.facts.items():
        clocks = f.traits.gpu_clocks
        if not clocks:
            r.skip(n, "nvidia-smi did not report clocks and clock event reasons")
            continue
        said = None
        for g in clocks:
            signals = {
                "sm_mhz": g.sm_mhz,
                "sm_max_mhz": g.sm_max_mhz,
                "temperature_c": g.temperature_c,
                "pstate": g.pstate,
                "reasons": ",".join(g.reasons),
            }
            reasons = ",".join(g.reasons) or "none"
            what = f"SM {g.sm_mhz} of {g.sm_max_mhz} MHz, {g.temperature_c} C, {g.pstate}, reasons {reasons}"
            if _bad(r, n, kb.matching("gpu.clocks", signals), what):
                said = True
                break
            said = said or what
        if said is not True:
            r.ok(n, said)


@check("mem.earlyoom_args", "earlyoom's thresholds fit the swap it watches")
def mem_earlyoom_args(ctx: Context, r: Report) -> None:
    kb = _list(ctx)
    for n, f in ctx.facts.items():
        e = f.traits.earlyoom
        if not f.earlyoom or e is None:
            r.skip(n, "earlyoom is not running (mem.earlyoom says so)")
            continue
        swap = f.traits.swap_total_kb
        signals = {"mem_pct": e.mem_pct, "swap_pct": e.swap_pct, "swap_total_kb": swap, "args": e.args}
        what = f"earlyoom -m {e.mem_pct:g} -s {e.swap_pct:g}" + (
            f" with {swap / 1024**2:.0f} GiB of swap" if swap else ", no swap"
        )
        if not _bad(r, n, kb.matching("mem.earlyoom_args", signals), what):
            r.ok(n, what)


@check("image.nccl", "The image's NCCL: not a build on the known-bad list")
def image_nccl(ctx: Context, r: Report) -> None:
    kb = _list(ctx)
    for n, f in ctx.facts.items():
        got = f.image_nccl
        if got is None:
            r.skip(n, "the node has no cluster image to read")
            continue
        if not got.version:
            r.skip(n, "the image carries no NCCL (a CPU engine)")
            continue
        said = f"NCCL {got.version} ({got.build} build)"
        signals = {"nccl_version": got.version, "nccl_build": got.build, "nodes": len(ctx.inventory.nodes)}
        if not _bad(r, n, kb.matching("image.nccl", signals), said):
            r.ok(n, said)


def image_reading(ctx: Context, node: str):
    """The image's reading (facts/image_nccl) for a node: its own, else the head's, else any node's,
    with the node it was read on; (None, None) where no node holds the image or its base."""
    readings = {n: f.image_nccl for n, f in ctx.facts.items() if f.image_nccl is not None}
    head = ctx.inventory.head.name
    src = node if node in readings else head if head in readings else next(iter(readings), None)
    return (src, readings[src]) if src is not None else (None, None)


@check("image.driver", "The image's CUDA: runs on each node's driver (natively or in compatibility mode)")
def image_driver(ctx: Context, r: Report) -> None:
    # facts/image_nccl.py reads the requirement once per image ID (NGC's convention or the CUDA base
    # images') and judges it as the field observes (issue 51): an image of the node driver's CUDA major
    # runs in compatibility mode (WARN: PTX JIT, vllm#47397), a newer major FAILs. A node that does not
    # hold the image yet (before `up` sends it) is judged by what the head (else a peer) read.
    for n, f in ctx.facts.items():
        src, found = image_reading(ctx, n)
        if found is None:
            r.skip(n, "no node holds the cluster image or its base to read")
            continue
        v = judge_driver(found, _driver(f), read_on="" if src == n else f" (read on {src})")
        if v.status == "fail":
            r.fail(n, v.detail, v.fix)
        elif v.status == "warn":
            r.warn(n, v.detail, v.fix)
        elif v.status == "ok":
            r.ok(n, v.detail)
        else:
            r.skip(n, v.detail)


@check("image.cuda_cache", "The CUDA driver's JIT cache: on in the serving container, so the compile cache keeps it")
def image_cuda_cache(ctx: Context, r: Report) -> None:
    # facts/image_nccl.py reads the image's CUDA_CACHE_DISABLE with its NCCL (once per image ID); the
    # profile's forwarded value replaces it in the container
    # what an image sets is the image's, by ID: a node that cannot be read (or lacks the image before
    # `up` sends it) is judged by what another read, as image.driver is
    forwarded = ctx.expect.forwarded_env.get("CUDA_CACHE_DISABLE")
    for n in ctx.facts:
        src, found = image_reading(ctx, n)
        if found is None:
            r.skip(n, "no node holds the cluster image or its base to read")
            continue
        on, said = cuda_cache(found, forwarded)
        said += "" if src == n else f" (read on {src})"
        if on:
            r.ok(n, said)
        else:
            r.warn(
                n,
                said,
                "forward CUDA_CACHE_DISABLE=0 in the profile's [env.forward] (the cache sits in the key's own "
                "folder, never shared with another image or flags), or leave it where the JIT cache is known to "
                "break this image",
            )


# A fatal (uncorrectable) PCIe error on a ConnectX-7 function or the port above it: the recovery that
# follows can wedge in mlx5_pci_slot_reset and soft-lock the host for hours
# (MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark#146: both CX-7 devices lost, the head rebooted).
# The counters are the kernel's, since boot (Documentation/ABI/testing/sysfs-bus-pci-devices-aer_stats).
AER_SOURCE = "MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark#146"
AER_FIX = (
    "read the kernel's account (journalctl -k | grep -iE 'aer|mlx5'), reseat or replace the QSFP cable, "
    "then power the node off and on (the counters start again at boot); a fatal count that comes back is "
    "a hardware fault for the vendor"
)


def aer_rows(t: Traits) -> list:
    """The node's CX7 PCI devices with AER counters, functions first."""
    return sorted((x for x in t.hca_aer.values() if x.known()), key=lambda x: (x.role != "function", x.pci))


def aer_text(x) -> str:
    def n(v):
        return "?" if v is None else str(v)

    return f"{x.hca} {x.role} {x.pci}: fatal {n(x.fatal)}, non-fatal {n(x.nonfatal)}, correctable {n(x.correctable)}"


@check("rdma.aer", "ConnectX-7 PCIe AER counters: no fatal or non-fatal error since boot")
def rdma_aer(ctx: Context, r: Report) -> None:
    for n, f in ctx.facts.items():
        rows = aer_rows(f.traits)
        if not rows:
            r.skip(n, "no HCA's PCI device reported AER counters (no /sys/class/infiniband/*/device/aer_dev_fatal)")
            continue
        fatal = [x for x in rows if x.fatal]
        nonfatal = [x for x in rows if x.nonfatal]
        if fatal:
            r.fail(
                n,
                "fatal PCIe errors on the ConnectX-7: "
                + "; ".join(aer_text(x) for x in fatal)
                + f" (a fatal AER recovery soft-locked a Spark head: {AER_SOURCE})",
                AER_FIX,
            )
        elif nonfatal:
            r.warn(n, "non-fatal PCIe errors on the ConnectX-7: " + "; ".join(aer_text(x) for x in nonfatal), AER_FIX)
        else:
            cor = sum(x.correctable or 0 for x in rows)
            r.ok(n, f"{len(rows)} PCI device(s), no fatal or non-fatal error; {cor} correctable")
