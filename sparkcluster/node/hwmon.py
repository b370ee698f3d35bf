"""Temperatures where the hardware exposes them (issue 75): each ConnectX-7's sensors through the mlx5
driver's hwmon device and each NVMe drive's through the nvme driver's, read by every node's agent
from sysfs, with the thresholds each alert fires at.

Where they are: every hwmon device is a directory /sys/class/hwmon/hwmonN (a link to the device's
own hwmon/hwmonN) with a `name` file, `device` linking to the PCI function it monitors, and one file
per attribute, `temp<N>_<attr>`, temperatures in millidegrees Celsius (Linux
Documentation/hwmon/sysfs-interface.rst; drivers/hwmon/hwmon.c names them). Only the two drivers
below are read; every other hwmon device (CPU, GPU, board) is left alone.

  * mlx5 (drivers/net/ethernet/mellanox/mlx5/core/hwmon.c, added to Linux in 2023; the device is
    registered as "mlx5"): per sensor `tempN_input`, `tempN_highest` (the highest since the driver
    enabled it), `tempN_crit` and `tempN_label` (the firmware's name: "asic" for the chip,
    "Module0" for the transceiver). `tempN_crit` is the device's own high threshold (the MTMP
    register's temp_threshold_hi); it exposes no `tempN_max`.
  * nvme (drivers/nvme/host/hwmon.c, registered as "nvme"): temp1 is the drive's Composite
    temperature, temp2..temp9 its other sensors where it has them (labels "Composite", "Sensor 1",
    ...). `temp1_crit` is the drive's own CCTEMP (Identify Controller), present only when the drive
    reports one; `tempN_max` its over-temperature threshold (Get Features, Temperature Threshold),
    which defaults to WCTEMP for the Composite sensor (where WCTEMP is non-zero) and to FFFFh kelvin
    for the others (the NVMe Base Specification's Temperature Threshold feature, as Microsoft's
    nvme.h restates it: https://learn.microsoft.com/en-us/windows/win32/api/nvme/ns-nvme-nvme_cdw11_feature_temperature_threshold).
    FFFFh kelvin (65261.85 C) is no threshold; an administrator may have set another.

Which thresholds are used: the device's own wherever it reports one (above). Where it does not:
the ConnectX-7's chip ("asic") gets the figures of NVIDIA's ConnectX-7 manual
(https://docs.nvidia.com/networking/display/connectx7vpi/monitoring: warning 97 C, critical 102 C,
both "default"; the firmware shuts the chip down at 110 C). A transceiver module and an NVMe sensor
without a threshold get none, so no alert: no vendor figure covers every module or drive.

The reading costs little: a read of an NVMe temperature asks the drive for its SMART log, an mlx5
one the firmware for a register, so the readings are kept READ_EVERY_S (whoever asks: the report,
the scrape). Any file that cannot be read or parsed is skipped; `readings` never raises.

Standard library only: this file is shipped into every container."""

from __future__ import annotations

import os
import re
import shlex
import threading
import time

HWMON_ROOT = "/sys/class/hwmon"
KINDS = {"mlx5": "cx7", "nvme": "nvme"}  # the driver's hwmon name -> the `kind` label
READ_EVERY_S = 30.0
NO_THRESHOLD_MC = 65_261_850  # 0xFFFF kelvin in millidegrees Celsius: an NVMe threshold never set
# NVIDIA's ConnectX-7 manual, "Monitoring" (URL above): the chip's default thresholds
CX7_WARNING_C = 97.0
CX7_CRITICAL_C = 102.0
CX7_CHIP_LABEL = "asic"  # the chip's label as a ConnectX host shows it (tests/unit/test_hwmon.py cites it)
ATTRS = ("input", "label", "max", "crit", "highest")
_TEMP = re.compile(r"^temp(\d+)_(input|label|max|crit|highest)$")


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except (OSError, UnicodeDecodeError):
        return None


def celsius(text: str | None) -> float | None:
    """A hwmon temperature file (millidegrees Celsius) in degrees; None unreadable or garbage."""
    try:
        return int((text or "").strip()) / 1000
    except ValueError:
        return None


def _threshold(text: str | None) -> float | None:
    """A threshold file in degrees; None where absent, garbage, zero or the NVMe "never set"."""
    c = celsius(text)
    if c is None or c <= 0 or c * 1000 >= NO_THRESHOLD_MC:
        return None
    return c


def _first(path: str) -> str:
    try:
        names = sorted(os.listdir(path))
    except OSError:
        return ""
    return names[0] if names else ""


def read_chips(root: str = HWMON_ROOT) -> dict[str, dict]:
    """hwmonN -> {name, pci, device, files: {temp file -> text}} for each mlx5 and nvme hwmon device
    under `root`; `device` is the HCA's RDMA name (mlx5_0) or the drive's controller (nvme0) where
    the PCI function lists one, else its PCI address."""
    out: dict[str, dict] = {}
    try:
        entries = sorted(os.listdir(root))
    except OSError:
        return out
    for hw in entries:
        base = os.path.join(root, hw)
        name = _read(os.path.join(base, "name"))
        if name not in KINDS:
            continue
        dev = os.path.realpath(os.path.join(base, "device"))
        pci = os.path.basename(dev)
        friendly = _first(os.path.join(dev, "infiniband" if name == "mlx5" else "nvme"))
        files = {}
        try:
            listing = sorted(os.listdir(base))
        except OSError:
            continue
        for f in listing:
            if _TEMP.match(f):
                text = _read(os.path.join(base, f))
                if text is not None:
                    files[f] = text
        out[hw] = {"name": name, "pci": pci, "device": friendly or pci, "files": files}
    return out


