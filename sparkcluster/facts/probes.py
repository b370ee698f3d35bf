"""What sparkcluster runs on a node to learn about it: small named probes (section name, command,
parser), one home for `facts` (doctor, up's preflight), `discover` (init) and `status`.

A probe's command is shell text run by bash on the node. It prints its output between markers
(`section`), so one script, one round trip, yields many probes. Every value that reaches a command
from outside (an interface name from the inventory, a peer address) is quoted with `shlex.quote`:
the tests run each builder locally against names with spaces, quotes, `$()` and `;`.
"""

from __future__ import annotations

import ipaddress
import shlex
from collections.abc import Callable
from dataclasses import dataclass

from sparkcluster.facts import parsers
from sparkcluster.node.sections import SECTION, section  # noqa: F401 (the probes' home names them)

# addresses a node may carry that another node cannot use to reach it: link-local addresses are
# picked per boot and share one /16 across every port; the docker bridge exists on every node
LINK_LOCAL = ipaddress.IPv4Network("169.254.0.0/16")
DOCKER_DEFAULT_BRIDGE = ipaddress.IPv4Network("172.17.0.0/16")

# a ConnectX-7 port's line rate on a Spark, in Mb/s (`/sys/class/net/<if>/speed`)
CX7_SPEED_MBPS = 200000


@dataclass(frozen=True)
class Section:
    rc: int
    out: str


def split_sections(text: str) -> dict[str, Section]:
    out: dict[str, Section] = {}
    name, buf = None, []
    for line in text.splitlines():
        if line.startswith(SECTION + " "):
            rest = line[len(SECTION) + 1 :]
            if " rc=" in rest and name is not None and rest.startswith(name + " rc="):
                out[name] = Section(int(rest.rsplit("rc=", 1)[1] or 1), "\n".join(buf))
                name, buf = None, []
            else:
                name, buf = rest.strip(), []
        elif name is not None:
            buf.append(line)
    return out


def in_containers(name: str, script: str, cluster_label: str, bound_s: int) -> str:
    """A section `name`: `script` (sh) run in each of this node's running containers carrying
    `cluster_label`, one bounded `docker exec` each, their outputs one after another."""
    docker = f"timeout -k 1 {bound_s} docker"
    return section(
        name,
        f"for c in $({docker} ps -q --filter label={shlex.quote(cluster_label)}); do "
        f"{docker} exec $c sh -c {shlex.quote(script)}; done; true",
    )


def read_containers(host, cluster_label: str, name: str, script: str, bound_s: int = 8, timeout: int = 20) -> str:
    """`in_containers` on one node (`host`: its SSH connection), in one round trip: the section's
    output, "" where nothing was read or the read did not finish."""
    got = split_sections(
        host.run(in_containers(name, script, cluster_label, bound_s), timeout=timeout, warn=True).stdout
    )
    sec = got.get(name)
    return sec.out if sec is not None and sec.rc == 0 else ""


@dataclass(frozen=True)
class Probe:
    """One named question to a node: the section it prints and the parser of that section."""

    name: str
    command: str
    parse: Callable[[str], object]

    def script(self) -> str:
        return section(self.name, self.command)


