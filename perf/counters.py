"""Byte counters sampled while something moves: the worker's control link (the head->worker path,
read from the worker's network namespace) and the controller-side LAN veths (everything between
the controller and the hosts). The image and weights figures read them; a transfer's span is when
the link counter rose.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

SAMPLE_S = 0.02  # counter sampling period
LINK_NOISE = 64 * 1024  # bytes on a link that are not a transfer (ARP, ND)


def sysfs_bytes(ifname: str) -> int:
    base = Path("/sys/class/net") / ifname / "statistics"
    return int((base / "rx_bytes").read_text()) + int((base / "tx_bytes").read_text())


def netns_dev_bytes(pid: int, ifname: str) -> tuple[int, int]:
    """(rx, tx) of ifname in the network namespace of pid, read from the root namespace."""
    for line in Path(f"/proc/{pid}/net/dev").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name.strip() == ifname:
            f = rest.split()
            return int(f[0]), int(f[8])
    raise KeyError(ifname)


class Sampler:
    """Samples, every SAMPLE_S: the worker's control-link rx+tx (the head->worker path) and the
    controller-side LAN veths (everything between the controller and the hosts)."""

    def __init__(self, worker_pid: int, worker_if: str | list[str], lan_ifs: list[str]):
        """`worker_if`: the worker's control link, or several of its links summed (a chain's
        stream may take a data-plane subnet rather than the control link, perf/weights_scale)."""
        self.worker_pid, self.lan_ifs = worker_pid, lan_ifs
        # each link once: a node's control link may also be one of its data-plane links (the
        # testbed's is), and counted twice it doubled a resumed pull's bytes (2.002 for 1.001)
        self.worker_ifs = [worker_if] if isinstance(worker_if, str) else list(dict.fromkeys(worker_if))
        self.samples: list[tuple[float, int, int]] = []  # (t, link bytes, lan bytes)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> tuple[float, int, int]:
        link = sum(sum(netns_dev_bytes(self.worker_pid, i)) for i in self.worker_ifs)
        return time.time(), link, sum(sysfs_bytes(i) for i in self.lan_ifs)

    def __enter__(self) -> Sampler:
        self.samples = [self.sample()]
        self._stop.clear()

        def loop():
            while not self._stop.wait(SAMPLE_S):
                self.samples.append(self.sample())

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(self.sample())

    def value_at(self, t: float) -> tuple[int, int]:
        """Counters at the last sample taken at or before t."""
        best = self.samples[0]
        for s in self.samples:
            if s[0] <= t:
                best = s
            else:
                break
        return best[1], best[2]

    def delta(self, ta: float, tb: float) -> tuple[int, int]:
        a, b = self.value_at(ta), self.value_at(tb)
        return b[0] - a[0], b[1] - a[1]

    def window(self, ta: float, tb: float) -> tuple[float, float, int] | None:
        """The span in [ta, tb] during which the link counter rose: (start, end, bytes).

        start: the last sample before the counter left its value at ta (by more than noise);
        end: the first sample at which it reached its value at tb (within noise)."""
        inside = [s for s in self.samples if ta <= s[0] <= tb]
        if len(inside) < 2:
            return None
        base, final = inside[0][1], inside[-1][1]
        if final - base < LINK_NOISE:
            return None
        start = next(i for i, s in enumerate(inside) if s[1] - base > LINK_NOISE)
        end = next(i for i, s in enumerate(inside) if final - s[1] <= LINK_NOISE)
        return inside[max(start - 1, 0)][0], inside[end][0], final - base
