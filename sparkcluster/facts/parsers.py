"""Pure parsers from the text real commands print to typed values. Tested from captured output."""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass, field
from datetime import datetime

from sparkcluster.movement.layers import ImageLayers, sizes_from_history
from sparkcluster.node import readings
from sparkcluster.remote.engine_api import EngineApi


def last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else ""


def json_list(text: str) -> list:
    # stderr shares the stream (2>&1): with the daemon down, `docker ps ... ; echo '[]'` prints
    # "Cannot connect to the Docker daemon ..." before the JSON. Parse from the first JSON line.
    lines = text.strip().splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith(("[", "{"))), None)
    if start is None:
        return []
    value = json.loads("\n".join(lines[start:]))
    return value if isinstance(value, list) else [value]


def json_object(text: str) -> dict | None:
    """A JSON object, or None for anything else (empty, caught mid-write, not an object)."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


# --- nvidia-smi ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gpu:
    name: str
    driver: str
    memory_total: str  # "[N/A]" on GB10: unified memory, not an error
    compute_cap: str


def nvidia_smi_csv(text: str) -> list[Gpu]:
    """`nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader`"""
    gpus = []
    for line in text.strip().splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) >= 4:
            gpus.append(Gpu(cols[0], cols[1], cols[2], cols[3]))
    return gpus


# --- docker -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DockerInfo:
    server_version: str
    root_dir: str
    runtimes: tuple[str, ...]
    default_runtime: str
    # [key, value] pairs; the containerd image store shows its snapshotter here (transfer.elides)
    driver_status: tuple[tuple[str, str], ...] = ()


def docker_info(text: str) -> DockerInfo:
    # warnings (e.g. "WARNING: No swap limit support") may share the stream with the JSON line
    d = json.loads(next(ln for ln in text.splitlines() if ln.lstrip().startswith("{")))
    return DockerInfo(
        server_version=d.get("ServerVersion", ""),
        root_dir=d.get("DockerRootDir", ""),
        runtimes=tuple(sorted((d.get("Runtimes") or {}).keys())),
        default_runtime=d.get("DefaultRuntime", ""),
        driver_status=tuple(tuple(str(x) for x in p) for p in (d.get("DriverStatus") or []) if isinstance(p, list)),
    )


def docker_api(text: str) -> EngineApi | None:
    """`docker version --format '{{json .Server}}'`: the engine's release and API range, or None when
    the engine did not say (the line is the CLI's error, or `null` from a CLI that reached no engine)."""
    for ln in text.splitlines():
        if ln.lstrip().startswith("{"):
            try:
                return EngineApi.from_version(json.loads(ln))
            except ValueError:
                return None
    return None


def image_layers(text: str) -> ImageLayers | None:
    """`probes.image_layers` output: "<id> <json diff IDs>", then history sizes oldest first."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines or not lines[0].startswith("sha256:"):
        return None  # a warning or an error instead: no layers known, the whole image is the estimate
    image_id, _, layers_json = lines[0].partition(" ")
    try:
        layers = tuple(json.loads(layers_json) or [])
    except ValueError:
        return None
    hist = [int(x) for x in lines[1:] if x.isdigit()]
    return ImageLayers(image_id, layers, sizes_from_history(hist, len(layers)))


def layer_chains(text: str) -> list[list[str]]:
    out = []
    for ln in text.splitlines():
        ln = ln.strip()
        if ln.startswith("["):
            try:
                out.append(list(json.loads(ln)))
            except ValueError:  # a cut line: that image's layers are not credited
                continue
        elif ln == "null":  # an image without layers
            out.append([])
    return out


@dataclass(frozen=True)
class Container:
    id: str
    name: str
    image: str
    state: str
    command: str
    labels: dict[str, str]


def _labels(text: str) -> dict[str, str]:
    out = {}
    for part in (text or "").split(","):
        if "=" in part:
            k, _, v = part.partition("=")
            out[k] = v
    return out


def docker_ps_json(text: str) -> list[Container]:
    """`docker ps -a --no-trunc --format '{{json .}}'`: one JSON object per line."""
    out = []
    for line in text.strip().splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        d = json.loads(line)
        out.append(
            Container(
                d.get("ID", ""),
                d.get("Names", ""),
                d.get("Image", ""),
                d.get("State", ""),
                d.get("Command", "").strip('"'),
                _labels(d.get("Labels", "")),
            )
        )
    return out


# --- docker inspect -----------------------------------------------------------------------------

# The HostConfig flags every node's container must carry alike: the checks compare them across
# nodes and against what `container_spec.required_flags` states in the same form.
FLAG_KEYS = (
    "Devices",
    "CapAdd",
    "Ulimits",
    "NetworkMode",
    "IpcMode",
    "ShmSize",
    "DeviceRequests",
    "Memory",
    "Privileged",
)


@dataclass(frozen=True)
class ContainerInspect:
    """A container as `docker inspect` (or the Engine API's inspect) describes it, reduced to what
    sparkcluster reads. Built once, here, from the JSON; everything else reads these fields."""

    id: str = ""
    name: str = ""  # without docker's leading "/"
    image: str = ""  # Config.Image: the reference it was created from
    image_id: str = ""  # Image: the ID it runs
    labels: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)  # Config.Env: what its processes start with
    running: bool = False
    status: str = "unknown"  # State.Status: created, running, exited, ...
    started_at: str = ""  # RFC 3339
    exit_code: int | None = None
    restart_count: int = 0
    flags: dict[str, object] = field(default_factory=dict)  # HostConfig's FLAG_KEYS, normalised


def container_inspect(d: dict) -> ContainerInspect:
    """One container of `docker inspect`'s JSON list (or `APIClient.inspect_container`'s dict)."""
    config, state = d.get("Config") or {}, d.get("State") or {}
    return ContainerInspect(
        id=d.get("Id", ""),
        name=d.get("Name", "").lstrip("/"),
        image=config.get("Image", ""),
        image_id=d.get("Image", ""),
        labels=dict(config.get("Labels") or {}),
        env=dict(e.split("=", 1) for e in (config.get("Env") or []) if "=" in e),
        running=bool(state.get("Running")),
        status=state.get("Status", "unknown"),
        started_at=state.get("StartedAt", ""),
        exit_code=state.get("ExitCode"),
        restart_count=int(d.get("RestartCount") or 0),
        flags=_flags(d.get("HostConfig") or {}),
    )


def _flags(hc: dict) -> dict[str, object]:
    flags = {k: hc.get(k) for k in FLAG_KEYS}
    flags["Devices"] = sorted((d.get("PathOnHost"), d.get("PathInContainer")) for d in (flags["Devices"] or []))
    # the docker CLI stores --cap-add=IPC_LOCK as "CAP_IPC_LOCK", the Engine API as given: same flag
    flags["CapAdd"] = sorted(c.upper().removeprefix("CAP_") for c in (flags["CapAdd"] or []))
    flags["Ulimits"] = sorted((u.get("Name"), u.get("Soft"), u.get("Hard")) for u in (flags["Ulimits"] or []))
    flags["DeviceRequests"] = sorted(
        str(sorted((k, str(v)) for k, v in d.items())) for d in (flags["DeviceRequests"] or [])
    )
    return flags


def docker_inspect_json(text: str) -> list[ContainerInspect]:
    """`docker inspect ID...` (a JSON list; `[]` when there is none)."""
    return [container_inspect(d) for d in json_list(text)]


# --- network ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Address:
    ip: ipaddress.IPv4Address
    network: ipaddress.IPv4Network


@dataclass
class Interface:
    name: str
    mtu: int
    up: bool  # administratively up (flag UP)
    lower_up: bool  # LOWER_UP: the link below is up
    operstate: str
    addresses: list[Address] = field(default_factory=list)
    carrier: bool | None = None
    speed_mbps: int | None = None
    mac: str = ""  # link/ether address: tells a cluster node's port from a third machine's


def ip_addr_json(text: str) -> dict[str, Interface]:
    """`ip -j addr show`"""
    out = {}
    for d in json.loads(text or "[]"):
        flags = d.get("flags", [])
        iface = Interface(
            d["ifname"],
            int(d.get("mtu", 0)),
            "UP" in flags,
            "LOWER_UP" in flags,
            d.get("operstate", "UNKNOWN"),
            mac=str(d.get("address", "")).lower(),
        )
        for a in d.get("addr_info", []):
            if a.get("family") == "inet":
                net = ipaddress.IPv4Network(f"{a['local']}/{a['prefixlen']}", strict=False)
                iface.addresses.append(Address(ipaddress.IPv4Address(a["local"]), net))
        out[iface.name] = iface
    return out


def carrier_lines(text: str) -> list[tuple[str, bool | None, int | None]]:
    """Lines of `<ifname> <carrier 0|1|-> <speed Mb/s|-1|->`."""
    out = []
    for line in text.strip().splitlines():
        parts = line.split()
        if len(parts) != 3:
            continue
        name, carrier, speed = parts
        c = None if carrier == "-" else carrier == "1"
        s = int(speed) if speed.lstrip("-").isdigit() and int(speed) > 0 else None
        out.append((name, c, s))
    return out


@dataclass(frozen=True)
class Hca:
    name: str
    state: str  # "4: ACTIVE"
    netdevs: tuple[str, ...]

    @property
    def active(self) -> bool:
        return self.state.strip().endswith("ACTIVE") and self.state.strip().startswith("4")


def hca_lines(text: str) -> dict[str, Hca]:
    """Lines of `<hca>|<ports/1/state>|<netdev> <netdev>`."""
    out = {}
    for line in text.strip().splitlines():
        parts = line.split("|")
        if len(parts) != 3:
            continue
        out[parts[0]] = Hca(parts[0], parts[1].strip(), tuple(parts[2].split()))
    return out


_IBSTAT_STATE = {"active": "4: ACTIVE", "down": "1: DOWN", "init": "2: INIT", "armed": "3: ARMED"}


def ibstat_states(text: str) -> dict[str, str]:
    """`ibstat`: each CA's port 1 state in sysfs form ("4: ACTIVE"), so owners' published output
    can be judged by the same checks as what the probe reads."""
    out, ca, port = {}, None, None
    for line in text.splitlines():
        m = re.match(r"^CA '([^']+)'", line)
        if m:
            ca, port = m.group(1), None
            continue
        s = line.strip()
        if s.startswith("Port ") and s.endswith(":"):
            port = s[5:-1]
        elif ca and port == "1" and s.startswith("State:"):
            v = s.split(":", 1)[1].strip()
            out[ca] = _IBSTAT_STATE.get(v.lower(), v)
    return out


@dataclass(frozen=True)
class Gid:
    hca: str
    index: int
    gid: str  # "0000:0000:0000:0000:0000:ffff:c613:0201"
    type: str  # "RoCE v2", "IB/RoCE v1"
    ndev: str  # the netdev the entry belongs to

    @property
    def ipv4(self) -> ipaddress.IPv4Address | None:
        """The IPv4 address of an IPv4-mapped GID (::ffff:a.b.c.d), else None."""
        try:
            ip = ipaddress.IPv6Address(self.gid)
        except ValueError:
            return None
        return ip.ipv4_mapped

    @property
    def roce_v2(self) -> bool:
        return self.type.strip().lower() == "roce v2"


def gid_lines(text: str) -> dict[str, list[Gid]]:
    """Lines of `<hca>|<index>|<gid>|<gid_attrs/types/N>|<gid_attrs/ndevs/N>`, per HCA in index order."""
    out: dict[str, list[Gid]] = {}
    for line in text.strip().splitlines():
        parts = line.split("|")
        if len(parts) != 5 or not parts[1].isdigit():
            continue
        out.setdefault(parts[0], []).append(
            Gid(parts[0], int(parts[1]), parts[2].strip(), parts[3].strip(), parts[4].strip())
        )
    for gids in out.values():
        gids.sort(key=lambda g: g.index)
    return out


def default_route_devs(text: str) -> list[str]:
    """`ip -j route show default`: the interface(s) the default route(s) leave by."""
    try:
        routes = json.loads(text or "[]")
    except json.JSONDecodeError:
        return []
    return [r["dev"] for r in routes if isinstance(r, dict) and r.get("dev")]


def neigh_mac(text: str) -> str:
    """`ip neigh show to IP dev IF`: the peer's MAC, "" when unresolved (FAILED/INCOMPLETE)."""
    m = re.search(r"\blladdr\s+([0-9a-fA-F:]{17})\b", text)
    return m.group(1).lower() if m else ""


@dataclass(frozen=True)
class Listener:
    address: str
    port: int
    process: str
    pid: int | None
    container: str  # full container id from the process's cgroup, "" when on the host


_SS = re.compile(
    r"^\S+\s+\d+\s+\d+\s+(?P<local>\S+)\s+\S+"
    r"(?:\s+users:\(\(\"(?P<proc>[^\"]*)\",pid=(?P<pid>\d+)[^)]*\)[^ ]*)?"
    r".*?(?:container=(?P<cid>[0-9a-f]*))?$"
)


def ss_listeners(text: str) -> list[Listener]:
    """`ss -Htlnp` lines, each followed by ` container=<id>` (see facts.probe_script)."""
    out = []
    for line in text.strip().splitlines():
        m = _SS.match(line.strip())
        if not m:
            continue
        local = m.group("local")
        addr, _, port = local.rpartition(":")
        if not port.isdigit():
            continue
        out.append(
            Listener(
                addr,
                int(port),
                m.group("proc") or "?",
                int(m.group("pid")) if m.group("pid") else None,
                m.group("cid") or "",
            )
        )
    return out


# --- memory and disk ----------------------------------------------------------------------------


@dataclass(frozen=True)
class MemInfo:
    total: int  # bytes
    available: int
    free: int


def meminfo(text: str) -> MemInfo:
    vals = readings.meminfo(text)  # the node agent's own reader
    return MemInfo(vals.get("MemTotal", 0), vals.get("MemAvailable", 0), vals.get("MemFree", 0))


@dataclass(frozen=True)
class Proc:
    """One of a node's largest processes by resident memory: who holds MemAvailable away from a new
    deployment, ours or not. `container`: the full ID of the Docker container it runs in, if any."""

    pid: int
    rss: int  # bytes
    command: str
    container: str | None


_CONTAINER_ID = re.compile(r"(?<![0-9a-f])([0-9a-f]{64})(?![0-9a-f])")


def ps_rss(text: str) -> list[Proc]:
    """`ps -eo pid=,rss=,comm=,cgroup= --sort=-rss` (procps: RSS in KiB; the cgroup column is
    /proc/PID/cgroup's lines joined, in which Docker's cgroup of a container names its 64-hex ID,
    `/docker/ID` under cgroupfs or `docker-ID.scope` under systemd)."""
    out = []
    for line in text.splitlines():
        parts = line.split(None, 3)
        if len(parts) < 3 or not parts[0].isdigit() or not parts[1].isdigit():
            continue
        found = _CONTAINER_ID.search(parts[3]) if len(parts) > 3 else None
        out.append(Proc(int(parts[0]), int(parts[1]) * 1024, parts[2], found.group(1) if found else None))
    return out


@dataclass(frozen=True)
class Disk:
    mount: str
    size: int
    available: int


def df_lines(text: str) -> dict[str, Disk]:
    """`df -PB1 PATH...`: keyed by mount point."""
    out = {}
    for line in text.strip().splitlines():
        parts = line.split()
        if len(parts) >= 6 and parts[1].isdigit():
            out[parts[5]] = Disk(parts[5], int(parts[1]), int(parts[3]))
    return out


def ping_reason(text: str) -> str:
    """The line of ping's output that says why: "message too long, mtu=1500" beats the summary."""
    for line in text.splitlines():
        if "mtu=" in line or "too long" in line or "unreachable" in line.lower():
            return line.strip()
    return last_line(text)


@dataclass(frozen=True)
class PingResult:
    netdev: str
    peer_node: str
    peer_ip: str
    size: int
    ok: bool
    detail: str
    command: str
    peer_mac: str = ""  # who answered, from the neighbour table after the ping


def uptime_and_clock(text: str) -> tuple[float | None, float | None]:
    """`cat /proc/uptime; date +%s.%N`: seconds since boot, and the node's clock (epoch seconds)."""
    lines = text.split("\n")

    def num(i: int, word: int) -> float | None:
        try:
            return float(lines[i].split()[word])
        except (IndexError, ValueError):
            return None

    return num(0, 0), num(1, 0)


def rfc3339(text: str) -> float | None:
    """Docker's timestamps (`2026-11-22T07:56:19.336780425Z`, nanoseconds) as epoch seconds; None
    for empty or docker's zero time."""
    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", text.strip())
    if not m or m.group(1).startswith("0001-"):
        return None
    tz = "+00:00" if m.group(3) == "Z" else m.group(3)
    base = datetime.fromisoformat(m.group(1) + tz).timestamp()
    return base + (float("0." + m.group(2)) if m.group(2) else 0.0)


# --- what drifts on a node (issue 39): kernel, CMA, BIOS, HCA links and firmware, GPU clocks, -----
# --- earlyoom's thresholds, DGX OS and the container toolkit --------------------------------------


def key_values(text: str) -> dict[str, str]:
    """`KEY=value` lines (`/etc/dgx-release`, os-release style; the BIOS probe's `name=value`), quotes dropped."""
    out = {}
    for line in text.splitlines():
        k, sep, v = line.partition("=")
        if sep and k.strip() and not k.lstrip().startswith("#"):
            out[k.strip()] = v.strip().strip('"').strip("'")
    return out


def meminfo_kib(text: str) -> dict[str, int]:
    """Lines of /proc/meminfo in kB, the kernel's unit, by name (`CmaTotal:  0 kB` -> {"CmaTotal": 0}):
    the one meminfo reader's bytes (node/readings), divided back."""
    return {k: v // 1024 for k, v in readings.meminfo(text).items()}


def dmi_date(text: str) -> str:
    """`/sys/class/dmi/id/bios_date` (SMBIOS: MM/DD/YYYY) as an ISO date, "" when it is not one."""
    m = re.fullmatch(r"(\d\d)/(\d\d)/(\d{4})", text.strip())
    return f"{m.group(3)}-{m.group(1)}-{m.group(2)}" if m else ""


@dataclass(frozen=True)
class HcaLink:
    """One HCA's PCIe link (its PCI device's sysfs attributes) and its firmware (`fw_ver`)."""

    hca: str
    width: int | None  # lanes now (current_link_width)
    speed_gts: float | None  # GT/s now (current_link_speed: "32.0 GT/s PCIe")
    max_width: int | None
    max_speed_gts: float | None
    fw: str


def _int(s: str) -> int | None:
    return int(s) if s.strip().isdigit() else None


def _gts(s: str) -> float | None:
    m = re.match(r"\s*([\d.]+)\s*GT/s", s)
    return float(m.group(1)) if m else None


def hca_link_lines(text: str) -> dict[str, HcaLink]:
    """`hca|current_link_width|current_link_speed|max_link_width|max_link_speed|fw_ver` per line."""
    out = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) != 6 or not parts[0]:
            continue
        name, w, s, mw, ms, fw = (p.strip() for p in parts)
        out[name] = HcaLink(name, _int(w), _gts(s), _int(mw), _gts(ms), fw)
    return out


@dataclass(frozen=True)
class PcieAer:
    """The AER counters of one PCI device under an HCA (issue 59): its own function ("function") or the
    port above it ("port": Linux counts errors "as seen by the device", so a faulty endpoint's errors
    can show at its root port only: Documentation/ABI/testing/sysfs-bus-pci-devices-aer_stats; the
    DGX Spark soft-lock of MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark#146 was reported at the
    root ports). None: the device has no such file (not AER capable, or a kernel without AER stats)."""

    hca: str
    role: str  # function | port
    pci: str  # its PCI address (the sysfs directory's name)
    correctable: int | None
    fatal: int | None
    nonfatal: int | None
    path: str = ""  # its sysfs directory

    def known(self) -> bool:
        return any(x is not None for x in (self.correctable, self.fatal, self.nonfatal))


def hca_aer_lines(text: str) -> dict[str, PcieAer]:
    """`hca|role|sysfs dir|TOTAL_ERR_COR|TOTAL_ERR_FATAL|TOTAL_ERR_NONFATAL` per line (facts.probes.HCA_AER),
    keyed by the device's sysfs directory: two HCAs on one function (or one port above several) count once."""
    out: dict[str, PcieAer] = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) != 6 or not parts[0] or not parts[2]:
            continue
        hca, role, path, cor, fatal, nonfatal = parts
        pci = path.rstrip("/").rsplit("/", 1)[-1]
        out.setdefault(path, PcieAer(hca, role, pci, _int(cor), _int(fatal), _int(nonfatal), path))
    return out


