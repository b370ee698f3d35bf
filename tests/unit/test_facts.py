"""facts: the probe script as text, its sections parsed back, and the path-MTU pairing."""

from __future__ import annotations

import shlex
import shutil
import subprocess

import pytest
from conftest import LINKS, cap, carrier_text, hca_text, inventory_dict, link_ip, make_inventory, spark_ip_json

from sparkcluster import facts
from sparkcluster.errors import StageError
from sparkcluster.facts import parsers, probes
from sparkcluster.remote.result import CommandResult

H, W = "spark-head", "spark-worker"


def sections(pairs: list[tuple[str, int, str]]) -> str:
    """Output in the shape probe_script's sections print."""
    return "".join(
        f"{probes.SECTION} {name}\n{out}{'' if out.endswith(chr(10)) or not out else chr(10)}"
        f"{probes.SECTION} {name} rc={rc}\n"
        for name, rc, out in pairs
    )


# --- split_sections / parse on real output ------------------------------------------------------


def test_split_sections_captured_probe():
    s = probes.split_sections(cap("vm-probe.txt"))
    assert list(s) == [
        "hostname",
        "time",
        "gpu",
        "docker",
        "gpu_hook",
        "ip",
        "carrier",
        "hca",
        "meminfo",
        "earlyoom",
        "sshd_oom",
        "listeners",
        "containers",
        "ours",
        "disk",
        "ray_sessions",
        "image",
        "image_ray",
    ]
    assert s["hostname"] == probes.Section(0, "vm")
    assert s["gpu"].rc == 127 and "nvidia-smi: command not found" in s["gpu"].out
    assert s["image_ray"].rc == 3  # the image is not there: not an error of its own
    assert s["earlyoom"] == probes.Section(1, "")


def test_split_sections_truncated_output_drops_the_open_section():
    text = cap("vm-probe.txt")
    cut = text[: text.index(f"{probes.SECTION} meminfo rc=")]
    s = probes.split_sections(cut)
    assert "meminfo" not in s and "hca" in s


def test_split_sections_marker_like_text_inside_a_section():
    text = sections([("a", 0, f"{probes.SECTION} b rc=5\nline"), ("c", 2, "x")])
    s = probes.split_sections(text)
    # a stray end marker of another section does not close this one (it opens "b rc=5")
    assert s["c"] == probes.Section(2, "x")


def test_parse_captured_probe_vm_without_gpu_or_dockerd():
    inv = make_inventory()
    node = inv.node(H)
    stamp = float(probes.split_sections(cap("vm-probe.txt"))["time"].out)
    f = facts.parse(node, cap("vm-probe.txt"), stamp - 1.0, stamp + 1.0)
    assert f.node == H and f.hostname == "vm"
    assert f.clock_offset == pytest.approx(0.0, abs=1e-3)
    assert f.gpus == [] and "nvidia-smi: command not found" in f.gpu_error
    assert f.docker is None and f.docker_error.startswith("Cannot connect to the Docker daemon")
    assert f.gpu_hook == ""
    assert f.interfaces["eth0"].mtu == 1400
    assert f.hcas == {}
    assert f.mem.available > 0 and f.earlyoom is False and f.sshd_oom_score_adj is None
    assert [(x.port, x.process, x.container) for x in f.listeners] == [(8000, "python3", "")]
    assert f.containers == [] and f.ours == []
    assert list(f.disks) == ["/"]
    assert f.ray_sessions == []
    assert f.image_id is None and f.image_ray is None and f.image_ray_error == ""