HOSTNAME = Probe("hostname", "hostname", lambda out: out.strip())
TIME = Probe("time", "date +%s.%N", lambda out: float(out.strip()) if out.strip() else None)
DOCKER = Probe("docker", "docker info --format '{{json .}}'", parsers.docker_info)
# the engine's release and the API range it accepts (remote/engine_api.py): the CLI negotiates, the SDK must
DOCKER_API = Probe("docker_api", "docker version --format '{{json .Server}}'", parsers.docker_api)
GPU_HOOK = Probe(
    "gpu_hook",
    "command -v nvidia-container-runtime-hook nvidia-ctk nvidia-container-runtime | head -1",
    lambda out: out.strip(),
)
MEMINFO = Probe("meminfo", "cat /proc/meminfo", parsers.meminfo)
EARLYOOM = Probe("earlyoom", "pgrep -x earlyoom", lambda out: True)
# the node's largest processes by resident memory, each with its cgroup (so its container): what a
# refusal for memory names as holding it, ours or not
PROCESSES = Probe("processes", "ps -eo pid=,rss=,comm=,cgroup= --sort=-rss | head -n 16", parsers.ps_rss)
SSHD_OOM = Probe(
    "sshd_oom",
    "cat /proc/$(pgrep -o -x sshd)/oom_score_adj",
    lambda out: int(out.strip()) if out.strip().lstrip("-").isdigit() else None,
)
CONTAINERS = Probe("containers", "docker ps -a --no-trunc --format '{{json .}}'", parsers.docker_ps_json)
RAY_SESSIONS = Probe("ray_sessions", "ls -d /tmp/ray/session_* 2>/dev/null", lambda out: out.split())
GPU = Probe(
    "gpu",
    "nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader",
    parsers.nvidia_smi_csv,
)
IP = Probe("ip", "ip -j addr show", parsers.ip_addr_json)
# each RoCE HCA: port 1 state and the netdev(s) it sits on (what `ibdev2netdev` prints, from sysfs)
HCA = Probe(
    "hca",
    'for d in /sys/class/infiniband/*; do [ -e "$d" ] || continue; '
    'printf \'%s|%s|%s\\n\' "${d##*/}" "$(cat "$d/ports/1/state" 2>/dev/null)" '
    "\"$(ls \"$d/device/net\" 2>/dev/null | tr '\\n' ' ')\"; done",
    parsers.hca_lines,
)
# each HCA's GID table: only the filled entries. A real table has 256 entries per port, mostly zero
# GIDs whose attribute files refuse to be read (EINVAL): `read` (a builtin) keeps it to no fork per entry.
GIDS = Probe(
    "gids",
    'for d in /sys/class/infiniband/*; do [ -e "$d" ] || continue; p="$d/ports/1"; '
    'for g in "$p"/gids/*; do [ -e "$g" ] || continue; n=${g##*/}; v=; read -r v 2>/dev/null < "$g"; '
    '[ -n "$v" ] && [ "$v" != 0000:0000:0000:0000:0000:0000:0000:0000 ] || continue; '
    't=; read -r t 2>/dev/null < "$p/gid_attrs/types/$n"; '
    'nd=; read -r nd 2>/dev/null < "$p/gid_attrs/ndevs/$n"; '
    'printf \'%s|%s|%s|%s|%s\\n\' "${d##*/}" "$n" "$v" "$t" "$nd"; '
    "done; done",
    parsers.gid_lines,
)
ROUTE = Probe("route", "ip -j route show default", parsers.default_route_devs)


def listeners(ports: list[int]) -> Probe:
    """Who listens on these TCP ports, each line with the container (from the cgroup) it runs in."""
    sel = " or ".join(f"sport = :{int(p)}" for p in ports)
    return Probe(
        "listeners",
        f"ss -Htlnp '( {sel} )' | while read -r l; do "
        "p=$(printf '%s' \"$l\" | sed -n 's/.*pid=\\([0-9]*\\).*/\\1/p'); "
        "c=$(grep -o -E '[0-9a-f]{64}' /proc/$p/cgroup 2>/dev/null | head -1); "
        'printf \'%s container=%s\\n\' "$l" "$c"; done',
        parsers.ss_listeners,
    )


def ours(label: str) -> Probe:
    """`docker inspect` of the containers carrying `label` (key=value), `[]` when none."""
    q = shlex.quote(label)
    return Probe(
        "ours",
        f"ids=$(docker ps -aq --filter label={q}); [ -z \"$ids\" ] && echo '[]' || docker inspect $ids",
        parsers.docker_inspect_json,
    )


def shell_path(p: str) -> str:
    """A path from the inventory as shell text: `~/rest` is the SSH user's home on that node."""
    if p == "~" or p.startswith("~/"):
        rest = p[2:]
        return '"$HOME"' + ("/" + shlex.quote(rest) if rest else "")
    return shlex.quote(p)


def disk(hf_cache: str) -> Probe:
    """df of docker's root and of the model cache (its nearest existing parent: nothing is created)."""
    return Probe(
        "disk",
        "d=$(docker info --format '{{.DockerRootDir}}' 2>/dev/null) && [ -d \"$d\" ] || d=/var/lib/docker; "
        'df -PB1 "$d"; '
        f'p={shell_path(hf_cache)}; while [ ! -e "$p" ]; do p=$(dirname "$p"); done; df -PB1 "$p"',
        parsers.df_lines,
    )


