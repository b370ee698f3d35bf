"""The ConnectX-7's and NVMe drives' temperatures (node/hwmon, issue 75), read from a sysfs tree laid
out as the kernel lays it out: /sys/class/hwmon/hwmonN a link to the PCI function's hwmon/hwmonN, in
it `name`, `device` (a link back to the PCI function) and `temp<N>_<attr>` files in millidegrees
Celsius (Linux Documentation/hwmon/sysfs-interface.rst; drivers/hwmon/hwmon.c). What each driver
writes: drivers/net/ethernet/mellanox/mlx5/core/hwmon.c (name "mlx5"; input, highest, crit, label)
and drivers/nvme/host/hwmon.c (name "nvme"; input, min, max, label on every sensor, crit and alarm on
the Composite one only).

Captured figures:
  * NVMe: `sensors` on a real drive, "nvme-pci-20100 ... Composite: +45.9°C (low = -5.2°C, high =
    +89.8°C) (crit = +93.8°C)" (tenstorrent/tt-kmd#25): the driver converts whole kelvins, so the
    files read 45850, -5150, 89850 and 93850.
  * mlx5: labels "asic" and "Module0" with inputs 65000 and 62000, read from
    /sys/class/infiniband/mlx5_0/device/hwmon/hwmon*/temp*_{label,input} on a ConnectX host
    (https://my.mbuzztech.com/portal/en/kb/articles/how-to-collect-infiniband-transceiver-temperature-non-root-method).
    The crit and highest figures beside them are this test's own (no capture shows them): the
    driver writes the MTMP register's reading times 125, so they are multiples of 125.
"""

from __future__ import annotations

import os
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from sparkcluster.node import hwmon, metrics

CX7_PCI = "0000:01:00.0"
NVME_PCI = "0002:01:00.0"


def _chip(sysfs: Path, parent: str, pci: str, hw: str, name: str, files: dict[str, str], child: tuple[str, str]):
    dev = sysfs / "devices" / parent / pci
    (dev / child[0] / child[1]).mkdir(parents=True)  # infiniband/mlx5_0 or nvme/nvme0 beside hwmon/
    chip = dev / "hwmon" / hw
    chip.mkdir(parents=True)
    (chip / "name").write_text(name + "\n")
    os.symlink(os.path.relpath(dev, chip), chip / "device")
    for f, text in files.items():
        (chip / f).write_text(text + "\n")
    (sysfs / "class" / "hwmon").mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(chip, sysfs / "class" / "hwmon"), sysfs / "class" / "hwmon" / hw)


def tree(tmp_path: Path) -> Path:
    sysfs = tmp_path / "sys"
    mlx5 = {
        "temp1_input": "65000",
        "temp1_label": "asic",
        "temp1_highest": "71000",
        "temp1_crit": "105000",
        "temp2_input": "62000",
        "temp2_label": "Module0",
        "temp2_highest": "64000",
        "temp2_crit": "75000",
    }
    _chip(sysfs, "pci0000:00/0000:00:00.0", CX7_PCI, "hwmon2", "mlx5", mlx5, ("infiniband", "mlx5_0"))
    nvme = {
        "temp1_input": "45850",
        "temp1_label": "Composite",
        "temp1_min": "-5150",
        "temp1_max": "89850",
        "temp1_crit": "93850",
        "temp1_alarm": "0",
        "temp2_input": "51850",
        "temp2_label": "Sensor 1",
        "temp2_min": "-273150",
        "temp2_max": "65261850",  # 0xFFFF kelvin: the drive's default for Sensor 1..8, no threshold
    }
    _chip(sysfs, "pci0002:00/0002:00:00.0", NVME_PCI, "hwmon3", "nvme", nvme, ("nvme", "nvme0"))
    other = sysfs / "class" / "hwmon" / "hwmon0"  # a thermal zone: not ours
    other.mkdir()
    (other / "name").write_text("acpitz\n")
    (other / "temp1_input").write_text("40000\n")
    return sysfs / "class" / "hwmon"


