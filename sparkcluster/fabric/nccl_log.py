"""NCCL's INFO output, read: per process, the NCCL version, the network it chose, the HCAs or
interfaces it uses, the transport of every channel connection and what failed; plus the fabric
probe's result lines found among them.

Pure: text in, dataclasses out. Input is one rank's log or several ranks' interleaved (torchrun's
stdout, a container's log, an NCCL_DEBUG_FILE). Lines are grouped by `host:pid`, not by the `[N]`
NCCL prints: that number is the CUDA device, and two ranks on two nodes (or on one GPU) both
print `[0]`. The rank itself comes from NCCL's own init line.

Formats, as NCCL 2.28 prints them (src/transport/net_ib/init.cc, connect.cc, net_socket.cc,
transport/*.cc; checked against the real logs in tests/captured/nccl/):
  host:pid:tid [dev] NCCL INFO NCCL version 2.28.9+cuda13.0
  ... NCCL INFO Using network IB | Socket
  ... NCCL INFO NET/IB : Using [0]rocep1s0f1:1/RoCE [1]roceP2p1s0f1:1/RoCE [RO]; OOB enp1s0f1np1:10.0.0.1<0>
      (a device may carry a rail and plane, `[0]mlx5_0:1:2/IB`; "No device found." when none)
  ... NCCL INFO NET/IB: NCCL Dev 0 IbDev 0 Port 1 qpn 123 mtu 5 GID 3 (0/...)   (RoCE: the GID index)
  ... NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0> [1]...
  ... NCCL INFO Channel 00/0 : 1[1] -> 0[0] [receive] via NET/Socket/0 | NET/IB/0/GDRDMA | P2P/CUMEM | SHM/direct/direct
  [timestamp] host:pid:tid [dev] file.cc:379 NCCL WARN Failed to initialize any NET plugin
  host:pid:tid [dev] misc/ibvwrap.cc:380 (wrap_ibv_modify_qp) NCCL WARN Call to ibv_modify_qp failed ...
      (newer NCCL names the function: tests/captured/nccl/published-modify-qp-61-spark-ring.txt)
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

MARKER = "SPARKCLUSTER_FABRIC "  # the probe's prefix (sparkcluster/node/fabric_probe.py)

_LINE = re.compile(
    r"^(?:\[[^\]]*\]\s+)?(?P<host>[^\s:]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] "
    r"(?:(?P<src>\S+) (?:\(\w+\) )?)?NCCL (?P<level>INFO|WARN|TRACE) (?P<msg>.*)$"
)
_VERSION = re.compile(r"^NCCL version (\S+)")
_NETWORK = re.compile(r"^Using network (\S+)")
_IB_USING = re.compile(r"^NET/IB : Using(?P<devs>(?: \[\d+\]\S+)*)\s*(?:\[RO\])?; OOB (?P<oob>\S+)")
_IB_DEV = re.compile(r"\[(\d+)\]([^:\s]+):(\d+)(?::[^/\s]*)?/(\S+)")
_IB_GID = re.compile(
    r"^NET/IB: (?:NCCL (?:Merged)?Dev \d+ )?(?:Ib)?Dev (\d+) Port (\d+) qpn \d+ "
    r"mtu (\d+) GID (-?\d+)"
)
_SOCK_USING = re.compile(r"^NET/Socket : Using((?: \[\d+\]\S+)+)")
_SOCK_IF = re.compile(r"\[(\d+)\]([^:\s]+):(\S+?)<\d+>")
_VIA = re.compile(r"^Channel \d+/\d+ : \d+\[\d+\] -> \d+\[\d+\] (?:\[\w+\] )?via (\S+)")
_INIT = re.compile(r"^ncclCommInitRank\w* comm \S+ rank (\d+) nranks (\d+) cudaDev (\d+)")
_NODES = re.compile(r"^comm \S+ rank (\d+) nRanks (\d+) nNodes (\d+)")
_ENV = re.compile(r"^(NCCL_[A-Z_]+) set (?:by environment )?to (\S+?)\.?$")
_PLUGIN_FAIL = re.compile(r"^Failed to initialize NET plugin (\S+)")
_PY_ERROR = re.compile(
    r"(?:^\[rank\d+\]: )?(torch\.distributed\.\w+Error|\w*DistBackendError|"
    r"\w*DistNetworkError|\w*DistStoreError): (.*)$"
)


@dataclass
class IbDevice:
    index: int
    name: str  # e.g. rocep1s0f1 (NCCL adds "_dma" for a data-direct twin)
    port: int
    link: str  # "RoCE" or "IB"


@dataclass
class SocketIf:
    index: int
    name: str
    address: str


@dataclass
class RankLog:
    """What one NCCL process said. `rank` is None until NCCL's init line names it."""

    host: str
    pid: int
    rank: int | None = None
    nranks: int | None = None
    nnodes: int | None = None
    cuda_dev: int | None = None
    version: str | None = None
    network: str | None = None  # "IB" or "Socket": the net plugin NCCL assigned
    ib_devices: list[IbDevice] = field(default_factory=list)
    ib_oob: str | None = None  # "eth0:10.0.0.1<0>"
    ib_no_device: bool = False  # "NET/IB : No device found."
    gid_indexes: dict[str, int] = field(default_factory=dict)  # IB device name -> GID index used
    socket_ifs: list[SocketIf] = field(default_factory=list)
    transports: set[str] = field(default_factory=set)  # "NET/IB/0", "P2P/CUMEM", ...
    env: dict[str, str] = field(default_factory=dict)  # NCCL_* NCCL reported as set
    plugin_failures: list[str] = field(default_factory=list)  # "IB" from "Failed to initialize NET plugin IB"
    warnings: list[str] = field(default_factory=list)  # the text of every NCCL WARN
    init_complete: bool = False

    def kinds(self) -> set[str]:
        """The transports reduced to their kind: NET/IB, NET/Socket, P2P, SHM, ..."""
        return {transport_kind(t) for t in self.transports}

    def summary(self) -> str:
        """One line: what this rank moved data over, e.g. 'NET/IB rocep1s0f1,roceP2p1s0f1 GID 3'."""
        parts = []
        for kind in sorted(self.kinds()):
            if kind == "NET/IB":
                names = ",".join(d.name for d in self.ib_devices) or "?"
                gids = sorted(set(self.gid_indexes.values()))
                parts.append(f"NET/IB {names}" + (f" GID {','.join(map(str, gids))}" if gids else ""))
            elif kind == "NET/Socket":
                parts.append("NET/Socket " + (",".join(f"{s.name}:{s.address}" for s in self.socket_ifs) or "?"))
            else:
                parts.append(kind)
        if not parts and self.network:
            parts.append(f"network {self.network} (no connection seen)")
        return "; ".join(parts) or "no transport seen"