# nvmlClocksEventReasons (nvml.h): the bits of `clocks_event_reasons.active`
CLOCK_EVENT_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


@dataclass(frozen=True)
class GpuClocks:
    sm_mhz: int | None
    sm_max_mhz: int | None
    temperature_c: int | None
    pstate: str
    reasons: tuple[str, ...]  # names of the active clock event (throttle) reasons


def gpu_clocks_csv(text: str) -> list[GpuClocks]:
    """`nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,temperature.gpu,pstate,clocks_event_reasons.active
    --format=csv,noheader,nounits`: one line per GPU; `[N/A]` (or `[Not Supported]`) is None."""
    out = []
    for line in text.strip().splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) < 5:
            continue
        try:
            mask = int(cols[4], 16) if cols[4].lower().startswith("0x") else None
        except ValueError:
            mask = None
        reasons = tuple(n for bit, n in CLOCK_EVENT_REASONS.items() if mask is not None and mask & bit)
        out.append(GpuClocks(_int(cols[0]), _int(cols[1]), _int(cols[2]), cols[3], reasons))
    return out


@dataclass(frozen=True)
class EarlyoomArgs:
    """earlyoom's thresholds as it runs (its command line): SIGTERM below `mem_pct` % of memory
    available AND below `swap_pct` % of swap free (both at once: earlyoom's README)."""

    mem_pct: float
    swap_pct: float
    args: str