def test_the_cx7_and_the_drive_with_the_devices_own_thresholds(tmp_path):
    got = hwmon.sensors(hwmon.read_chips(str(tree(tmp_path))))
    by = {(s["device"], s["sensor"]): s for s in got}
    assert set(by) == {("mlx5_0", "asic"), ("mlx5_0", "Module0"), ("nvme0", "Composite"), ("nvme0", "Sensor 1")}
    asic = by[("mlx5_0", "asic")]
    assert (asic["kind"], asic["pci"], asic["celsius"], asic["highest_c"]) == ("cx7", CX7_PCI, 65.0, 71.0)
    # the device's crit (its own), the manual's 97 C warning beneath it (mlx5 exposes no max)
    assert (asic["crit_c"], asic["crit_from"], asic["max_c"], asic["max_from"]) == (105.0, "device", 97.0, "vendor")
    module = by[("mlx5_0", "Module0")]  # a transceiver: its own crit only, no vendor figure
    assert (module["celsius"], module["crit_c"], module["max_c"]) == (62.0, 75.0, None)
    comp = by[("nvme0", "Composite")]
    assert (comp["kind"], comp["celsius"], comp["max_c"], comp["crit_c"]) == ("nvme", 45.85, 89.85, 93.85)
    assert comp["max_from"] == comp["crit_from"] == "device"
    s1 = by[("nvme0", "Sensor 1")]  # FFFFh kelvin and no crit: no threshold, so no alert
    assert (s1["celsius"], s1["max_c"], s1["crit_c"]) == (51.85, None, None)
    assert [hwmon.hot(s) for s in got] == ["", "", "", ""]


def test_a_missing_or_garbage_file_is_skipped_never_raised(tmp_path):
    root = tree(tmp_path)
    chip = root.resolve() / "hwmon2"
    (chip / "temp1_crit").unlink()  # the chip's crit gone: the manual's 102 C
    (chip / "temp2_input").write_text("N/A\n")  # garbage: that sensor is left out
    nvme = (root / "hwmon3").resolve()
    (nvme / "temp1_max").write_text("\x00\xff")  # not a number
    (nvme / "temp2_input").unlink()
    got = {(s["device"], s["sensor"]): s for s in hwmon.sensors(hwmon.read_chips(str(root)))}
    assert set(got) == {("mlx5_0", "asic"), ("nvme0", "Composite")}
    asic = got[("mlx5_0", "asic")]
    assert (asic["crit_c"], asic["crit_from"], asic["max_c"]) == (102.0, "vendor", 97.0)
    assert (got[("nvme0", "Composite")]["max_c"], got[("nvme0", "Composite")]["crit_c"]) == (None, 93.85)
    assert hwmon.read_chips(str(tmp_path / "no-sysfs")) == {}


def test_a_device_without_its_pci_child_is_named_by_its_pci_address(tmp_path):
    root = tree(tmp_path)
    (tmp_path / "sys" / "devices" / "pci0002:00/0002:00:00.0" / NVME_PCI / "nvme" / "nvme0").rmdir()
    assert {c["device"] for c in hwmon.read_chips(str(root)).values()} == {"mlx5_0", NVME_PCI}


def test_hot_says_warning_at_max_and_critical_at_crit():
    s = {"celsius": 89.85, "max_c": 89.85, "crit_c": 93.85}
    assert hwmon.hot(s) == "warning"
    assert hwmon.hot({**s, "celsius": 93.85}) == "critical"
    assert hwmon.hot({**s, "celsius": 89.0}) == ""
    assert hwmon.hot({"celsius": 200.0, "max_c": None, "crit_c": None}) == ""


def test_readings_are_kept_between_reads_and_a_surprise_is_no_exception(tmp_path, monkeypatch):
    root = tree(tmp_path)
    now = [0.0]
    t = hwmon.Temperatures(str(root), every_s=30.0, clock=lambda: now[0])
    assert len(t.readings()) == 4
    (root.resolve() / "hwmon2" / "temp1_input").write_text("99000\n")
    now[0] = 10.0
    assert {s["celsius"] for s in t.readings() if s["sensor"] == "asic"} == {65.0}  # not read again yet
    now[0] = 31.0
    assert {s["celsius"] for s in t.readings() if s["sensor"] == "asic"} == {99.0}

    def broken(root):
        raise RuntimeError("sysfs said no")

    monkeypatch.setattr(hwmon, "read_chips", broken)
    now[0] = 62.0
    assert t.readings() == [] and "sysfs said no" in t.error