@dataclass
class ProbeResult:
    op: str
    nbytes: int
    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    ranks: int | None = None
    backend: str | None = None
    src: int | None = None  # p2p: the sending rank
    dst: int | None = None  # p2p: the receiving rank


@dataclass
class FabricLog:
    """One log's worth: every NCCL process in it, the probe's results, and how the probe ended."""

    ranks: list[RankLog] = field(default_factory=list)
    results: list[ProbeResult] = field(default_factory=list)
    done: bool = False
    probe_errors: list[str] = field(default_factory=list)  # the probe's own error lines
    python_errors: list[str] = field(default_factory=list)  # "DistBackendError: ..." and kin

    def failures(self) -> list[str]:
        """NCCL's own words for what went wrong (its WARN lines), each once; where no NET plugin
        could start, the reasons NCCL gave for each ("NET/IB : No device found") follow."""
        seen: list[str] = []
        for r in self.ranks:
            texts = list(r.warnings)
            if any("Failed to initialize any NET plugin" in w for w in r.warnings):
                texts += [f"Failed to initialize NET plugin {p}" for p in r.plugin_failures]
                texts += ["NET/IB : No device found"] if r.ib_no_device else []
            seen += [t for t in texts if t not in seen]
        return seen


def transport_kind(transport: str) -> str:
    """'NET/IB/0/GDRDMA' -> 'NET/IB'; 'P2P/CUMEM' -> 'P2P'; 'SHM/direct/direct' -> 'SHM'."""
    parts = transport.split("/")
    return "/".join(parts[:2]) if parts[0] in ("NET", "COLLNET") and len(parts) > 1 else parts[0]