def _pct(args: list[str], short: str, long: str, default: float) -> float:
    for i, a in enumerate(args):
        val = None
        if a in (short, long) and i + 1 < len(args):
            val = args[i + 1]
        elif a.startswith(short) and len(a) > len(short) and not a.startswith("--"):
            val = a[len(short) :]
        elif a.startswith(long + "="):
            val = a[len(long) + 1 :]
        if val is not None:
            try:
                return float(val.split(",")[0])
            except ValueError:
                return default
    return default


def earlyoom_args(text: str) -> EarlyoomArgs:
    """earlyoom's /proc/PID/cmdline with its NULs made spaces (`earlyoom -m 2 -s 80 --prefer ...`);
    the defaults are 10 and 10 (earlyoom's README)."""
    args = text.strip().split()[1:]
    return EarlyoomArgs(_pct(args, "-m", "--mem", 10.0), _pct(args, "-s", "--swap", 10.0), " ".join(args))


def toolkit_version(text: str) -> str:
    """`nvidia-ctk --version`'s first line: "NVIDIA Container Toolkit CLI version 1.17.8" -> "1.17.8"."""
    m = re.search(r"version\s+(\S+)", text)
    return m.group(1) if m else ""


@dataclass
class Traits:
    """What a node is, as far as drift goes (issue 39): each a probe of its own; "" or None where the
    node did not say (a VM without DMI, a host without HCAs, a driver that lacks a field)."""

    kernel: str = ""
    cma_total_kb: int | None = None
    cma_free_kb: int | None = None
    swap_total_kb: int | None = None
    bios_vendor: str = ""
    bios_version: str = ""
    bios_date: str = ""  # ISO
    hca_links: dict[str, HcaLink] = field(default_factory=dict)
    hca_aer: dict[str, PcieAer] = field(default_factory=dict)  # PCI address -> its AER counters (issue 59)
    gpu_clocks: list[GpuClocks] = field(default_factory=list)
    earlyoom: EarlyoomArgs | None = None
    dgx_os: str = ""
    toolkit: str = ""
