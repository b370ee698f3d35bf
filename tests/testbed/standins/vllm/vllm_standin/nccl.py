"""What NCCL would pick on one rank: bootstrap socket interface, IB HCAs, transport.

Pure functions over plain data (interface -> IPv4, HCA -> port -> (state, link layer)) plus
collectors that read them from sysfs, so unit tests can feed a fake tree.

List syntax as NCCL's NCCL_SOCKET_IFNAME / NCCL_IB_HCA: comma-separated prefixes, a leading `^`
excludes, a leading `=` (after any `^`) asks exact names; IB entries may carry `:port`.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field

NCCL_VERSION = "2.27.7"
ACTIVE = "4: ACTIVE"


class DistBackendError(RuntimeError):
    """Stands in for torch.distributed.DistBackendError (NCCL errors)."""


DistBackendError.__module__ = "torch.distributed"


def parse_list(spec: str) -> tuple[list[tuple[str, int]], bool, bool]:
    """-> (entries [(prefix, port or -1)], exclude, exact)."""
    s = spec.strip()
    exclude = s.startswith("^")
    if exclude:
        s = s[1:]
    exact = s.startswith("=")
    if exact:
        s = s[1:]
    entries: list[tuple[str, int]] = []
    for tok in s.split(","):
        tok = tok.strip()
        if not tok:
            continue
        name, _, port = tok.partition(":")
        try:
            p = int(port) if port else -1
        except ValueError:
            p = -1
        entries.append((name, p))
    return entries, exclude, exact


def _match(name: str, port: int, entries: list[tuple[str, int]], exact: bool) -> bool:
    for prefix, p in entries:
        if p != -1 and port != -1 and p != port:
            continue
        if (name == prefix) if exact else name.startswith(prefix):
            return True
    return False


def select_socket_ifaces(spec: str | None, ifaces: dict[str, str | None]) -> list[tuple[str, str]]:
    """Interfaces NCCL would use for sockets, in order: [(name, ip)]."""
    usable = [(n, ip) for n, ip in sorted(ifaces.items()) if ip]
    if spec:
        entries, exclude, exact = parse_list(spec)
        return [(n, ip) for n, ip in usable if _match(n, -1, entries, exact) != exclude]
    # NCCL's default search order: ib*, then anything but docker*/lo*/virbr*, then docker*, then lo*
    for default in ("ib", "^docker,lo,virbr", "docker", "lo"):
        entries, exclude, exact = parse_list(default)
        found = [(n, ip) for n, ip in usable if _match(n, -1, entries, exact) != exclude]
        if found:
            return found
    return []


@dataclass
class HcaPort:
    hca: str
    port: int
    state: str
    link_layer: str

    @property
    def label(self) -> str:
        kind = "RoCE" if self.link_layer.lower() == "ethernet" else "IB"
        return f"{self.hca}:{self.port}/{kind}"


def collect_hcas(ib_sysfs_dir: str = "/sys/class/infiniband") -> dict[str, dict[int, HcaPort]]:
    out: dict[str, dict[int, HcaPort]] = {}
    try:
        names = sorted(os.listdir(ib_sysfs_dir))
    except OSError:
        return out
    for hca in names:
        ports: dict[int, HcaPort] = {}
        pdir = os.path.join(ib_sysfs_dir, hca, "ports")
        try:
            pnames = sorted(os.listdir(pdir), key=lambda x: int(x) if x.isdigit() else 0)
        except OSError:
            pnames = []
        for p in pnames:
            if not p.isdigit():
                continue
            ports[int(p)] = HcaPort(
                hca,
                int(p),
                _read(os.path.join(pdir, p, "state")),
                _read(os.path.join(pdir, p, "link_layer")) or "Ethernet",
            )
        out[hca] = ports
    return out


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def has_uverbs(uverbs_dir: str = "/dev/infiniband") -> bool:
    return bool(glob.glob(os.path.join(uverbs_dir, "uverbs*")))


@dataclass
class NcclReport:
    lines: list[tuple[str, str]] = field(default_factory=list)  # (INFO|WARN, text)
    error: str | None = None
    transport: str = ""  # "IB" | "Socket"

    @property
    def ok(self) -> bool:
        return self.error is None


_NCCL_RESULTS = {
    "internal": (
        "internal error - please report this issue to the NCCL developers",
        "ncclInternalError: Internal check failed.",
    ),
    "invalid": (
        "invalid usage (run with NCCL_DEBUG=WARN for details)",
        "ncclInvalidUsage: This usually reflects invalid usage of NCCL library.",
    ),
    "remote": (
        "remote process exited or there was a network error",
        "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
    ),
}


def _nccl_error(kind: str, last_error: str) -> str:
    """torch's wording for a failed NCCL call (ProcessGroupNCCL)."""
    what, code = _NCCL_RESULTS[kind]
    return (
        "NCCL error in: /opt/pytorch/pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, "
        f"{what}, NCCL version {NCCL_VERSION}\n{code}\nLast error:\n{last_error}"
    )


