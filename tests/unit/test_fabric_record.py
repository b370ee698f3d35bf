"""fabric/record: the figures each node's agent exports after a fabric test, read from real NCCL
logs (tests/captured/nccl: the device runs of perf/fabric_gpu.sh, provenance in tests/captured/README.md)."""

from pathlib import Path

from sparkcluster.fabric import judge, nccl_log, record

NCCL = Path(__file__).parent.parent / "captured" / "nccl"


def test_each_node_gets_the_transport_its_ranks_used():
    logs = {
        "spark-a": nccl_log.parse((NCCL / "device-socket-rank0.log").read_text()),
        "spark-b": nccl_log.parse((NCCL / "device-ib-rank1.log").read_text()),
    }
    got = record.figures(logs, judge.Expectation(roce=True, topology="pair"), now=1.0)
    assert set(got) == {"spark-a", "spark-b"}
    assert "NET/Socket" in got["spark-a"]["transport"]
    assert all(doc["ts"] == 1.0 and doc["floor_gbps"] for doc in got.values())
