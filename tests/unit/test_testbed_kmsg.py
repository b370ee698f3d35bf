"""The testbed's kernel-log stand-in at the OS boundary (issue 75): testbed-runc binds each host's
stand-in file over /dev/kmsg in a container given the device (every testbed host shares one kernel),
and the node agent's reader reads the records Testbed.kernel_line writes in /dev/kmsg's format."""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path

from sparkcluster.container.spec import KMSG_DEVICE
from sparkcluster.node.kernel_log import KernelWatch

RUNC = Path(__file__).resolve().parents[1] / "testbed" / "standin_bin" / "testbed-runc"


def runc():
    loader = importlib.machinery.SourceFileLoader("testbed_runc", str(RUNC))
    spec = importlib.util.spec_from_loader("testbed_runc", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def test_a_container_given_dev_kmsg_reads_the_hosts_stand_in_instead(tmp_path, monkeypatch):
    mod = runc()
    stand_in = tmp_path / "kmsg"
    stand_in.write_text("")
    monkeypatch.setattr(mod, "KMSG", str(stand_in))
    assert KMSG_DEVICE.split(":")[0] == "/dev/kmsg"
    cfg = {"process": {}, "linux": {"devices": [{"path": "/dev/kmsg", "type": "c", "major": 1, "minor": 11}]}}
    mod._edit(cfg)
    assert cfg["linux"]["devices"] == []
    assert {"destination": "/dev/kmsg", "type": "bind", "source": str(stand_in), "options": ["bind", "ro"]} in cfg[
        "mounts"
    ]
    plain = {"process": {}, "linux": {"devices": []}}
    mod._edit(plain)
    assert all(m["destination"] != "/dev/kmsg" for m in plain["mounts"])


def test_the_agent_reads_the_records_the_testbed_writes(tmp_path):
    stand_in = tmp_path / "kmsg"
    stand_in.write_text("")
    w = KernelWatch(str(stand_in), clock=lambda: 1000.0, uptime=lambda: 50.0)
    assert w.look() == []
    # what Testbed.kernel_line appends for the captured line (tests/captured/kernel/xid79-nvsentinel-155.dmesg)
    with open(stand_in, "a") as f:
        f.write("3,0,49000000,-;NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus\n")
    (ev,) = w.look()
    assert ev["code"] == "79" and ev["ts"] == 999.0