def select_hcas(
    spec: str | None, hcas: dict[str, dict[int, HcaPort]]
) -> tuple[list[HcaPort], str | None, list[tuple[str, str]]]:
    """-> (selected active ports, error or None, log lines)."""
    lines: list[tuple[str, str]] = []
    all_ports = [p for ports in hcas.values() for p in ports.values()]
    if not spec:
        selected = [p for p in all_ports if p.state == ACTIVE]
        return selected, None, lines
    entries, exclude, exact = parse_list(spec)
    if exclude:
        selected = [p for p in all_ports if not _match(p.hca, p.port, entries, exact) and p.state == ACTIVE]
        return selected, None, lines
    selected = []
    for name, port in entries:
        matched = [p for p in all_ports if _match(p.hca, p.port, [(name, port)], exact)]
        if not matched:
            lines.append(("WARN", "NET/IB : No device found."))
            have = ", ".join(sorted(hcas)) or "none"
            want = f"{name}:{port}" if port != -1 else name
            return (
                [],
                _nccl_error(
                    "invalid",
                    f"NET/IB : No device found. NCCL_IB_HCA={spec!r} names {want}, which this node "
                    f"does not have (present in /sys/class/infiniband: {have})",
                ),
                lines,
            )
        for p in matched:
            if p.state != ACTIVE:
                lines.append(
                    ("WARN", f"NET/IB : {p.hca}:{p.port} port state is '{p.state or 'unknown'}', expected '{ACTIVE}'")
                )
                return (
                    [],
                    _nccl_error(
                        "remote",
                        f"NET/IB : ibv_modify_qp failed with 110 Connection timed out, on dev "
                        f"{p.hca}:{p.port}, curr state INIT, next state RTR "
                        f"(port state '{p.state or 'unknown'}', expected '{ACTIVE}')",
                    ),
                    lines,
                )
            if p not in selected:
                selected.append(p)
    return selected, None, lines


def nccl_report(
    env: dict[str, str], ifaces: dict[str, str | None], hcas: dict[str, dict[int, HcaPort]], uverbs: bool
) -> NcclReport:
    rep = NcclReport()
    socks = select_socket_ifaces(env.get("NCCL_SOCKET_IFNAME"), ifaces)
    if not socks:
        rep.lines.append(("WARN", "Bootstrap : no socket interface found"))
        have = ", ".join(n for n, ip in sorted(ifaces.items()) if ip) or "none"
        rep.error = _nccl_error(
            "internal",
            "Bootstrap : no socket interface found"
            + (
                f" (NCCL_SOCKET_IFNAME={env['NCCL_SOCKET_IFNAME']!r}; interfaces with an address on this node: {have})"
                if env.get("NCCL_SOCKET_IFNAME")
                else ""
            ),
        )
        return rep
    oob = f"{socks[0][0]}:{socks[0][1]}<0>"
    rep.lines.append(("INFO", f"Bootstrap : Using {oob}"))
    if env.get("NCCL_IB_DISABLE", "0") not in ("", "0"):
        rep.lines.append(("INFO", "NET/IB : Disabled (NCCL_IB_DISABLE)"))
        selected: list[HcaPort] = []
    else:
        selected, err, lines = select_hcas(env.get("NCCL_IB_HCA"), hcas)
        rep.lines.extend(lines)
        if err:
            rep.error = err
            return rep
        if not selected:
            rep.lines.append(("INFO", "NET/IB : No device found."))
    if selected and uverbs:
        devs = " ".join(f"[{i}]{p.label}" for i, p in enumerate(selected))
        rep.lines.append(("INFO", f"NET/IB : Using {devs} [RO]; OOB {oob}"))
        rep.transport = "IB"
    else:
        devs = " ".join(f"[{i}]{n}:{ip}<0>" for i, (n, ip) in enumerate(socks))
        rep.lines.append(("INFO", f"NET/Socket : Using {devs}"))
        rep.transport = "Socket"
    return rep
