"""The kernel's log read by every node's agent (node/kernel_log, issue 75): captured real Xid, OOM-kill,
mlx5 and AER lines (tests/captured/kernel/, sources in tests/captured/README.md) classified, and the
reader fed a file in /dev/kmsg's record format (Documentation/ABI/testing/dev-kmsg)."""

from __future__ import annotations

import os
from pathlib import Path

from sparkcluster.node import kernel_log
from sparkcluster.node.kernel_log import KernelWatch, Parser, fresh_faults, summary, with_kernel

KERNEL = Path(__file__).resolve().parents[1] / "captured" / "kernel"


def events(name: str) -> list[dict]:
    p = Parser()
    return [e for e in (p.feed(line) for line in (KERNEL / name).read_text().splitlines()) if e]


def test_xid_79_from_the_journal_is_one_event_with_nvidias_meaning():
    (ev,) = events("xid79-ogkm-1151.journal")
    assert ev["kind"] == "xid" and ev["code"] == "79" and ev["pci"] == "0000:2b:00"
    assert ev["meaning"] == "the GPU has fallen off the bus"
    assert summary(ev) == "Xid 79 (the GPU has fallen off the bus)"
    (bare,) = events("xid79-nvsentinel-155.dmesg")
    assert bare["code"] == "79" and bare["pci"] == "0000:44:00"


def test_an_xid_without_a_cited_meaning_names_the_catalogue():
    ev = Parser().feed("NVRM: Xid (PCI:0000:01:00): 109, pid=1234, name=python3, Ch 00000008")
    assert ev["code"] == "109" and ev["meaning"] == "" and ev["process"] == "python3" and ev["pid"] == "1234"
    assert kernel_log.XID_CATALOG_URL in summary(ev) and "process python3" in summary(ev)


def test_an_oom_kill_names_its_process_and_its_container():
    (ev,) = events("oom-kill-install-docker-14.dmesg")
    assert ev["kind"] == "oom" and ev["process"] == "java" and ev["pid"] == "7134"
    assert ev["container"] == "00748bf4e957" and ev["scope"] == "global"
    assert summary(ev) == "an OOM kill of java (pid 7134) in container 00748bf4e957"


def test_a_killed_process_line_alone_is_the_kill_and_after_its_oom_kill_line_is_not_a_second():
    (ev,) = events("oom-killed-for-linux-1001.journal")  # the reaper's line is not a kill
    assert ev["process"] == "python3" and ev["pid"] == "15617" and ev["container"] == ""
    p = Parser()
    first = (KERNEL / "oom-kill-install-docker-14.dmesg").read_text().strip()
    assert p.feed(first) is not None
    assert p.feed("Out of memory: Killed process 7134 (java) total-vm:1kB, anon-rss:1kB") is None


def test_mlx5_errors_and_link_changes():
    (cqe,) = events("mlx5-cqe-nvme-cli-3268.dmesg")  # two lines of one completion error: the syndrome's
    assert cqe["kind"] == "mlx5" and cqe["device"] == "rocep33s0f0"
    links = events("mlx5-link-gpud-1209.journal")
    assert [(e["kind"], e["code"], e["device"], e["port"]) for e in links] == [
        ("link", "init", "mlx5_5", "1"),
        ("link", "active", "mlx5_5", "1"),
    ]


def test_aer_reports_one_event_per_bus_error_with_the_sysfs_severity():
    for name in ("aer-pop-751.dmesg", "aer-raspberry-pi-pcie-64.dmesg"):
        (ev,) = events(name)
        assert ev["kind"] == "aer" and ev["code"] == "correctable" and ev["device"] == "0000:00:1d.0"
        assert ev["type"] == "Physical Layer"
    assert kernel_log.severity_of("Uncorrected (Fatal)") == "fatal"
    assert kernel_log.severity_of("Uncorrected (Non-Fatal)") == "nonfatal"


def kmsg(lines: list[str], usec: int) -> str:
    return "".join(f"3,{i},{usec},-;{line}\n" for i, line in enumerate(lines))


def test_the_reader_reads_kmsg_records_once_each_and_dates_them(tmp_path):
    path = tmp_path / "kmsg"
    old = "oom-kill:constraint=CONSTRAINT_NONE,global_oom,task_memcg=/,task=old,pid=1,uid=0"
    path.write_text(kmsg([old], 1_000_000))  # 1 s after boot: long before this agent
    w = KernelWatch(str(path), clock=lambda: 10_000.0, uptime=lambda: 5_000.0)
    assert w.look() == [] and not w.counts and w.before == 1  # history: neither counted nor journalled
    xid = (KERNEL / "xid79-ogkm-1151.journal").read_text().splitlines()[1].split("kernel: ", 1)[1]
    with open(path, "a") as f:
        f.write(kmsg([xid, "usb 1-1: new device"], 4_990_000_000) + " SUBSYSTEM=pci\n")
    (ev,) = w.look()
    assert ev["code"] == "79" and ev["ts"] == 9_990.0 and w.look() == []
    rep = w.report()
    assert rep["error"] == "" and {"kind": "xid", "code": "79", "count": 1} in rep["counts"]


def test_a_reader_without_the_right_says_why(tmp_path):
    path = tmp_path / "kmsg"
    path.write_text("")
    os.chmod(path, 0)
    w = KernelWatch(str(path))
    if os.geteuid() != 0:  # root reads it anyway
        assert w.look() == [] and "CAP_SYSLOG" in w.report()["error"]
    missing = KernelWatch(str(tmp_path / "absent"))
    assert missing.look() == [] and "No such file" in missing.report()["error"]


def test_a_verdicts_cause_names_each_nodes_fresh_xid_or_oom_kill():
    (xid,) = events("xid79-ogkm-1151.journal")
    (oom,) = events("oom-kill-install-docker-14.dmesg")
    xid["ts"], oom["ts"] = 100.0, 50.0
    link = {"kind": "link", "code": "down", "ts": 120.0}
    assert fresh_faults([oom, xid, link], since=60.0) == [xid]
    cause = with_kernel("no progress for 60s", {"worker": [xid], "head": []})
    assert cause == "no progress for 60s; the kernel reported worker: Xid 79 (the GPU has fallen off the bus)"
    assert with_kernel("x", {}) == "x"


def test_the_agent_journals_each_new_event_with_the_kernels_time_as_at(tmp_path):
    import json

    from sparkcluster.node import agent
    from sparkcluster.node.journal import Journal

    path = tmp_path / "kmsg"
    path.write_text("")
    w = KernelWatch(str(path), clock=lambda: 1000.0, uptime=lambda: 50.0)
    j = Journal(str(tmp_path / "journal.jsonl"))
    agent.watch_kernel(w, j, "spark-b")
    with open(path, "a") as f:
        f.write(kmsg([(KERNEL / "xid79-nvsentinel-155.dmesg").read_text().strip()], 49_500_000))
    agent.watch_kernel(w, j, "spark-b")
    (entry,) = [json.loads(x) for x in (tmp_path / "journal.jsonl").read_text().splitlines()]
    assert entry["event"] == "kernel event" and entry["node"] == "spark-b" and entry["at"] == 999.5
    assert entry["kind"] == "xid" and entry["code"] == "79"
