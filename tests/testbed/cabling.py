"""How the testbed's two Sparks are cabled and addressed: pure functions from a cabling mode to the
addresses, states, sysfs contents and shell commands of each host (issue 17). `testbed.py` runs
what these return; `tests/unit/test_cabling.py` checks them without root.

A Spark's two QSFP ports each show as two netdevs, "twins" on one cable: port 0 is
`enp1s0f0np0` + `enP2p1s0f0np0`, port 1 is `enp1s0f1np1` + `enP2p1s0f1np1`. The testbed keeps one
veth per netdev ("link k", k = 0..3 in NETDEVS order, subnet 198.19.(k+1).0/24); a port without a
cable has both ends of its veths admin-down (no carrier, as an empty QSFP cage) and its HCAs
`1: DOWN`.

Modes (`SPARKCLUSTER_TESTBED_CABLING`, or `Testbed.set_cabling`), each optionally `@MTU` (1500,
9000 default, 9216):
- one-cable (default): port 1 cabled, a static address per twin on separate /24s; port 0 down.
- two-cables: both ports cabled, four /24s (the testbed before issue 17).
- link-local: port 1 cabled, each twin with a 169.254/16 address only (NVIDIA's guide default).
- one-subnet: port 1 cabled, both twins on the first twin's /24 (eugr/spark-vllm-docker#270).
- twin-no-ipv4: port 1 cabled, the enP2 twin up without IPv4 (the data plane lists one twin).
- ring (three or more hosts, issue 27; wired so at bring-up): each host's port 0 cabled to the next
  host's port 1, the last to the first; each twin pair of a cable on a /24 of its own
  (198.19.(20+i).0/24 and 198.19.(40+i).0/24 for the cable leaving host i, numbered from 1); no cable
  reaches every host, so the control plane is a LAN every host shares (`lan0`, 198.19.200.0/24, a
  bridge in the switch namespace), as owners of rings run it.
"""

from __future__ import annotations

import ipaddress
import shlex
from dataclasses import dataclass

ENV = "SPARKCLUSTER_TESTBED_CABLING"
NETDEVS = ("enp1s0f0np0", "enp1s0f1np1", "enP2p1s0f0np0", "enP2p1s0f1np1")
HCAS = ("rocep1s0f0", "rocep1s0f1", "roceP2p1s0f0", "roceP2p1s0f1")
HCA_OF = dict(zip(NETDEVS, HCAS))
CONTROL_LINK = 1  # enp1s0f1np1: the control plane in every mode (198.19.2.x in static modes)
MODES = ("one-cable", "two-cables", "link-local", "one-subnet", "twin-no-ipv4", "ring")
RING_LAN_IF, RING_LAN = "lan0", "198.19.200"
DEFAULT = "one-cable"
MTUS = (1500, 9000, 9216)
SPEED_MBPS = 200000
GID_SLOTS = 8  # entries written per table; the unused ones are zero GIDs, as in a real table
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
THIRD_NS = "sctb-third"  # the third machine (not a cluster node) a knob can plug into a port
THIRD_NET = "198.19.100"  # its link's /24 (inside the testbed's 198.18.0.0/15)


@dataclass(frozen=True)
class Mode:
    name: str = DEFAULT
    mtu: int = 9000

    @property
    def spec(self) -> str:
        return self.name if self.mtu == 9000 else f"{self.name}@{self.mtu}"

    @property
    def cabled_ports(self) -> tuple[int, ...]:
        return (0, 1) if self.name in ("two-cables", "ring") else (1,)


def parse(spec: str | None) -> Mode:
    """`one-cable`, `two-cables@9216`, ... (empty or None: the default)."""
    spec = (spec or "").strip() or DEFAULT
    name, _, mtu = spec.partition("@")
    if name not in MODES:
        raise ValueError(f"unknown cabling mode {name!r}; one of {', '.join(MODES)} (optionally @MTU)")
    m = int(mtu) if mtu else 9000
    if m not in MTUS:
        raise ValueError(f"cabling MTU {m} not one of {MTUS}")
    return Mode(name, m)