def test_parse_gb10_probe():
    inv = make_inventory()
    inspect = cap("gb10-docker-inspect-head.json")
    text = sections(
        [
            ("hostname", 0, "spark-head"),
            ("time", 0, "1795317600.250000000"),
            ("gpu", 0, cap("gb10-nvidia-smi.csv")),
            ("docker", 0, cap("gb10-docker-info.json")),
            ("gpu_hook", 0, "/usr/bin/nvidia-container-runtime-hook"),
            ("ip", 0, spark_ip_json(1)),
            ("carrier", 0, carrier_text() + "enp1s0f0np0x - -\n"),
            ("hca", 0, hca_text()),
            ("meminfo", 0, cap("vm-meminfo.txt")),
            ("earlyoom", 0, "1234"),
            ("sshd_oom", 0, "-1000"),
            ("listeners", 0, ""),
            ("containers", 0, cap("gb10-docker-ps.jsonl")),
            ("ours", 0, inspect),
            ("disk", 0, cap("vm-df.txt")),
            ("ray_sessions", 0, "/tmp/ray/session_2026-11-21_22-03-55_118733_1\n/tmp/ray/session_latest"),
            ("image", 0, "sha256:3f9c2d1e8b7a6f5e4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b5b1c0e7f2a9d4c3b8e"),
            (
                "image_ray",
                0,
                "2026-11-21 22:41:09,118\tINFO usage_lib.py:441 -- Usage stats collection is enabled.\nray, version 2.49.2",
            ),
        ]
    )
    f = facts.parse(inv.node(H), text, 1795317600.0, 1795317600.0)
    assert f.clock_offset == pytest.approx(0.25)
    assert f.gpus[0].name == "NVIDIA GB10" and f.gpus[0].memory_total == "[N/A]"
    assert "nvidia" in f.docker.runtimes
    for nd, _, k in LINKS:
        i = f.interfaces[nd]
        assert (i.mtu, i.carrier, i.speed_mbps) == (9000, True, 200000)
        assert [str(a.ip) for a in i.addresses] == [link_ip(k, 1)]
    assert f.interfaces["docker0"].carrier is None  # not asked about
    assert all(h.active for h in f.hcas.values()) and len(f.hcas) == 4
    assert f.earlyoom and f.sshd_oom_score_adj == -1000
    assert [c.name for c in f.containers] == ["sparkcluster-pair-head", "vllm_node"]
    assert f.ours[0].name == "sparkcluster-pair-head"
    assert f.image_ray == "ray, version 2.49.2"
    assert len(f.ray_sessions) == 2


def test_parse_image_ray_failure_and_missing_sections():
    inv = make_inventory()
    text = sections([("image", 0, "sha256:abc"), ("image_ray", 127, 'exec: "ray": executable file not found in $PATH')])
    f = facts.parse(inv.node(W), text, 0.0, 0.0)
    assert f.image_id == "sha256:abc" and f.image_ray is None
    assert "executable file not found" in f.image_ray_error
    # every other section missing: values, not exceptions
    assert f.gpus == [] and f.gpu_error == "nvidia-smi exited 127"
    assert f.docker is None and f.docker_error == "docker info exited 127"
    assert f.clock_offset is None and f.mem is None and f.interfaces == {}


def test_parse_sshd_oom_garbage():
    f = facts.parse(
        make_inventory().node(H), sections([("sshd_oom", 0, "cat: /proc//oom_score_adj: No such file")]), 0, 0
    )
    assert f.sshd_oom_score_adj is None


# --- probe_script as a string -------------------------------------------------------------------

NASTY_HF = "/srv/hf cache/$(touch /tmp/sc-pwned);`id`'x"
NASTY_IMAGE = "repo/img:tag;touch /tmp/sc-pwned2"


def nasty_inventory():
    d = inventory_dict()
    d["cluster"]["hf_cache"] = NASTY_HF
    return make_inventory(d)


def test_probe_script_quotes_user_values():
    inv = nasty_inventory()
    script = facts.probe_script(inv, inv.node(H), NASTY_IMAGE)
    assert shlex.quote(NASTY_HF) in script
    assert shlex.quote(NASTY_IMAGE) in script
    # never unquoted: with the quoted forms removed, nothing of the values is left
    rest = script.replace(shlex.quote(NASTY_HF), "").replace(shlex.quote(NASTY_IMAGE), "")
    assert "sc-pwned" not in rest and "hf cache" not in rest
    label = shlex.quote("org.sparkcluster.cluster=pair")
    assert f"--filter label={label}" in script


def test_probe_script_asks_for_the_inventory_interfaces_and_ports():
    d = inventory_dict()
    d["cluster"].update(api_port=8123, ray_port=6380)
    inv = make_inventory(d)
    script = facts.probe_script(inv, inv.node(W), None)
    # control_if first, no duplicates (it is also a data-plane link)
    assert "for i in enp1s0f1np1 enp1s0f0np0 enP2p1s0f0np0 enP2p1s0f1np1; do" in script
    assert "sport = :6380 or sport = :8123" in script
    assert "image" not in probes.split_sections(script.replace('; echo "', '\necho "'))  # no image sections
    assert "docker image inspect" not in script


@pytest.mark.skipif(not shutil.which("bash"), reason="needs bash")
def test_probe_script_runs_and_does_not_execute_values(tmp_path):
    d = inventory_dict()
    hf = tmp_path / "hf cache" / "$(touch INJECTED)"
    d["cluster"]["hf_cache"] = str(hf)
    inv = make_inventory(d)
    script = facts.probe_script(inv, inv.node(H), "img;touch INJECTED2")
    subprocess.run(["bash", "-n", "-c", script], check=True)
    res = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert not (tmp_path / "INJECTED").exists() and not (tmp_path / "INJECTED2").exists()
    s = probes.split_sections(res.stdout)
    assert {"hostname", "meminfo", "disk"} <= set(s)
    assert s["meminfo"].rc == 0
    assert parsers.df_lines(s["disk"].out)  # the HF cache's filesystem (or its nearest existing parent's)


