"""The NCCL log parser and the fabric probe, on real NCCL 2.28.9 output (tests/captured/nccl/)."""

import ast
import sys
from pathlib import Path

import pytest

from sparkcluster.fabric import nccl_log

CAPTURED = Path(__file__).resolve().parents[1] / "captured" / "nccl"
PROBE = Path(__file__).resolve().parents[2] / "sparkcluster" / "node" / "fabric_probe.py"


def parsed(name: str) -> nccl_log.FabricLog:
    return nccl_log.parse((CAPTURED / name).read_text())


def test_default_log_p2p_on_one_host():
    log = parsed("default.log")
    assert [r.rank for r in log.ranks] == [0, 1]
    r0 = log.ranks[0]
    assert r0.version == "2.28.9+cuda13.0"
    assert r0.network == "Socket"  # chosen for the unused network path ...
    assert r0.transports == {"P2P/CUMEM"} and r0.kinds() == {"P2P"}  # ... while data went over NVLink
    assert r0.nnodes == 1 and r0.init_complete and r0.ib_no_device
    assert log.failures() == []
    assert len(log.results) == 8
    assert nccl_log.largest(log.results).busbw_gbps == pytest.approx(266.14)


def test_socket_log_names_the_interface_and_transport():
    log = parsed("socket.log")
    for r in log.ranks:
        assert r.kinds() == {"NET/Socket"} and r.transports == {"NET/Socket/0"}
        assert [(s.name, s.address) for s in r.socket_ifs] == [("eth0", "192.0.2.2")]
        assert r.nnodes == 2 and r.ib_devices == [] and r.ib_oob == "eth0:192.0.2.2<0>"
    assert log.ranks[0].summary() == "NET/Socket eth0:192.0.2.2"
    top = nccl_log.largest(log.results)
    assert (top.nbytes, top.busbw_gbps) == (1 << 30, 3.55)


def test_socket_lo_log_reads_the_variable_nccl_reports():
    log = parsed("socket_lo.log")
    assert log.ranks[0].env["NCCL_SOCKET_IFNAME"] == "lo"
    assert log.ranks[0].socket_ifs[0].name == "lo"


def test_ib_missing_log_keeps_nccls_own_reason():
    log = parsed("ib_missing.log")
    assert len(log.ranks) == 2 and all(r.rank is None for r in log.ranks)  # failed before init named it
    assert log.ranks[0].env["NCCL_IB_HCA"] == "rocep1s0f1,roceP2p1s0f1"
    assert log.failures() == [
        "Failed to initialize any NET plugin",
        "Failed to initialize NET plugin IB",
        "NET/IB : No device found",
    ]
    assert log.results == [] and not log.done
    assert any("DistBackendError" in e for e in log.python_errors)


def test_gloo_log_has_results_and_no_nccl():
    log = parsed("gloo.log")
    assert log.ranks == [] and len(log.results) == 6
    assert nccl_log.largest(log.results, "all_reduce").busbw_gbps == 2.1


def test_device_logs_one_file_per_rank():
    """Both ranks print [0] (one GPU each, the same device): ranks come from NCCL's init line."""
    r0, r1 = parsed("device-socket-rank0.log"), parsed("device-socket-rank1.log")
    assert [r.rank for r in r0.ranks + r1.ranks] == [0, 1]
    assert r0.done and len(r0.results) == 12 and not r1.results
    assert r0.results[0].backend == "nccl" and r0.results[0].ranks == 2
    merged = nccl_log.parse_many([(CAPTURED / f"device-socket-rank{i}.log").read_text() for i in (0, 1)])
    assert len(merged.ranks) == 2 and merged.done
    failed = parsed("device-default-rank0.log")
    assert failed.failures() == ["Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 60"]
    assert failed.probe_errors and "Duplicate GPU detected" in failed.probe_errors[0]


