"""The kernel's own account of what went wrong on this node, read by every node's agent (issue 75):
NVIDIA Xid lines, OOM kills (which process, whose container), mlx5 (ConnectX-7) errors and link
changes, and PCIe AER reports.

The source: the kernel's log device, `/dev/kmsg` (KMSG_PATH), given to the container read-only
(`--device /dev/kmsg:/dev/kmsg:r`) with the capability the kernel asks of a reader while
`kernel.dmesg_restrict` is 1 (CAP_SYSLOG: Documentation/admin-guide/sysctl/kernel.rst,
"dmesg_restrict"; DGX OS is an Ubuntu, and Ubuntu sets it to 1, https://sudowheel.com/dmesg-quick-reference.html).
Why not the host's
journal mounted read-only: its files are journald's binary format (reading it needs
systemd's journalctl or libsystemd in the image; the agent is standard library only), and a host
whose journal is volatile (`Storage=auto` without /var/log/journal) has nothing on disk to mount.
`/dev/kmsg` is the kernel's ring buffer itself: one record per read(2), `prio,seq,usec,flags;text`
(Documentation/ABI/testing/dev-kmsg), continuation lines (" KEY=value") after it.

The reader reads every record the ring buffer still holds at its first read (an Xid that took the
last container down is among them) and then only what is new; records older than FRESH_S at the
first read are history (counted in `before` only), so a restarted agent does not report, count or
alert on what an earlier one already did. A reader that cannot open the device says why (`error`), which
`status` and the metrics show: it is never silently empty.

Parsing is pure (`Parser.feed`): the same code reads `/dev/kmsg` records, `dmesg` lines and
`journalctl -k` lines (tests/captured/kernel/ holds real ones, their sources in its README).

Standard library only: this file is shipped into every container."""

from __future__ import annotations

import errno
import os
import re
import threading
import time
from collections import Counter, deque

KMSG_PATH = "/dev/kmsg"
# NVIDIA's catalogue of Xid events (Ampere and newer), where an Xid's meaning and NVIDIA's action are
XID_CATALOG_URL = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
DPR_URL = "https://docs.nvidia.com/deploy/dynamic-page-retirement/visibility.html"
# Only the Xids whose meaning a public NVIDIA page states, each with it; any other Xid is journalled
# with its number and the driver's own words, and the catalogue named for its meaning.
XID_MEANINGS: dict[int, str] = {
    8: "GPU stopped processing",  # XID_CATALOG_URL: ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT
    48: "an uncorrectable double bit ECC error (DBE)",  # DPR_URL: "XID 48: A DBE has occurred"
    63: "a memory page was retired (dynamic page retirement)",  # DPR_URL
    64: "a memory page failed retirement",  # DPR_URL
    # the driver's own words on the line (NVIDIA/open-gpu-kernel-modules#1151, NVIDIA/NVSentinel#155)
    79: "the GPU has fallen off the bus",
}
KINDS = ("xid", "oom", "mlx5", "link", "aer")  # what the parser classifies (the metrics' `kind` label)
FRESH_S = 600.0  # at the first read: a record older than this is counted, not journalled
RECENT = 50  # the last events kept for the report (the head's supervisor and `status` read them)
READ_MAX = 4096  # records per look at most (the ring buffer holds a few thousand)

_KMSG = re.compile(r"^(\d+),(\d+),(\d+),[^;]*;(.*)$")
_JOURNAL = re.compile(r"^\S+\s+\d+\s+\d\d:\d\d:\d\d(?:\.\d+)?\s+(?:\S+\s+)?kernel:\s?(.*)$")
_DMESG = re.compile(r"^\s*\[\s*\d+\.\d+\]\s?(.*)$")
_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f:.]+)\): (?P<code>\d+)"
    r"(?:, pid=(?P<pid>[^,]*))?(?:, name=(?P<name>[^,]*))?,?\s*(?P<rest>.*)$"
)
_OOM_KILL = re.compile(r"oom-kill:(?P<fields>\S+)")
_KILLED = re.compile(r"(?:Out of memory|Memory cgroup out of memory): Killed process (?P<pid>\d+) \((?P<name>[^)]*)\)")
_DOCKER_ID = re.compile(r"docker[-/](?P<id>[0-9a-f]{64})")
_AER = re.compile(
    r"^(?P<driver>\S+) (?P<dev>[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.\d): (?:AER: )?PCIe Bus Error: "
    r"severity=(?P<severity>[^,]+), type=(?P<type>[^,]+)"
)
_MLX5_LINK = re.compile(r"mlx5_core (?P<pci>\S+) (?P<dev>\S+): Port: (?P<port>\d+) Link (?P<state>\w+)")
_MLX5 = re.compile(r"(?:^|\s)(?:mlx5_core|infiniband) (?P<dev>\S+?):? (?P<what>.*mlx5.*|.*)$")
_MLX5_ERROR = re.compile(r"error|fatal|health|timeout|fail", re.IGNORECASE)


