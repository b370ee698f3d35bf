"""IP discovery as vLLM's get_ip(): VLLM_HOST_IP if set, else the default-route interface address.

No packet is sent: the default route is read from /proc/net/route and the interface address
with the SIOCGIFADDR ioctl.
"""

from __future__ import annotations

import fcntl
import socket
import struct

from vllm_standin.logger import init_logger

logger = init_logger(__name__)

SIOCGIFADDR = 0x8915


def iface_ipv4(name: str) -> str | None:
    """IPv4 address of interface `name`, or None."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        packed = struct.pack("256s", name.encode()[:15])
        res = fcntl.ioctl(s.fileno(), SIOCGIFADDR, packed)
        return socket.inet_ntoa(res[20:24])
    except OSError:
        return None
    finally:
        s.close()


def default_route_iface(route_file: str = "/proc/net/route") -> str | None:
    try:
        with open(route_file) as f:
            lines = f.read().splitlines()[1:]
    except OSError:
        return None
    best: tuple[int, str] | None = None
    for line in lines:
        parts = line.split()
        if len(parts) < 8:
            continue
        iface, dest, flags, metric = parts[0], parts[1], int(parts[3], 16), int(parts[6])
        if dest == "00000000" and flags & 0x1:  # RTF_UP
            if best is None or metric < best[0]:
                best = (metric, iface)
    return best[1] if best else None


def get_ip(environ: dict[str, str] | None = None) -> str:
    import os

    env = os.environ if environ is None else environ
    host_ip = env.get("VLLM_HOST_IP") or env.get("HOST_IP")
    if host_ip:
        return host_ip
    iface = default_route_iface()
    if iface:
        ip = iface_ipv4(iface)
        if ip:
            return ip
    logger.warning(
        "Failed to get the IP address, using 0.0.0.0 by default."
        "The value can be set by the environment variable"
        " VLLM_HOST_IP or HOST_IP."
    )
    return "0.0.0.0"


def list_ifaces(net_sysfs_dir: str = "/sys/class/net") -> dict[str, str | None]:
    """Interfaces of this node -> IPv4 address (None when it has none)."""
    import os

    try:
        names = sorted(os.listdir(net_sysfs_dir))
    except OSError:
        names = []
    return {n: iface_ipv4(n) for n in names}
