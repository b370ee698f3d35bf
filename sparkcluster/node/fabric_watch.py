"""The fabric watched while serving (issue 75): on every node, its agent reads the data-plane HCAs'
ports (state, rate, the GID the profile's NCCL uses) and their PCIe AER counters (node/aer) at each
look, and judges them against what the same port showed before. The head's supervisor reads every
node's judgement (its own, each peer's report: `fabric_health`) and, where any is unhealthy, takes the
deployment out of the gateway's rotation (contract.Supervised.fabric_hold: a 503 with Retry-After, its
engine left running), until the same readings have been healthy for the profile's
`fabric_resume_polls` looks or an operator runs `sparkcluster fabric resume`.

What is unhealthy, each read from the files the mlx5 driver keeps per port
(/sys/class/infiniband/<hca>/ports/1: Documentation/ABI/stable/sysfs-class-infiniband):
  * `state` not "4: ACTIVE" (a port down, or initialising after a flap);
  * the GID at the inventory's gid_index all zeros or gone (an address lost on the netdev: the RoCE v2
    GID the driver derives from it goes with it);
  * `rate` below the highest this agent saw on the port (a link that renegotiated down);
  * an AER storm: any fatal or non-fatal error, or AER_STORM correctable errors, between two reads.

AER_STORM is sparkcluster's own bound, not a vendor's: a PCIe link that retrains logs correctable
errors in bursts of tens (tests/captured/kernel/aer-*: four lines a burst), and a storm is what keeps
the CPU in the AER handler (endlessm/linux PR #625: "so much that the mouse can't even be moved").

Standard library only: this file is shipped into every container."""

from __future__ import annotations

import os
import re

from . import aer

IB_ROOT = aer.IB_ROOT
ACTIVE = "4: ACTIVE"
AER_STORM = 50  # correctable AER errors between two reads of one node


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def rate_gbps(text: str | None) -> float | None:
    """`rate` as the driver writes it ("200 Gb/sec (2X NDR)") in Gb/s; None unreadable."""
    m = re.match(r"\s*([\d.]+)\s*Gb/sec", text or "")
    return float(m.group(1)) if m else None


def read_ports(hcas: list[str], gid_index: int | None, root: str = IB_ROOT) -> dict[str, dict]:
    """hca -> {state, rate_gbps, gid} of port 1 of each HCA named (gid: the GID at gid_index, "" gone;
    absent where no index is configured)."""
    out: dict[str, dict] = {}
    for hca in hcas:
        port = os.path.join(root, hca, "ports", "1")
        got = {"state": _read(os.path.join(port, "state")), "rate_gbps": rate_gbps(_read(os.path.join(port, "rate")))}
        if gid_index is not None:
            got["gid"] = _read(os.path.join(port, "gids", str(gid_index))) or ""
        out[hca] = got
    return out


def gid_lost(gid: str) -> bool:
    return not gid.replace(":", "").strip("0")


def judge(
    ports: dict[str, dict],
    best: dict[str, float],
    aer_before: dict | None,
    aer_now: dict,
    gid_index: int | None = None,
) -> list[str]:
    """What is unhealthy in one read (pure): each port against the best rate seen on it (`best`),
    the AER counters against the read before. [] when healthy."""
    out = []
    for hca, p in sorted(ports.items()):
        if p.get("state") is None:
            out.append(f"{hca}: port 1 is gone (no state in sysfs)")
            continue
        if p["state"] != ACTIVE:
            out.append(f"{hca}: port 1 is {p['state']}")
        if "gid" in p and gid_lost(p["gid"]):
            out.append(f"{hca}: GID index {gid_index} is empty (its address is gone)")
        rate, top = p.get("rate_gbps"), best.get(hca)
        if rate is not None and top is not None and rate < top:
            out.append(f"{hca}: speed dropped from {top:g} to {rate:g} Gb/s")
    rises = aer.rises(aer_before, aer_now)
    severe = [r for r in rises if r["severity"] != "correctable"]
    correctable = sum(r["now"] - r["before"] for r in rises if r["severity"] == "correctable")
    if severe:
        r = severe[0]
        out.append(f"AER: {r['severity']} PCIe error(s) on {r['hca']} ({r['role']} {r['pci']})")
    elif correctable >= AER_STORM:
        out.append(f"AER storm: {correctable} correctable PCIe errors since the last read")
    return out


class FabricWatch:
    """One node's judgement at each look (`look`), kept for its report (`last`)."""

    def __init__(self, hcas: list[str], gid_index: int | None, root: str = IB_ROOT, aer_read=aer.read):
        self.hcas, self.gid_index, self.root, self.aer_read = list(hcas), gid_index, root, aer_read
        self.best: dict[str, float] = {}
        self.aer_seen: dict | None = None
        self.last: dict = {"ok": True, "problems": []}

    def look(self) -> dict:
        ports = read_ports(self.hcas, self.gid_index, self.root)
        counters = self.aer_read()
        problems = judge(ports, self.best, self.aer_seen, counters, self.gid_index)
        self.aer_seen = counters
        for hca, p in ports.items():  # the best rate seen while the port was up
            if p.get("state") == ACTIVE and p.get("rate_gbps") is not None:
                self.best[hca] = max(self.best.get(hca, 0.0), p["rate_gbps"])
        self.last = {"ok": not problems, "problems": problems, "ports": ports}
        return self.last