def message(line: str) -> tuple[str, float | None]:
    """A line's kernel message and, for a /dev/kmsg record, its time since boot in seconds; the
    prefixes of `dmesg` and `journalctl -k` removed."""
    m = _KMSG.match(line)
    if m:
        return m.group(4).strip(), int(m.group(3)) / 1e6
    m = _JOURNAL.match(line)
    if m:
        line = m.group(1)
    m = _DMESG.match(line)
    if m:
        line = m.group(1)
    return line.strip(), None


def severity_of(text: str) -> str:
    """AER's severity words as the sysfs counters name them (node/aer.SEVERITIES)."""
    low = text.lower()
    if "fatal" in low and "non" not in low:
        return "fatal"
    if "uncorrect" in low or "non-fatal" in low or "nonfatal" in low:
        return "nonfatal"
    return "correctable"


def xid_meaning(code: int) -> str:
    return XID_MEANINGS.get(code, "")


def container_of(memcg: str) -> str:
    """The container a memory cgroup path names: Docker's 64-hex id, shortened as `docker ps` shows
    it (12); "" for none (a process of the host)."""
    m = _DOCKER_ID.search(memcg)
    return m.group("id")[:12] if m else ""


class Parser:
    """Lines in, events out (`feed`); remembers the pids an `oom-kill:` line named, so the "Killed
    process" line the kernel prints after it for the same kill is not a second event (kernels before
    5.0 print only the latter, which is then the event)."""

    def __init__(self):
        self.oom_pids: deque[str] = deque(maxlen=64)

    def feed(self, line: str) -> dict | None:
        text, uptime = message(line)
        if not text:
            return None
        ev = self.classify(text)
        if ev is not None:
            ev["line"] = text
            if uptime is not None:
                ev["uptime_s"] = uptime
        return ev

    def classify(self, text: str) -> dict | None:
        m = _XID.search(text)
        if m:
            code = int(m.group("code"))
            ev = {"kind": "xid", "code": str(code), "pci": m.group("pci"), "meaning": xid_meaning(code)}
            if m.group("pid") and m.group("pid").strip() not in ("", "'<unknown>'"):
                ev["pid"] = m.group("pid").strip()
            if m.group("name"):
                ev["process"] = m.group("name").strip()
            ev["detail"] = m.group("rest").strip()
            return ev
        m = _OOM_KILL.search(text)
        if m:
            fields = dict(kv.split("=", 1) for kv in m.group("fields").split(",") if "=" in kv)
            pid = fields.get("pid", "")
            self.oom_pids.append(pid)
            memcg = fields.get("task_memcg", "")
            ev = {"kind": "oom", "code": "kill", "process": fields.get("task", ""), "pid": pid, "memcg": memcg}
            ev["container"] = container_of(memcg)
            ev["scope"] = "global" if "global_oom" in text else fields.get("constraint", "")
            return ev
        m = _KILLED.search(text)
        if m:
            if m.group("pid") in self.oom_pids:
                return None
            return {"kind": "oom", "code": "kill", "process": m.group("name"), "pid": m.group("pid"), "container": ""}
        m = _AER.search(text)
        if m:
            return {
                "kind": "aer",
                "code": severity_of(m.group("severity")),
                "device": m.group("dev"),
                "driver": m.group("driver"),
                "type": m.group("type").strip(),
            }
        m = _MLX5_LINK.search(text)
        if m:
            return {"kind": "link", "code": m.group("state").lower(), "device": m.group("dev"), "port": m.group("port")}
        if "mlx5" in text:
            m = _MLX5.search(text)
            if m and _MLX5_ERROR.search(text):
                return {"kind": "mlx5", "code": "error", "device": m.group("dev")}
        return None


