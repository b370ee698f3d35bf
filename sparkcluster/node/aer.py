"""The ConnectX-7's PCIe AER counters on this node (issue 59), read where the agent runs: each HCA's
PCI function (`/sys/class/infiniband/<hca>/device`) and the port above it, the three files Linux
keeps per AER-capable device (`aer_dev_correctable`, `aer_dev_fatal`, `aer_dev_nonfatal`:
Documentation/ABI/testing/sysfs-bus-pci-devices-aer_stats). Each file lists a count per error type
and ends with its sum (`TOTAL_ERR_COR`, `TOTAL_ERR_FATAL`, `TOTAL_ERR_NONFATAL`); the counts start at
zero at boot and only rise.

Why: a fatal PCIe error on the CX7 and the recovery that follows soft-locked a Spark head for hours
(MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark#146, reported at the root ports above both CX-7
devices). The head's supervisor journals every rise it sees on any node (its own counters, each
peer's from its report), the agent exports them for Prometheus (node/metrics), and `doctor` judges
them (checks `rdma.aer`, from the same files through facts.probes.HCA_AER).

Standard library only: this file is shipped into every container."""

from __future__ import annotations

import os

IB_ROOT = "/sys/class/infiniband"
SEVERITIES = (("correctable", "aer_dev_correctable"), ("fatal", "aer_dev_fatal"), ("nonfatal", "aer_dev_nonfatal"))
AER_EVERY_S = 30.0  # the supervisor's read (a dozen small sysfs files; a rise is rare and stays counted)


def total(text: str) -> int | None:
    """One aer_dev_* file: its TOTAL_ERR_* line, else the sum of its counts; None when it has neither."""
    counts = []
    for line in text.splitlines():
        name, _, count = line.strip().rpartition(" ")
        if not name or not count.isdigit():
            continue
        if name.startswith("TOTAL_ERR_"):
            return int(count)
        counts.append(int(count))
    return sum(counts) if counts else None


def device(path: str, hca: str, role: str) -> dict | None:
    out: dict = {"hca": hca, "role": role, "pci": os.path.basename(path)}
    for severity, name in SEVERITIES:
        try:
            with open(os.path.join(path, name)) as f:
                out[severity] = total(f.read())
        except OSError:
            out[severity] = None
    return out if any(out[s] is not None for s, _ in SEVERITIES) else None


def read(root: str = IB_ROOT) -> dict[str, dict]:
    """sysfs path -> {hca, role (function | port), pci, correctable, fatal, nonfatal} for every HCA's
    PCI function and the port above it that has AER counters; {} where none has (no HCA, a kernel
    without AER statistics)."""
    out: dict[str, dict] = {}
    try:
        hcas = sorted(os.listdir(root))
    except OSError:
        return out
    for hca in hcas:
        fn = os.path.realpath(os.path.join(root, hca, "device"))
        for path, role in ((fn, "function"), (os.path.dirname(fn), "port")):
            if path in out:
                continue
            got = device(path, hca, role)
            if got is not None:
                out[path] = got
    return out


def rises(before: dict | None, now: dict) -> list[dict]:
    """What rose between two reads of one node (pure): one entry per device and severity, with the
    count before and now. The first read (`before` None) is no rise: counts since boot are doctor's."""
    if before is None:
        return []
    out = []
    for path, dev in sorted(now.items()):
        old = before.get(path) or {}
        for severity, _ in SEVERITIES:
            a, b = old.get(severity), dev.get(severity)
            if isinstance(a, int) and isinstance(b, int) and b > a:
                out.append(
                    {
                        "hca": dev.get("hca"),
                        "role": dev.get("role"),
                        "pci": dev.get("pci"),
                        "severity": severity,
                        "before": a,
                        "now": b,
                    }
                )
    return out