def carrier(ifnames: list[str]) -> Probe:
    """Carrier and speed of each named netdev (`-` when sysfs has no value)."""
    ifs = " ".join(shlex.quote(i) for i in dict.fromkeys(ifnames))
    return Probe(
        "carrier",
        f"for i in {ifs}; do printf '%s %s %s\\n' \"$i\" "
        '"$(cat "/sys/class/net/$i/carrier" 2>/dev/null || echo -)" '
        '"$(cat "/sys/class/net/$i/speed" 2>/dev/null || echo -)"; done',
        parsers.carrier_lines,
    )


def ping(netdev: str, peer_ip: str, size: int) -> Probe:
    """Path MTU: one unfragmentable ping of `size` payload bytes out of `netdev`."""
    cmd = shlex.join(["ping", "-M", "do", "-c", "1", "-W", "1", "-s", str(int(size)), "-I", netdev, peer_ip])
    return Probe(f"ping {netdev} {peer_ip}", cmd, parsers.ping_reason)


def neigh(netdev: str, peer_ip: str) -> Probe:
    """Who answered `peer_ip` on `netdev` (its MAC), read right after a ping filled the entry."""
    return Probe(
        f"neigh {netdev} {peer_ip}",
        shlex.join(["ip", "neigh", "show", "to", peer_ip, "dev", netdev]),
        parsers.neigh_mac,
    )


def script(probes: list[Probe]) -> str:
    return "\n".join(p.script() for p in probes) + "\n"


# The one way a probe's section is read: `value` (its parsed output when it exited 0), `output`
# (parsed whatever its exit: a loop over sysfs that found nothing still says so) and `failure` (why
# it failed). A section the output lacks reads as a command that was not found (127, nothing printed).
NOT_RUN = Section(127, "")


def reading(probe: Probe, sections: dict[str, Section], missing: Section = NOT_RUN) -> Section:
    return sections.get(probe.name, missing)


def value(probe: Probe, sections: dict[str, Section], default=None):
    """The parsed output of a probe that exited 0; `default` when it failed or did not run."""
    s = sections.get(probe.name)
    if s is None or s.rc != 0:
        return default
    return probe.parse(s.out)


def output(probe: Probe, sections: dict[str, Section], missing: Section = NOT_RUN):
    """The parsed output of a probe whatever its exit status (`missing`'s when it did not run)."""
    return probe.parse(reading(probe, sections, missing).out)


def failure(probe: Probe, sections: dict[str, Section], program: str = "") -> str:
    """Why a probe failed: its last line, else `program` and its exit status; "" when it exited 0."""
    s = reading(probe, sections)
    if s.rc == 0:
        return ""
    return parsers.last_line(s.out) or (f"{program} exited {s.rc}" if program else f"exited {s.rc}")


def image_id(ref: str) -> Probe:
    """The image's ID, when the node holds it."""
    return Probe("image", f"docker image inspect --format '{{{{.Id}}}}' {shlex.quote(ref)}", lambda out: out.strip())


def image_layers(name: str, ref: str) -> Probe:
    """One image's ID, its diff IDs bottom up (JSON) and `docker history` sizes in bytes, oldest
    first: what the image stage compares with the layers a worker holds. Exits 3 when absent."""
    img = shlex.quote(ref)
    return Probe(
        name,
        f"docker image inspect --format '{{{{.Id}}}} {{{{json .RootFS.Layers}}}}' {img} 2>/dev/null || exit 3; "
        f"docker history --no-trunc -H=false --format '{{{{.Size}}}}' {img} | tac",
        parsers.image_layers,
    )


# every image's diff IDs bottom up, one JSON list a line: which layer chains the node holds
LAYER_CHAINS = Probe(
    "layer_chains",
    'ids=$(docker image ls -q --no-trunc | sort -u); [ -z "$ids" ] || '
    "docker image inspect --format '{{json .RootFS.Layers}}' $ids",
    parsers.layer_chains,
)


# --- what drifts on a node (issue 39): one probe each, readable without root ------------------------