def port_of(netdev: str) -> int:
    """The QSFP port a netdev belongs to (its twin shares it)."""
    return int(netdev[-1])


def is_p2(netdev: str) -> bool:
    """The twin that reaches the second PCIe domain."""
    return netdev.startswith("enP2")


def cabled(mode: Mode, k: int) -> bool:
    return port_of(NETDEVS[k]) in mode.cabled_ports


def addresses(mode: Mode, k: int, octet: int, n: int = 2) -> list[str]:
    """IPv4 addresses (with prefix) of link k's end on the host numbered `octet` (1 head, 2 worker)
    of `n` hosts."""
    if not cabled(mode, k):
        return []
    if mode.name == "ring":
        # port 0's twins leave for the next host (cable `octet`), port 1's arrive from the previous one
        cable = octet if port_of(NETDEVS[k]) == 0 else (octet - 2) % n + 1
        return [f"198.19.{(40 if is_p2(NETDEVS[k]) else 20) + cable}.{octet}/24"]
    nd = NETDEVS[k]
    if mode.name == "link-local":
        # picked at random on a real Spark; fixed here so tests can name them
        return [f"169.254.{k + 1}.{octet}/16"]
    if mode.name == "twin-no-ipv4" and is_p2(nd):
        return []
    if mode.name == "one-subnet" and is_p2(nd):
        first = NETDEVS.index(nd.replace("enP2p1", "enp1"))
        return [f"198.19.{first + 1}.{octet + 2}/24"]
    return [f"198.19.{k + 1}.{octet}/24"]


def control(mode: Mode, octet: int) -> tuple[str, str]:
    """The control plane (control_if, control_ip) of the host numbered `octet`."""
    if mode.name == "ring":
        return RING_LAN_IF, f"{RING_LAN}.{octet}"
    return NETDEVS[CONTROL_LINK], addresses(mode, CONTROL_LINK, octet)[0].split("/")[0]


def data_plane(mode: Mode) -> list[int]:
    """The links the inventory lists, in head order: every cabled twin with an IPv4 address."""
    return [k for k in range(len(NETDEVS)) if cabled(mode, k) and addresses(mode, k, 1)]


def hca_state(mode: Mode, k: int) -> tuple[str, str]:
    """ports/1/state and phys_state of the HCA on link k (an empty cage reads Down/Disabled)."""
    return ("4: ACTIVE", "5: LinkUp") if cabled(mode, k) else ("1: DOWN", "3: Disabled")


def speed(mode: Mode, k: int) -> int:
    return SPEED_MBPS if cabled(mode, k) else -1


# --- GID tables -----------------------------------------------------------------------------------


def mapped_gid(ip: str) -> str:
    """The RoCE v2 GID of an IPv4 address (::ffff:a.b.c.d), written as sysfs prints GIDs."""
    return _gid_text(ipaddress.IPv6Address(f"::ffff:{ip}"))


def link_local_gid(mac: str) -> str:
    """The IPv6 link-local GID (fe80::EUI-64 of the MAC) the driver puts at indexes 0 and 1."""
    b = [int(x, 16) for x in mac.split(":")]
    eui = [b[0] ^ 0x02, b[1], b[2], 0xFF, 0xFE, b[3], b[4], b[5]]
    return _gid_text(ipaddress.IPv6Address(bytes([0xFE, 0x80] + [0] * 6 + eui)))


def _gid_text(ip: ipaddress.IPv6Address) -> str:
    h = ip.packed.hex()
    return ":".join(h[i : i + 4] for i in range(0, 32, 4))


