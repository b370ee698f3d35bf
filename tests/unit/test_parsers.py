"""Every parser in sparkcluster.facts.parsers, fed the text real commands printed (tests/captured)."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

import pytest

from sparkcluster.facts import parsers, probes

CAPTURED = Path(__file__).resolve().parents[1] / "captured"


def cap(name: str) -> str:
    return (CAPTURED / name).read_text()


def probe_section(name: str) -> probes.Section:
    return probes.split_sections(cap("vm-probe.txt"))[name]


# --- small helpers ------------------------------------------------------------------------------


def test_last_line_skips_trailing_blank_lines():
    assert parsers.last_line(cap("vm-ping-eth0-1472-toolarge.txt")).startswith(
        "1 packets transmitted, 0 received, +1 errors"
    )
    assert parsers.last_line("") == ""
    assert parsers.last_line("\n  \n") == ""


def test_json_list_docker_inspect():
    got = parsers.json_list(cap("gb10-docker-inspect-head.json"))
    assert len(got) == 1
    assert got[0]["Name"] == "/sparkcluster-pair-head"
    assert got[0]["State"]["Running"] is True


def test_docker_inspect_typed_view():
    (c,) = parsers.docker_inspect_json(cap("gb10-docker-inspect-head.json"))
    raw = json.loads(cap("gb10-docker-inspect-head.json"))[0]
    assert (c.id, c.name, c.image, c.image_id) == (
        raw["Id"],
        "sparkcluster-pair-head",
        raw["Config"]["Image"],
        raw["Image"],
    )
    assert c.running and c.status == "running" and c.exit_code == 0 and c.restart_count == 0
    assert c.started_at == raw["State"]["StartedAt"]
    assert c.labels == raw["Config"]["Labels"] and c.labels["org.sparkcluster.role"] == "head"
    # Env as docker lists it (NAME=value); a value holding "=" is kept whole
    assert len(c.env) == len(raw["Config"]["Env"])
    assert all(f"{k}={v}" in raw["Config"]["Env"] for k, v in c.env.items())
    assert parsers.container_inspect({"Config": {"Env": ["A=b=c", "NOVALUE"]}}).env == {"A": "b=c"}
    assert c.flags["NetworkMode"] == "host" and c.flags["Memory"] == 0
    assert c.flags["Devices"] == [("/dev/infiniband", "/dev/infiniband")]
    assert parsers.docker_inspect_json("[]\n") == []


def test_docker_inspect_flags_read_the_cli_and_the_api_alike():
    (cli,) = parsers.docker_inspect_json(cap("testbed-head-docker-inspect.json"))
    assert cli.flags["CapAdd"] == ["IPC_LOCK"]  # the CLI stores CAP_IPC_LOCK
    assert ("memlock", -1, -1) in cli.flags["Ulimits"]
    assert not cli.running and cli.status == "created"
    # the Engine API's inspect of a container it never saw start: no State, no Config at all
    assert parsers.container_inspect({"Id": "x"}) == parsers.ContainerInspect(
        id="x", flags=parsers.container_inspect({}).flags
    )


def test_json_list_single_object_becomes_list():
    assert parsers.json_list('{"a": 1}') == [{"a": 1}]


def test_json_list_empty_is_empty():
    assert parsers.json_list("") == []
    assert parsers.json_list("[]\n") == []


def test_json_list_with_docker_daemon_down():
    # real: the probe's "ours" section when dockerd is not running: stderr, then the fallback "[]"
    sec = probe_section("ours")
    assert sec.out.splitlines()[0].startswith("Cannot connect to the Docker daemon")
    assert parsers.json_list(sec.out) == []


# --- nvidia-smi ---------------------------------------------------------------------------------


def test_nvidia_smi_gb10_memory_na():
    gpus = parsers.nvidia_smi_csv(cap("gb10-nvidia-smi.csv"))
    assert gpus == [parsers.Gpu("NVIDIA GB10", "580.95.05", "[N/A]", "12.1")]


def test_nvidia_smi_several_gpus_and_junk():
    text = "NVIDIA H100 80GB HBM3, 550.54.15, 81559 MiB, 9.0\nNVIDIA H100 80GB HBM3, 550.54.15, 81559 MiB, 9.0\n\nbad line\n"
    gpus = parsers.nvidia_smi_csv(text)
    assert [g.memory_total for g in gpus] == ["81559 MiB", "81559 MiB"]


def test_nvidia_smi_missing_prints_nothing_parseable():
    # real: the probe's gpu section on a host without nvidia-smi
    sec = probe_section("gpu")
    assert sec.rc == 127
    assert parsers.nvidia_smi_csv(sec.out) == []


# --- docker -------------------------------------------------------------------------------------


def test_docker_info_gb10():
    d = parsers.docker_info(cap("gb10-docker-info.json"))
    assert d == parsers.DockerInfo(
        "28.3.3",
        "/var/lib/docker",
        ("io.containerd.runc.v2", "nvidia", "runc"),
        "runc",
        (
            ("Backing Filesystem", "extfs"),
            ("Supports d_type", "true"),
            ("Using metacopy", "false"),
            ("Native Overlay Diff", "true"),
            ("userxattr", "false"),
        ),
    )
    # Docker 28.3 on a Spark keeps the classic overlay2 store: docker load skips the layers it holds
    from sparkcluster.movement import transfer

    assert transfer.elides(d.driver_status)


def test_docker_info_containerd_image_store():
    # the shape `docker info` has with the containerd image store (DriverStatus names the snapshotter)
    d = parsers.docker_info(
        '{"ServerVersion": "29.0.0", "Driver": "overlayfs", '
        '"DriverStatus": [["driver-type", "io.containerd.snapshotter.v1"]]}'
    )
    from sparkcluster.movement import transfer

    assert not transfer.elides(d.driver_status)


def test_image_layers_and_layer_chains():
    a, b = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    il = parsers.image_layers(f'sha256:{"f" * 64} ["{a}","{b}"]\n3000003\n0\n500000\n')
    assert il.id == "sha256:" + "f" * 64 and il.layers == (a, b) and il.sizes == (3000003, 500000)
    # one layer of size 0 among them: the mapping is not sure, so no sizes
    assert parsers.image_layers(f'sha256:{"f" * 64} ["{a}","{b}"]\n3000003\n0\n').sizes is None
    assert parsers.layer_chains(f'["{a}","{b}"]\n["{a}"]\nnull\n["sha2\n') == [[a, b], [a], []]
    assert parsers.image_layers("Error: No such image: x\n") is None
    assert parsers.image_layers("sha256:x [not json\n") is None


def test_docker_info_with_warning_line_first():
    d = parsers.docker_info("WARNING: bridge-nf-call-iptables is disabled\n" + cap("gb10-docker-info.json"))
    assert d.server_version == "28.3.3"


def test_docker_info_daemon_down_is_empty_not_crash():
    # real: docker CLI 28 prints a JSON of empty fields on stdout when the daemon is down (rc 1)
    sec = probe_section("docker")
    assert sec.rc == 1
    d = parsers.docker_info(sec.out)
    assert d.server_version == "" and d.runtimes == ()


def test_docker_ps_json():
    cs = parsers.docker_ps_json(cap("gb10-docker-ps.jsonl"))
    assert [c.name for c in cs] == ["sparkcluster-pair-head", "vllm_node"]
    head, old = cs
    assert head.state == "running" and old.state == "exited"
    assert len(head.id) == 64
    # --no-trunc wraps the command in quotes; the parser strips them
    assert head.command.startswith("/opt/nvidia/nvidia_entrypoint.sh ray start --head")
    assert head.labels["org.sparkcluster.cluster"] == "pair"
    assert head.labels["org.sparkcluster.role"] == "head"
    assert old.labels == {"com.nvidia.volumes.needed": "nvidia_driver"}


def test_docker_ps_json_daemon_down():
    sec = probe_section("containers")
    assert sec.rc == 1
    assert parsers.docker_ps_json(sec.out) == []


def test_labels_value_with_equals_sign():
    assert parsers._labels("a=b=c,d=") == {"a": "b=c", "d": ""}
    assert parsers._labels("") == {}


# --- network ------------------------------------------------------------------------------------


def test_ip_addr_json_vm():
    ifs = parsers.ip_addr_json(cap("vm-ip-addr.json"))
    assert set(ifs) == {"lo", "ifb0", "ifb1", "eth0"}
    eth0 = ifs["eth0"]
    assert (eth0.mtu, eth0.up, eth0.lower_up, eth0.operstate) == (1400, True, True, "UP")
    # IPv4 only; the inet6 entries are ignored
    assert eth0.addresses == [
        parsers.Address(ipaddress.IPv4Address("192.0.2.2"), ipaddress.IPv4Network("192.0.2.0/24"))
    ]
    assert ifs["ifb0"].up is False and ifs["ifb0"].lower_up is False and ifs["ifb0"].addresses == []
    assert ifs["lo"].mtu == 65536
    assert eth0.carrier is None and eth0.speed_mbps is None  # filled in from the carrier section


def test_ip_addr_json_seed_capture_and_empty():
    assert "eth0" in parsers.ip_addr_json(cap("host-ip-addr.json"))
    assert parsers.ip_addr_json("") == {}


def test_ip_addr_json_secondary_address():
    data = json.loads(cap("vm-ip-addr.json"))
    eth0 = next(d for d in data if d["ifname"] == "eth0")
    eth0["addr_info"].append({"family": "inet", "local": "198.19.2.1", "prefixlen": 24, "scope": "global"})
    ifs = parsers.ip_addr_json(json.dumps(data))
    assert [str(a.ip) for a in ifs["eth0"].addresses] == ["192.0.2.2", "198.19.2.1"]


def test_carrier_lines_captured():
    # real: eth0 has carrier, the virtio NIC reports speed -1 (unknown)
    assert parsers.carrier_lines(probe_section("carrier").out) == [("eth0", True, None)]


def test_carrier_lines_missing_and_speed():
    text = "enp1s0f0np0 1 200000\nenp1s0f1np1 0 -1\nenP2p1s0f0np0 - -\nbroken\n"
    assert parsers.carrier_lines(text) == [
        ("enp1s0f0np0", True, 200000),
        ("enp1s0f1np1", False, None),
        ("enP2p1s0f0np0", None, None),
    ]


def test_hca_lines():
    text = "rocep1s0f0|4: ACTIVE|enp1s0f0np0 \nrocep1s0f1|1: DOWN|enp1s0f1np1 \nroceP2p1s0f0|4: ACTIVE|\ngarbage\n"
    h = parsers.hca_lines(text)
    assert h["rocep1s0f0"] == parsers.Hca("rocep1s0f0", "4: ACTIVE", ("enp1s0f0np0",))
    assert h["rocep1s0f0"].active
    assert not h["rocep1s0f1"].active
    assert h["roceP2p1s0f0"].netdevs == ()
    assert "garbage" not in h


def test_hca_lines_none_on_vm():
    # real: no /sys/class/infiniband on the VM, the section is empty
    assert parsers.hca_lines(probe_section("hca").out) == {}


def test_ss_listener_from_probe():
    # real: the probe's listener loop appends " container=<id>" (empty: a host process)
    got = parsers.ss_listeners(probe_section("listeners").out)
    assert len(got) == 1
    ls = got[0]
    assert (ls.address, ls.port, ls.process, ls.container) == ("127.0.0.1", 8000, "python3", "")
    assert isinstance(ls.pid, int) and ls.pid > 0


def test_ss_listeners_plain_capture():
    got = parsers.ss_listeners(cap("vm-ss-all.txt"))
    assert [(x.port, x.process) for x in got] == [(8000, "python3"), (2024, "?")]
    assert got[1].pid is None  # no users:(( )) when ss may not see the owner
    assert parsers.ss_listeners(cap("vm-ss-listen-8000.txt"))[0].pid == int(
        cap("vm-ss-listen-8000.txt").split("pid=")[1].split(",")[0]
    )
    assert parsers.ss_listeners(cap("vm-ss-empty.txt")) == []


def test_ss_listener_in_container_and_ipv6():
    cid = "5b1c0e7f2a9d4c3b8e6f1a0d9c8b7a6f5e4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b"
    text = (
        f'LISTEN 0      4096         0.0.0.0:6379       0.0.0.0:*    users:(("gcs_server",pid=48391,fd=21)) container={cid}\n'
        'LISTEN 0      2048            [::]:8000          [::]:*    users:(("python3",pid=1200,fd=7),("python3",pid=1201,fd=7)) container=\n'
    )
    a, b = parsers.ss_listeners(text)
    assert (a.port, a.process, a.pid, a.container) == (6379, "gcs_server", 48391, cid)
    assert (b.address, b.port, b.process, b.pid, b.container) == ("[::]", 8000, "python3", 1200, "")


# --- memory and disk ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["vm-meminfo.txt", "host-meminfo.txt"])
def test_meminfo_captured(name):
    text = cap(name)
    kb = {ln.split(":")[0]: int(ln.split()[1]) for ln in text.splitlines()}
    m = parsers.meminfo(text)
    assert m.total == kb["MemTotal"] * 1024
    assert m.available == kb["MemAvailable"] * 1024
    assert m.free == kb["MemFree"] * 1024
    assert 0 < m.available <= m.total


def test_meminfo_counts_without_unit():
    m = parsers.meminfo("MemTotal: 100 kB\nHugePages_Total: 5\n")
    assert m.total == 102400 and m.available == 0


def test_df_lines_same_mount_twice():
    # real: `df -PB1 / /tmp` on one filesystem: one entry, keyed by mount point
    d = parsers.df_lines(cap("vm-df.txt"))
    assert list(d) == ["/"]
    assert d["/"].size == 270553174016 and d["/"].available == 84383666176


def test_df_lines_in_probe_with_error_line():
    # real: df complained about the docker root (daemon down) and printed the HF cache's line only
    sec = probe_section("disk")
    assert "No such file or directory" in sec.out
    assert list(parsers.df_lines(sec.out)) == ["/"]


def test_df_lines_two_mounts_in_order():
    text = (
        "Filesystem            1-blocks         Used     Available Capacity Mounted on\n"
        "/dev/nvme0n1p2 3936818520064 412043304960 3324727701504      12% /\n"
        "/dev/nvme1n1p1 3936818520064 100000000000 3636818520064       3% /data\n"
    )
    d = parsers.df_lines(text)
    assert list(d) == ["/", "/data"]
    assert d["/data"].available == 3636818520064


# --- path MTU -----------------------------------------------------------------------------------


def test_ping_results_captured():
    secs = probes.split_sections(cap("vm-path-mtu.txt"))
    assert secs["ping lo 127.0.0.1"].rc == 0
    too_big = secs["ping eth0 192.0.2.1"]
    assert too_big.rc == 1 and "message too long, mtu=1400" in too_big.out
    assert secs["ping eth0 192.0.2.77"].rc == 1
    assert "0 received" in parsers.last_line(secs["ping eth0 192.0.2.77"].out)


# --- from the testbed (real dockerd) ------------------------------------------------------------


def test_testbed_docker_info():
    d = parsers.docker_info(cap("testbed-head-docker-info.json"))
    assert d.server_version and d.root_dir == "/var/lib/docker"
    assert "runc" in d.runtimes


def test_testbed_docker_ps():
    cs = parsers.docker_ps_json(cap("testbed-head-docker-ps.jsonl"))
    assert len(cs) == 1
    c = cs[0]
    assert c.state == "running" and len(c.id) == 64
    assert c.command.startswith("ray start --head --node-ip-address 198.19.2.1")
    assert c.labels["org.sparkcluster.ray-version"] == "2.60.0"
    # a label value with spaces and parentheses survives the comma split
    assert c.labels["org.opencontainers.image.title"] == "vllm (testbed stand-in)"


def test_testbed_docker_inspect():
    (c,) = parsers.json_list(cap("testbed-head-docker-inspect.json"))
    hc = c["HostConfig"]
    assert hc["CapAdd"] == ["CAP_IPC_LOCK"]
    assert hc["Devices"][0]["PathOnHost"] == "/dev/infiniband"
    assert {"Name": "memlock", "Hard": -1, "Soft": -1} in hc["Ulimits"]


# ---- status: the node's uptime and clock, docker's timestamps ----------------------------------


def test_uptime_and_clock_from_proc_uptime_and_date():
    # `cat /proc/uptime; date +%s.%N` on a testbed host
    assert parsers.uptime_and_clock("17409.64 33512.80\n1795334179.336780425\n") == (17409.64, 1795334179.336780425)
    assert parsers.uptime_and_clock("") == (None, None)
    assert parsers.uptime_and_clock("17409.64 1\n%N\n") == (17409.64, None)


def test_rfc3339_docker_nanoseconds_and_zero_time():
    t = parsers.rfc3339("2026-11-22T07:56:19.336780425Z")
    assert abs(t - (1795334179 + 0.336780425)) < 1e-6
    assert parsers.rfc3339("2026-11-22T08:56:19+01:00") == 1795334179
    assert parsers.rfc3339("0001-01-01T00:00:00Z") is None
    assert parsers.rfc3339("") is None and parsers.rfc3339("yesterday") is None


def test_one_meminfo_reader_gives_bytes_and_kb():
    """Issue 54: one meminfo parser (node/readings); the drift probe's kB figures are its bytes / 1024."""
    from sparkcluster.node import readings

    text = "MemTotal:       130000000 kB\nCmaTotal:              0 kB\nCmaFree:         9700000 kB\n"
    assert readings.meminfo(text)["MemTotal"] == 130000000 * 1024
    assert parsers.meminfo(text).total == 130000000 * 1024
    assert parsers.meminfo_kib(text) == {"MemTotal": 130000000, "CmaTotal": 0, "CmaFree": 9700000}