# The same reading as read_chips, in shell, for `status` (one SSH round trip reads the host's sysfs):
# a `chip HWMON NAME PCI DEVICE` line per mlx5/nvme device, then a `file HWMON FILE TEXT` line per
# temperature file; `listing` parses it into read_chips' shape.
def shell(root: str = HWMON_ROOT) -> str:
    return (
        f'for h in {shlex.quote(root)}/hwmon*; do n=$(cat "$h/name" 2>/dev/null) || continue; '
        'case "$n" in mlx5) sub=infiniband;; nvme) sub=nvme;; *) continue;; esac; '
        'd=$(readlink -f "$h/device"); c=$(ls "$d/$sub" 2>/dev/null | head -n 1); '
        'printf \'chip %s %s %s %s\\n\' "${h##*/}" "$n" "${d##*/}" "${c:-${d##*/}}"; '
        'for f in "$h"/temp*_input "$h"/temp*_label "$h"/temp*_max "$h"/temp*_crit "$h"/temp*_highest; do '
        'v=$(cat "$f" 2>/dev/null) && printf \'file %s %s %s\\n\' "${h##*/}" "${f##*/}" "$v"; done; done; true'
    )


def listing(text: str) -> dict[str, dict]:
    """shell()'s output as read_chips returns it (pure); a line it does not know is skipped."""
    out: dict[str, dict] = {}
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "chip":
            parts = rest.split()
            if len(parts) == 4 and parts[1] in KINDS:
                out[parts[0]] = {"name": parts[1], "pci": parts[2], "device": parts[3], "files": {}}
        elif kind == "file":
            hw, f, value = (rest.split(" ", 2) + ["", ""])[:3]
            if hw in out and _TEMP.match(f):
                out[hw]["files"][f] = value.strip()
    return out


def sensors(chips: dict[str, dict]) -> list[dict]:
    """Each sensor with a readable temperature, and its thresholds (pure): {kind, device, pci, sensor,
    celsius, highest_c, max_c, max_from, crit_c, crit_from, alert}; a threshold absent is None, `*_from`
    says whose it is ("device" or "vendor"), `alert` what the alerts would say of it (`hot`)."""
    out = []
    for hw, chip in sorted(chips.items(), key=lambda kv: (kv[1].get("device", ""), kv[0])):
        by: dict[str, dict[str, str]] = {}
        for f, text in (chip.get("files") or {}).items():
            m = _TEMP.match(f)
            if m:
                by.setdefault(m.group(1), {})[m.group(2)] = text
        for n in sorted(by, key=int):
            got = by[n]
            now = celsius(got.get("input"))
            if now is None:
                continue
            label = (got.get("label") or "").strip() or f"temp{n}"
            s = {
                "kind": KINDS.get(chip.get("name", ""), chip.get("name", "")),
                "device": chip.get("device", hw),
                "pci": chip.get("pci", ""),
                "sensor": label,
                "celsius": now,
                "highest_c": celsius(got.get("highest")),
                "max_c": _threshold(got.get("max")),
                "crit_c": _threshold(got.get("crit")),
            }
            s["max_from"] = "device" if s["max_c"] is not None else ""
            s["crit_from"] = "device" if s["crit_c"] is not None else ""
            if s["kind"] == "cx7" and label == CX7_CHIP_LABEL:
                vendor_fill(s)
            s["alert"] = hot(s)  # as the reading is judged where it is made (the console reads it)
            out.append(s)
    return out


def vendor_fill(s: dict) -> None:
    """The ConnectX-7 chip's thresholds the device does not report, from NVIDIA's manual: critical
    102 C where no `crit` is read; warning 97 C, kept only below the critical threshold in use."""
    if s["crit_c"] is None:
        s["crit_c"], s["crit_from"] = CX7_CRITICAL_C, "vendor"
    if s["max_c"] is None and CX7_WARNING_C < s["crit_c"]:
        s["max_c"], s["max_from"] = CX7_WARNING_C, "vendor"


def hot(s: dict) -> str:
    """ "critical", "warning" or "" for one sensor (pure): what the alerts judge, for `status`."""
    now = s.get("celsius")
    if not isinstance(now, (int, float)):
        return ""
    for key, said in (("crit_c", "critical"), ("max_c", "warning")):
        if isinstance(s.get(key), (int, float)) and now >= s[key]:
            return said
    return ""


class Temperatures:
    """This node's readings, kept READ_EVERY_S; `readings` is safe from any thread and never raises."""

    def __init__(self, root: str = HWMON_ROOT, every_s: float = READ_EVERY_S, clock=time.monotonic):
        self.root, self.every_s, self.clock = root, every_s, clock
        self._at: float | None = None
        self._last: list[dict] = []
        self.error = ""
        self._lock = threading.Lock()

    def readings(self) -> list[dict]:
        with self._lock:
            now = self.clock()
            if self._at is None or now - self._at >= self.every_s:
                self._at = now
                try:
                    self._last, self.error = sensors(read_chips(self.root)), ""
                except Exception as e:  # a sysfs surprise must not reach the agent's loop or a scrape
                    self._last, self.error = [], f"{type(e).__name__}: {e}"
            return [dict(s) for s in self._last]