def test_the_metrics_carry_each_temperature_and_only_the_thresholds_it_has(tmp_path):
    sensors = hwmon.sensors(hwmon.read_chips(str(tree(tmp_path))))
    text = metrics.render(metrics.temperature_samples(sensors))
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    temps = {
        (s.labels["device"], s.labels["sensor"]): s.value
        for s in fams["sparkcluster_device_temperature_celsius"].samples
    }
    assert temps == {
        ("mlx5_0", "asic"): 65.0,
        ("mlx5_0", "Module0"): 62.0,
        ("nvme0", "Composite"): 45.85,
        ("nvme0", "Sensor 1"): 51.85,
    }
    maxes = {
        (s.labels["sensor"], s.labels["source"]): s.value
        for s in fams["sparkcluster_device_temperature_max_celsius"].samples
    }
    assert maxes == {("asic", "vendor"): 97.0, ("Composite", "device"): 89.85}
    crits = {s.labels["sensor"]: s.value for s in fams["sparkcluster_device_temperature_crit_celsius"].samples}
    assert crits == {"asic": 105.0, "Module0": 75.0, "Composite": 93.85}
    assert {s.labels["kind"] for s in fams["sparkcluster_device_temperature_celsius"].samples} == {"cx7", "nvme"}


def test_status_reads_the_same_sensors_through_its_shell_over_ssh(tmp_path):
    """`status` reads the host's sysfs in its one round trip (hwmon.shell, parsed by hwmon.listing):
    the same sensors as the agent's own reader, the thermal zone left out."""
    import subprocess

    root = tree(tmp_path)
    out = subprocess.run(["sh", "-c", hwmon.shell(str(root))], capture_output=True, text=True, check=True).stdout
    assert hwmon.sensors(hwmon.listing(out)) == hwmon.sensors(hwmon.read_chips(str(root)))
    assert "acpitz" not in out and hwmon.listing("chip junk\nfile hwmon9 temp1_input 1\n") == {}


def test_status_prints_each_nodes_sensors_coloured_at_their_thresholds(tmp_path):
    from rich.console import Console

    from sparkcluster.cli import status_cmd
    from sparkcluster.status import status as status_mod

    sensors = hwmon.sensors(hwmon.read_chips(str(tree(tmp_path))))
    sensors[2]["celsius"] = 91.0  # the drive's Composite over its own 89.85 C
    shown = status_mod.temperatures_shown(sensors)
    assert shown[0] == ("mlx5_0 asic 65 C", "")
    assert shown[2] == ("nvme0 Composite 91 C (warning at 89.85 C)", "warning")
    st = status_mod.ClusterStatus("pair", "healthy", [status_mod.NodeStatus("spark-a", temperatures=sensors)])
    console = Console(width=200, record=True, color_system=None)
    console.print(status_cmd.render(st))
    text = console.export_text()
    assert "temperatures: spark-a mlx5_0 asic 65 C, mlx5_0 Module0 62 C, nvme0 Composite 91 C (warning" in text


def test_the_consoles_nodes_show_each_nodes_sensor_nearest_its_threshold(tmp_path):
    """The head's report carries its own sensors and each peer's (agent.PEER_FIGURES): the console
    shows the one nearest its threshold, marked where the agent judged an alert would fire (the
    gateway ships without node/hwmon); junk is no judgement."""
    from types import SimpleNamespace

    from sparkcluster.gateway import console_view
    from sparkcluster.node import agent

    assert "temperatures" in agent.PEER_FIGURES
    sensors = hwmon.sensors(hwmon.read_chips(str(tree(tmp_path))))
    worker = [dict(s) for s in sensors]
    worker[2]["celsius"] = 94.0  # the drive's Composite over its CCTEMP (93.85 C), as its agent judged it
    worker[2]["alert"] = hwmon.hot(worker[2])
    worker[3]["alert"] = "<script>"  # junk from a peer: no mark
    report = {
        "node": "spark-a",
        "mem_available": 1,
        "mem_total": 2,
        "temperatures": sensors,
        "peers": {"spark-b": {"mem_available": 1, "mem_total": 2, "temperatures": worker}},
    }
    route = SimpleNamespace(report=report, nodes=["spark-a", "spark-b"], key="m")
    ns = {n.name: n for n in console_view.nodes([route])}
    html = console_view.nodes_table(list(ns.values()))
    # the transceiver, 13 C below its own crit, is nearer its threshold than the chip (32 C) or the drive (44 C)
    assert "<br>mlx5_0 Module0 62 °C</td>" in html
    assert "<span class='out'>nvme0 Composite 94 °C, critical</span>" in html
    assert hwmon.hot({"celsius": "hot", "max_c": 1}) == "" and hwmon.hot({"celsius": 5, "max_c": "x"}) == ""