IB_LINES = """\
spark-1:10:10 [0] NCCL INFO NCCL_IB_HCA set to rocep1s0f1,roceP2p1s0f1
spark-1:10:10 [0] NCCL INFO NET/IB : Using [0]rocep1s0f1:1/RoCE [1]roceP2p1s0f1:1/RoCE [RO]; OOB enp1s0f1np1:10.0.0.1<0>
spark-1:10:10 [0] NCCL INFO Using network IB
spark-1:10:10 [0] NCCL INFO ncclCommInitRankConfig comm 0x1 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId f01000 commId 0x2 - Init COMPLETE
spark-1:10:31 [0] NCCL INFO NET/IB: NCCL Dev 0 IbDev 1 Port 1 qpn 1234 mtu 5 GID 3 (0/A0A0000FFFF0000) fifoRkey=0x1 fifoLkey=0x2
spark-1:10:10 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/IB/0/GDRDMA
spark-1:10:10 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[0] [send] via NET/IB/1
"""


def test_net_ib_format_from_nccls_source():
    """The NET/IB lines as src/transport/net_ib/init.cc and connect.cc print them (no HCA here to
    capture them from: this is their real format, written by hand)."""
    r = nccl_log.parse(IB_LINES).ranks[0]
    assert [(d.index, d.name, d.port, d.link) for d in r.ib_devices] == [
        (0, "rocep1s0f1", 1, "RoCE"),
        (1, "roceP2p1s0f1", 1, "RoCE"),
    ]
    assert r.ib_oob == "enp1s0f1np1:10.0.0.1<0>" and r.network == "IB"
    assert r.gid_indexes == {"roceP2p1s0f1": 3}
    assert r.kinds() == {"NET/IB"} and r.transports == {"NET/IB/0/GDRDMA", "NET/IB/1"}
    assert r.summary() == "NET/IB rocep1s0f1,roceP2p1s0f1 GID 3"
    rail = nccl_log.parse("h:1:1 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1:2/IB [1]mlx5_1:1::3/IB; OOB ib0:10.1.1.1<0>")
    assert [d.name for d in rail.ranks[0].ib_devices] == ["mlx5_0", "mlx5_1"]


@pytest.mark.parametrize(
    "transport,kind",
    [
        ("NET/IB/0/GDRDMA", "NET/IB"),
        ("NET/Socket/0", "NET/Socket"),
        ("P2P/CUMEM", "P2P"),
        ("P2P/IPC/read", "P2P"),
        ("SHM/direct/direct", "SHM"),
    ],
)
def test_transport_kind(transport, kind):
    assert nccl_log.transport_kind(transport) == kind


def test_probe_imports_only_stdlib_and_torch():
    """The probe is shipped into containers as a plain file: nothing of sparkcluster, no third party."""
    tree = ast.parse(PROBE.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0
            names.add(node.module.split(".")[0])
    assert names - {"torch"} <= set(sys.stdlib_module_names) | {"__future__"}
    assert "torch" in names


def _probe():
    sys.path.insert(0, str(PROBE.parent))
    try:
        import fabric_probe
    finally:
        sys.path.pop(0)
    return fabric_probe


def test_probe_bandwidth_is_nccl_tests_arithmetic():
    p = _probe()
    assert p.default_sizes(1 << 30) == [1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30]
    assert p.default_sizes(100 << 20)[-1] == 100 << 20
    alg, bus = p.bandwidth("all_gather", 1 << 30, 0.1512634, 2)  # socket.log's 1 GiB all_gather
    assert round(alg, 2) == 7.1 and round(bus, 2) == 3.55
    alg, bus = p.bandwidth("all_reduce", 1 << 30, 0.5, 4)
    assert bus == pytest.approx(alg * 2 * 3 / 4)
    assert p.parse_size("256MiB") == 256 << 20 and p.parse_size("1G") == 1 << 30
    assert p.rounded_size(1000, 3) == 996


def test_probe_names_a_missing_variable():
    with pytest.raises(ValueError, match="WORLD_SIZE, MASTER_ADDR, MASTER_PORT"):
        _probe().rank_env({"RANK": "0"})