def summary(ev: dict) -> str:
    """One line for a verdict's cause and `status`: what the kernel said, in words."""
    kind = ev.get("kind")
    if kind == "xid":
        meaning = ev.get("meaning") or f"see NVIDIA's Xid catalogue, {XID_CATALOG_URL}"
        who = f", process {ev['process']}" if ev.get("process") else ""
        return f"Xid {ev.get('code')} ({meaning}){who}"
    if kind == "oom":
        where = f" in container {ev['container']}" if ev.get("container") else ""
        return f"an OOM kill of {ev.get('process') or 'a process'} (pid {ev.get('pid')}){where}"
    if kind == "aer":
        return f"a {ev.get('code')} PCIe AER error on {ev.get('device')}"
    if kind == "link":
        return f"{ev.get('device')} port {ev.get('port')} link {ev.get('code')}"
    return f"an mlx5 error on {ev.get('device')}"


class KernelWatch:
    """This node's reader of the kernel's log: `look` reads what is new, journals each event and
    counts it (by kind and code: the metrics' counter); `report` is what the node's report carries
    (the head's supervisor reads each peer's there)."""

    def __init__(self, path: str = KMSG_PATH, clock=time.time, uptime=time.monotonic):
        self.path, self.clock, self.uptime = path, clock, uptime
        self.parser = Parser()
        self.fd: int | None = None
        self.error = ""
        self.buf = b""
        self.first = True
        self.before = 0  # events the first read found older than FRESH_S
        self.counts: Counter[tuple[str, str]] = Counter()
        self.recent: deque[dict] = deque(maxlen=RECENT)
        self._lock = threading.Lock()  # `report` runs on the report server's thread

    def _open(self) -> bool:
        if self.fd is not None:
            return True
        try:
            self.fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as e:
            why = "needs CAP_SYSLOG while kernel.dmesg_restrict is 1" if e.errno in (errno.EPERM, errno.EACCES) else ""
            self.error = f"{self.path}: {e.strerror}" + (f" ({why})" if why else "")
            return False
        self.error = ""
        return True

    def read_lines(self) -> list[str]:
        """What the device (or a file standing in for it) holds that was not read yet."""
        if not self._open():
            return []
        out: list[str] = []
        for _ in range(READ_MAX):
            try:
                chunk = os.read(self.fd, 8192)
            except BlockingIOError:  # /dev/kmsg: nothing new
                break
            except OSError as e:
                if e.errno == errno.EPIPE:  # records overwritten since the last read: the next read resumes
                    continue
                self.error = f"{self.path}: {e.strerror}"
                os.close(self.fd)
                self.fd = None
                break
            if not chunk:  # a regular file: its end
                break
            self.buf += chunk
            *lines, self.buf = self.buf.split(b"\n")
            out += [ln.decode(errors="replace") for ln in lines if ln and not ln.startswith(b" ")]
        return out

    def look(self) -> list[dict]:
        """The events new since the last look, each with `ts` (the wall clock: a record's own time
        where it has one); at the first look only those within FRESH_S (the rest are counted)."""
        now, up = self.clock(), self.uptime()
        fresh = []
        for line in self.read_lines():
            ev = self.parser.feed(line)
            if ev is None:
                continue
            at = ev.pop("uptime_s", None)
            ev["ts"] = round(now - (up - at), 3) if at is not None and at <= up else round(now, 3)
            if self.first and now - ev["ts"] > FRESH_S:
                self.before += 1  # history: neither counted nor journalled one by one
                continue
            with self._lock:
                self.counts[(ev["kind"], ev["code"])] += 1
                self.recent.append(ev)
            fresh.append(ev)
        self.first = False
        return fresh

    def report(self) -> dict:
        with self._lock:
            counts, recent = sorted(self.counts.items()), list(self.recent)[-20:]
        return {
            "source": self.path,
            "error": self.error,
            "before": self.before,
            "counts": [{"kind": k, "code": c, "count": n} for (k, c), n in counts],
            "recent": recent,
        }


def fresh_faults(events: list[dict], since: float) -> list[dict]:
    """The Xid and OOM-kill events at or after `since` (pure): what a verdict's cause names."""
    return [e for e in events if e.get("kind") in ("xid", "oom") and float(e.get("ts") or 0) >= since]


def with_kernel(cause: str, faults: dict[str, list[dict]]) -> str:
    """A verdict's cause with the kernel's report of each node's fresh Xid or OOM kill (pure): the
    newest of each node's, "; the kernel on worker reported Xid 79 (the GPU has fallen off the bus)"."""
    said = [f"{node}: {summary(evs[-1])}" for node, evs in sorted(faults.items()) if evs]
    return f"{cause}; the kernel reported " + "; ".join(said) if said else cause