def result_line(line: str) -> dict | None:
    """The probe's JSON from one line: marked (`SPARKCLUSTER_FABRIC {...}`) or a bare JSON object
    with an "op" (the captured logs' earlier probe printed those)."""
    text = line.strip()
    if text.startswith(MARKER):
        text = text[len(MARKER) :]
    elif not (text.startswith("{") and '"op"' in text):
        return None
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def _result(obj: dict) -> ProbeResult | None:
    try:
        return ProbeResult(
            op=str(obj["op"]),
            nbytes=int(obj["bytes"]),
            time_us=float(obj["time_us"]),
            algbw_gbps=float(obj["algbw_GBps"]),
            busbw_gbps=float(obj["busbw_GBps"]),
            ranks=obj.get("ranks"),
            backend=obj.get("backend"),
            src=obj.get("src"),
            dst=obj.get("dst"),
        )
    except (KeyError, TypeError, ValueError):
        return None


def _read_info(r: RankLog, msg: str) -> None:
    """One INFO message into the rank's record (first match wins; most lines match nothing)."""
    if m := _VIA.match(msg):
        r.transports.add(m.group(1))
    elif m := _VERSION.match(msg):
        r.version = m.group(1)
    elif m := _NETWORK.match(msg):
        r.network = m.group(1)
    elif m := _IB_USING.match(msg):
        r.ib_devices = [IbDevice(int(i), n, int(p), link) for i, n, p, link in _IB_DEV.findall(m.group("devs"))]
        r.ib_oob = m.group("oob")
    elif msg.startswith("NET/IB : No device found"):
        r.ib_no_device = True
    elif m := _IB_GID.match(msg):
        ibdev = int(m.group(1))
        name = next((d.name for d in r.ib_devices if d.index == ibdev), str(ibdev))
        r.gid_indexes[name] = int(m.group(4))
    elif m := _SOCK_USING.match(msg):
        r.socket_ifs = [SocketIf(int(i), n, a) for i, n, a in _SOCK_IF.findall(m.group(1))]
    elif m := _INIT.match(msg):
        r.rank, r.nranks, r.cuda_dev = int(m.group(1)), int(m.group(2)), int(m.group(3))
        r.init_complete = r.init_complete or msg.endswith("Init COMPLETE")
    elif m := _NODES.match(msg):
        r.rank, r.nranks, r.nnodes = int(m.group(1)), int(m.group(2)), int(m.group(3))
    elif m := _PLUGIN_FAIL.match(msg):
        if m.group(1) not in r.plugin_failures:
            r.plugin_failures.append(m.group(1))
    elif m := _ENV.match(msg):
        r.env[m.group(1)] = m.group(2)


def parse(text: str) -> FabricLog:
    """Every NCCL process in `text` (in order of first appearance) and the probe's lines."""
    out = FabricLog()
    by_proc: dict[tuple[str, int], RankLog] = {}
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if m:
            key = (m.group("host"), int(m.group("pid")))
            r = by_proc.get(key)
            if r is None:
                r = by_proc[key] = RankLog(host=key[0], pid=key[1])
                out.ranks.append(r)
            if m.group("level") == "WARN":
                r.warnings.append(m.group("msg").strip())
            elif m.group("level") == "INFO":
                _read_info(r, m.group("msg").strip())
            continue
        obj = result_line(line)
        if obj is not None:
            if obj.get("done"):
                out.done = True
            elif "error" in obj:
                out.probe_errors.append(str(obj["error"]))
            elif (res := _result(obj)) is not None:
                out.results.append(res)
            continue
        if (e := _PY_ERROR.search(line.strip())) and (msg := f"{e.group(1)}: {e.group(2)}") not in out.python_errors:
            out.python_errors.append(msg)
    return out


def parse_many(texts: list[str]) -> FabricLog:
    """Several logs of one node (one file per rank) read as one."""
    merged = FabricLog()
    for text in texts:
        one = parse(text)
        merged.ranks += one.ranks
        merged.results += one.results
        merged.done = merged.done or one.done
        merged.probe_errors += one.probe_errors
        merged.python_errors += [e for e in one.python_errors if e not in merged.python_errors]
    return merged


def largest(results: list[ProbeResult], op: str = "all_gather") -> ProbeResult | None:
    """The result of `op` at its largest size (the figure the verdict judges)."""
    of_op = [r for r in results if r.op == op]
    return max(of_op, key=lambda r: r.nbytes) if of_op else None