# --- path MTU -----------------------------------------------------------------------------------


def two_spark_facts(worker_links=None) -> dict[str, facts.HostFacts]:
    out = {}
    for name, host, links in ((H, 1, None), (W, 2, worker_links)):
        out[name] = facts.HostFacts(node=name, interfaces=parsers.ip_addr_json(spark_ip_json(host, links)))
    return out


def test_path_mtu_probes_pair_by_subnet_both_directions():
    inv = make_inventory()
    got = two_spark_facts()
    head = facts.path_mtu_probes(inv.node(H), got)
    worker = facts.path_mtu_probes(inv.node(W), got)
    assert head == [facts.PathMtuPing(nd, W, link_ip(k, 2), 8972) for nd, _, k in LINKS]
    assert worker == [facts.PathMtuPing(nd, H, link_ip(k, 1), 8972) for nd, _, k in LINKS]
    # docker0 (172.17/16 on both) is not a data-plane link: never probed
    assert all(not p.peer_ip.startswith("172.17.") for p in head + worker)


def test_path_mtu_probes_worker_cabled_differently():
    # the worker's cables sit in the other ports: same subnets, other netdev names
    swapped = [
        ("enp1s0f1np1", "rocep1s0f1", 1),
        ("enp1s0f0np0", "rocep1s0f0", 2),
        ("enP2p1s0f1np1", "roceP2p1s0f1", 3),
        ("enP2p1s0f0np0", "roceP2p1s0f0", 4),
    ]
    inv = make_inventory()
    got = two_spark_facts(swapped)
    pairs = {(p.netdev, p.peer_ip) for p in facts.path_mtu_probes(inv.node(H), got)}
    assert pairs == {(nd, link_ip(k, 2)) for nd, _, k in LINKS}
    back = {(p.netdev, p.peer_ip) for p in facts.path_mtu_probes(inv.node(W), got)}
    assert back == {(nd, link_ip(k, 1)) for nd, _, k in swapped}


def test_path_mtu_probes_uses_node_mtu_and_skips_unpaired():
    d = inventory_dict()
    d["nodes"][0]["mtu"] = 4200
    inv = make_inventory(d)
    got = two_spark_facts()
    del got[H].interfaces["enP2p1s0f1np1"]  # missing locally
    got[W].interfaces["enP2p1s0f0np0"].addresses = []  # no peer address on link 3
    probes = facts.path_mtu_probes(inv.node(H), got)
    assert [p.netdev for p in probes] == ["enp1s0f0np0", "enp1s0f1np1"]
    assert {p.size for p in probes} == {4172}


def test_ping_command_and_script_are_quoted():
    p = facts.PathMtuPing("enP2p1s0f0np0", W, "198.19.3.2", 8972)
    assert facts.ping_command(p) == "ping -M do -c 1 -W 1 -s 8972 -I enP2p1s0f0np0 198.19.3.2"
    assert shlex.split(facts.ping_command(p)) == [
        "ping",
        "-M",
        "do",
        "-c",
        "1",
        "-W",
        "1",
        "-s",
        "8972",
        "-I",
        "enP2p1s0f0np0",
        "198.19.3.2",
    ]
    script = facts.path_mtu_script([p, facts.PathMtuPing("enp1s0f0np0", W, "198.19.1.2", 8972)])
    assert script.count("ping -M do") == 2
    assert f"echo '{probes.SECTION} ping enP2p1s0f0np0 198.19.3.2'" in script
    assert facts.path_mtu_script([]) == "\n"


class FakeHost:
    def __init__(self, stdout: str, timed_out: bool = False):
        self.stdout, self.timed_out = stdout, timed_out
        self.name = H
        self.node = make_inventory().node(H)
        self.ran: list[str] = []

    def run(self, cmd, timeout=30.0, stdin=None, warn=False):
        self.ran.append(cmd)
        return CommandResult(self.name, "script", -1 if self.timed_out else 0, self.stdout, "", 0.1, self.timed_out)