KERNEL = Probe("kernel", "cat /proc/sys/kernel/osrelease", lambda out: out.strip())  # what `uname -r` prints
# the 7.0 kernel's KHO tell: CmaTotal 0 with CmaFree above it (NV-Kernels #590); swap for earlyoom's
CMA = Probe("cma", "grep -E '^(CmaTotal|CmaFree|SwapTotal):' /proc/meminfo", parsers.meminfo_kib)
BIOS = Probe(
    "bios",
    "cd /sys/class/dmi/id && for f in bios_vendor bios_version bios_date; do printf '%s=' $f; cat $f; done",
    parsers.key_values,
)
# each HCA's PCI device: its PCIe link now and at most, and the firmware (all world-readable)
HCA_LINK = Probe(
    "hca_link",
    'for d in /sys/class/infiniband/*; do [ -e "$d" ] || continue; v=; for a in current_link_width '
    'current_link_speed max_link_width max_link_speed; do x=; read -r x 2>/dev/null < "$d/device/$a"; v="$v|$x"; '
    'done; f=; read -r f 2>/dev/null < "$d/fw_ver"; printf \'%s%s|%s\\n\' "${d##*/}" "$v" "$f"; done',
    parsers.hca_link_lines,
)
# each HCA's PCI function and the port above it: the TOTAL_ line of its AER counters (issue 59; world-readable,
# Documentation/ABI/testing/sysfs-bus-pci-devices-aer_stats); empty where a device has no such file
AER_TOTALS_SH = (
    'a() { for k in correctable fatal nonfatal; do x=; [ -r "$1/aer_dev_$k" ] && '
    'x=$(sed -n "s/^TOTAL_ERR_[A-Z]* //p" "$1/aer_dev_$k"); printf "|%s" "$x"; done; echo; }; '
    'for d in /sys/class/infiniband/*; do [ -e "$d/device" ] || continue; p=$(readlink -f "$d/device"); '
    'printf "%s|function|%s" "${d##*/}" "$p"; a "$p"; u=${p%/*}; '
    'if [ -e "$u/aer_dev_fatal" ]; then printf "%s|port|%s" "${d##*/}" "$u"; a "$u"; fi; done'
)
HCA_AER = Probe("hca_aer", AER_TOTALS_SH, parsers.hca_aer_lines)
GPU_CLOCKS = Probe(
    "gpu_clocks",
    "nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,temperature.gpu,pstate,clocks_event_reasons.active "
    "--format=csv,noheader,nounits",
    parsers.gpu_clocks_csv,
)
EARLYOOM_ARGS = Probe(
    "earlyoom_args", "p=$(pgrep -o -x earlyoom) && tr '\\0' ' ' < /proc/$p/cmdline", parsers.earlyoom_args
)
DGX_RELEASE = Probe("dgx_release", "cat /etc/dgx-release", parsers.key_values)
TOOLKIT = Probe("toolkit", "nvidia-ctk --version | head -1", parsers.toolkit_version)

TRAITS = (KERNEL, CMA, BIOS, HCA_LINK, HCA_AER, GPU_CLOCKS, EARLYOOM_ARGS, DGX_RELEASE, TOOLKIT)


def traits(sections: dict[str, Section]) -> parsers.Traits:
    """The drift probes' answers as one `Traits`; what a node did not answer stays unknown."""
    mem = value(CMA, sections, {})
    bios = value(BIOS, sections, {})
    dgx = value(DGX_RELEASE, sections, {})
    return parsers.Traits(
        kernel=value(KERNEL, sections, ""),
        cma_total_kb=mem.get("CmaTotal"),
        cma_free_kb=mem.get("CmaFree"),
        swap_total_kb=mem.get("SwapTotal"),
        bios_vendor=bios.get("bios_vendor", ""),
        bios_version=bios.get("bios_version", ""),
        bios_date=parsers.dmi_date(bios.get("bios_date", "")),
        hca_links=value(HCA_LINK, sections, {}),
        hca_aer=value(HCA_AER, sections, {}),
        gpu_clocks=value(GPU_CLOCKS, sections, []),
        earlyoom=value(EARLYOOM_ARGS, sections),
        dgx_os=dgx.get("DGX_OTA_VERSION") or dgx.get("DGX_SWBUILD_VERSION", ""),
        toolkit=value(TOOLKIT, sections, ""),
    )