def gid_entries(
    netdev: str, mac: str | None, ipv4s: list[str], ipv6s: tuple[str, ...] = ()
) -> list[tuple[str, str | None, str | None]]:
    """(gid, type, ndev) per index, as the mlx5 driver fills a port's table: the link-local GID as
    RoCE v1 then v2 (only while the netdev is up: `mac` None otherwise), then each IPv4 address as
    v1 then v2 (so the first RoCE v2 IPv4 GID sits at index 3), then zero GIDs with no attributes.
    `ipv6s`: global IPv6 addresses the port got before its IPv4 one (they take the slots first)."""
    rows: list[tuple[str, str | None, str | None]] = []
    v6 = [_gid_text(ipaddress.IPv6Address(a.split("/")[0])) for a in ipv6s]
    for gid in ([link_local_gid(mac)] if mac else []) + v6 + [mapped_gid(ip.split("/")[0]) for ip in ipv4s]:
        rows += [(gid, "IB/RoCE v1", netdev), (gid, "RoCE v2", netdev)]
    return rows + [(ZERO_GID, None, None)] * max(GID_SLOTS - len(rows), 0)


def gid_commands(hca: str, netdev: str, mac: str | None, ipv4s: list[str], ipv6s: tuple[str, ...] = ()) -> list[str]:
    """Shell that rewrites the fake HCA's GID table (host-setup.sh made the directories)."""
    p = f"/sys/class/infiniband/{hca}/ports/1"
    cmds = [
        f"mkdir -p {p}/gids {p}/gid_attrs/types {p}/gid_attrs/ndevs",
        f"rm -f {p}/gids/* {p}/gid_attrs/types/* {p}/gid_attrs/ndevs/*",
    ]
    for i, (gid, kind, ndev) in enumerate(gid_entries(netdev, mac, ipv4s, ipv6s)):
        cmds.append(f"echo {gid} > {p}/gids/{i}")
        if kind:
            cmds += [f"echo {shlex.quote(kind)} > {p}/gid_attrs/types/{i}", f"echo {ndev} > {p}/gid_attrs/ndevs/{i}"]
    return cmds


# --- applying a mode to a host --------------------------------------------------------------------


def address_commands(netdev: str, want: list[str]) -> list[str]:
    """Idempotent: add what is missing, delete other IPv4 addresses; nothing is flushed, so a live
    control link never loses its address for a moment."""
    keep = " ".join(want)
    cmds = [
        f"for a in $(ip -4 -o addr show dev {netdev} | awk '{{print $4}}'); do "
        f'case \' {keep} \' in *" $a "*) ;; *) ip addr del "$a" dev {netdev};; esac; done'
    ]
    cmds += [f"ip addr replace {a} dev {netdev}" for a in want]
    return cmds


def host_commands(mode: Mode, octet: int, names: list[str], macs: dict[str, str], n: int = 2) -> list[str]:
    """Everything that puts one host in `mode`. `names[k]`: this host's netdev at the end of link k
    (the worker's differ when it is re-cabled); `macs`: netdev -> MAC, for the link-local GIDs. The
    HCA on a netdev follows the netdev's name, as on hardware."""
    cmds = []
    for k, nd in enumerate(names):
        up = cabled(mode, k)
        want = addresses(mode, k, octet, n)
        state, phys = hca_state(mode, k)
        hca = HCA_OF[nd]
        cmds.append(f"ip link set dev {nd} mtu {mode.mtu} {'up' if up else 'down'}")
        cmds += address_commands(nd, want)
        cmds += [
            f"echo {shlex.quote(state)} > /sys/class/infiniband/{hca}/ports/1/state",
            f"echo {shlex.quote(phys)} > /sys/class/infiniband/{hca}/ports/1/phys_state",
            f"echo {speed(mode, k)} > /run/testbed/speed/{NETDEVS[k]}",
        ]
        cmds += gid_commands(hca, nd, macs.get(nd) if up else None, want)
    return cmds


def mac_query(names: list[str]) -> str:
    return "for i in " + " ".join(names) + '; do printf \'%s %s\\n\' "$i" "$(cat /sys/class/net/$i/address)"; done'


def parse_macs(text: str) -> dict[str, str]:
    return {p[0]: p[1] for p in (ln.split() for ln in text.splitlines()) if len(p) == 2}