def test_gather_path_mtu_from_captured_pings():
    probes = [
        facts.PathMtuPing("lo", "peer", "127.0.0.1", 8972),
        facts.PathMtuPing("eth0", "gw", "192.0.2.1", 1472),
        facts.PathMtuPing("vlan9", "x", "10.9.9.9", 1472),
    ]  # last: no section in the output
    host = FakeHost(cap("vm-path-mtu.txt"))
    got = facts.gather_path_mtu(host, probes)
    assert host.ran == [facts.path_mtu_script(probes)]
    lo, eth0, vlan9 = got
    assert lo.ok and lo.size == 8972 and lo.command == facts.ping_command(probes[0])
    assert not eth0.ok
    assert not vlan9.ok and vlan9.detail == "no result: the probe did not finish"
    assert facts.gather_path_mtu(host, []) == []


def test_gather_path_mtu_keeps_every_probe_of_one_netdev():
    # real: two probes out of eth0, the first too large, the second to an absent peer; a third, passing
    # one on eth0 must not hide them (each probe is its own result, in order)
    probes = [
        facts.PathMtuPing("eth0", "gw", "192.0.2.1", 1472),
        facts.PathMtuPing("eth0", "x", "192.0.2.77", 1372),
        facts.PathMtuPing("lo", "peer", "127.0.0.1", 8972),
    ]
    got = facts.gather_path_mtu(FakeHost(cap("vm-path-mtu.txt")), probes)
    assert [(p.netdev, p.peer_ip, p.ok) for p in got] == [
        ("eth0", "192.0.2.1", False),
        ("eth0", "192.0.2.77", False),
        ("lo", "127.0.0.1", True),
    ]
    assert "mtu=1400" in got[0].detail


def test_gather_parses_and_times_out():
    inv = make_inventory()
    f = facts.gather(FakeHost(cap("vm-probe.txt")), inv, None)
    assert f.hostname == "vm" and f.clock_offset is not None
    with pytest.raises(StageError) as e:
        facts.gather(FakeHost("", timed_out=True), inv, None, timeout=3)
    assert "timed out after 3s" in e.value.message


def test_parse_testbed_probe():
    inv = make_inventory()
    text = cap("testbed-head-probe.txt")
    stamp = float(probes.split_sections(text)["time"].out)
    f = facts.parse(inv.node(H), text, stamp, stamp)
    assert f.hostname == "spark-head" and f.clock_offset == pytest.approx(0.0)
    assert f.gpus == [parsers.Gpu("NVIDIA GB10", "580.95.05", "[N/A]", "12.1")]
    assert f.docker is not None and f.docker.root_dir == "/var/lib/docker"
    assert set(f.hcas) == {hca for _, hca, _ in LINKS} and all(h.active for h in f.hcas.values())
    assert {h.name: h.netdevs for h in f.hcas.values()} == {hca: (nd,) for nd, hca, _ in LINKS}
    for nd, _, k in LINKS:
        assert f.interfaces[nd].mtu == 9000
        assert [str(a.ip) for a in f.interfaces[nd].addresses] == [link_ip(k, 1)]
    # at capture time one link had no carrier file: unknown, not False
    assert f.interfaces["enP2p1s0f0np0"].carrier is None
    assert f.interfaces["enp1s0f1np1"].carrier is True and f.interfaces["enp1s0f1np1"].speed_mbps == 10000
    assert f.sshd_oom_score_adj == 0 and not f.earlyoom
    assert list(f.disks) == ["/var/lib/docker", "/root/.cache"]
    assert f.image_id.startswith("sha256:") and f.image_ray == "ray, version 2.60.0"
    assert f.ours == [] and f.containers == [] and f.listeners == []


def test_the_gateways_container_is_not_among_the_deployments_containers():
    """Issue 36: `up`, its plan and the checks read `ours` as the deployments' containers; the
    gateway's (same cluster label, role "gateway") has its own lifecycle and is left out."""
    import json

    from sparkcluster.labels import CLUSTER_LABEL, GATEWAY_ROLE, ROLE_LABEL

    listed = [
        {"Name": "/sparkcluster-pair-gateway", "Config": {"Labels": {CLUSTER_LABEL: "pair", ROLE_LABEL: GATEWAY_ROLE}}},
        {"Name": "/sparkcluster-pair-head", "Config": {"Labels": {CLUSTER_LABEL: "pair", ROLE_LABEL: "head"}}},
    ]
    text = cap("vm-probe.txt")
    start = text.index("@@sc@@ ours\n")
    end = text.index("@@sc@@ ours rc=0")
    text = text[:start] + "@@sc@@ ours\n" + json.dumps(listed) + "\n" + text[end:]
    inv = make_inventory()
    stamp = float(probes.split_sections(text)["time"].out)
    f = facts.parse(inv.node(H), text, stamp - 1.0, stamp + 1.0)
    assert [c.name for c in f.ours] == ["sparkcluster-pair-head"]