def inventory_nodes(mode: Mode, hosts: list[tuple[str, str, int]], names: dict[str, list[str]]) -> list[str]:
    """The `[[nodes]]` blocks for `hosts` = [(name, role, octet)]; `names[host][k]` as in host_commands."""
    out = []
    for h, role, octet in hosts:
        nds = names[h]
        ctl_if, ctl_ip = control(mode, octet)
        out += [
            "[[nodes]]",
            f'name = "{h}"',
            f'role = "{role}"',
            f'ssh = "{h}"',
            f'control_if = "{nds[NETDEVS.index(ctl_if)] if ctl_if in NETDEVS else ctl_if}"',
            f'control_ip = "{ctl_ip}"',
            f"mtu = {mode.mtu}",
            "data_plane = [",
        ]
        out += [f'  {{ netdev = "{nds[k]}", hca = "{HCA_OF[nds[k]]}" }},' for k in data_plane(mode)]
        out += ["]", ""]
    return out


# --- a third machine (not a cluster node) in a port -----------------------------------------------


def third_plug_commands(host_ns: str, netdev: str, other_ns: str, other_nd: str, mtu: int) -> list[list[str]]:
    """Root-namespace commands that unplug link `netdev` from the pair and plug `host_ns`'s end into
    the third machine (addresses .1 here, .3 there on THIRD_NET). The other host's port keeps a veth
    whose far end, in the third namespace, stays down: an empty cage, no carrier."""
    return [
        ["ip", "netns", "add", THIRD_NS],
        ["ip", "-n", host_ns, "link", "del", netdev],  # the pair's veth: both ends go
        [
            "ip",
            "link",
            "add",
            "tbtmp-h",
            "netns",
            host_ns,
            "mtu",
            str(mtu),
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            THIRD_NS,
            "mtu",
            str(mtu),
        ],
        ["ip", "-n", host_ns, "link", "set", "tbtmp-h", "name", netdev],
        [
            "ip",
            "link",
            "add",
            "tbtmp-o",
            "netns",
            other_ns,
            "mtu",
            str(mtu),
            "type",
            "veth",
            "peer",
            "name",
            "spare0",
            "netns",
            THIRD_NS,
            "mtu",
            str(mtu),
        ],
        ["ip", "-n", other_ns, "link", "set", "tbtmp-o", "name", other_nd],
        ["ip", "-n", THIRD_NS, "link", "set", "lo", "up"],
        ["ip", "-n", THIRD_NS, "addr", "add", f"{THIRD_NET}.3/24", "dev", "eth0"],
        ["ip", "-n", THIRD_NS, "link", "set", "eth0", "up"],
        ["ip", "-n", host_ns, "addr", "add", f"{THIRD_NET}.1/24", "dev", netdev],
        ["ip", "-n", host_ns, "link", "set", netdev, "up"],
    ]


def third_unplug_commands(host_ns: str, netdev: str, other_ns: str, other_nd: str, mtu: int) -> list[list[str]]:
    """Undo third_plug_commands: the pair's veth for that link again (addresses come from the mode)."""
    return [
        ["ip", "-n", host_ns, "link", "del", netdev],
        ["ip", "-n", other_ns, "link", "del", other_nd],
        ["ip", "netns", "del", THIRD_NS],
        [
            "ip",
            "link",
            "add",
            "tbtmp-h",
            "netns",
            host_ns,
            "mtu",
            str(mtu),
            "type",
            "veth",
            "peer",
            "name",
            "tbtmp-w",
            "netns",
            other_ns,
            "mtu",
            str(mtu),
        ],
        ["ip", "-n", host_ns, "link", "set", "tbtmp-h", "name", netdev],
        ["ip", "-n", other_ns, "link", "set", "tbtmp-w", "name", other_nd],
    ]


def rebind_speed(names_and_files: list[tuple[str, str]]) -> str:
    """A new netdev has a fresh sysfs entry: bind the testbed's speed file onto it again."""
    return " ; ".join(
        f"umount /sys/class/net/{nd}/speed 2>/dev/null; mount --bind /run/testbed/speed/{f} /sys/class/net/{nd}/speed"
        for nd, f in names_and_files
    )
