"""What the serving engine's own NCCL chose, as `status` reads it from the ranks' NCCL files: the
captured real NCCL 2.28.9 logs (tests/captured/nccl/, see its README) stand in for those files."""

from pathlib import Path

from sparkcluster.config import profile as profiles
from sparkcluster.fabric import engine_nccl
from sparkcluster.facts.probes import split_sections
from sparkcluster.node import contract
from sparkcluster.status import status
from tests.unit.conftest import make_inventory

CAPTURED = Path(__file__).resolve().parents[1] / "captured" / "nccl"
PAIR = make_inventory()
HEAD, WORKER = "spark-head", "spark-worker"


def test_no_nccl_file_says_nothing():  # a CPU engine (the testbed's) runs no NCCL
    assert engine_nccl.summaries(PAIR, {HEAD: "", WORKER: ""}) == ({}, [])


def test_ranks_on_sockets_in_a_roce_pair_are_a_problem_on_their_node():
    sock = (CAPTURED / "socket.log").read_text()
    got, problems = engine_nccl.summaries(PAIR, {HEAD: sock, WORKER: sock})
    assert "NET/Socket" in got[HEAD] and "NET/Socket" in got[WORKER]
    assert any(node == WORKER and "TCP sockets" in what for node, what in problems), problems


def test_the_status_section_reads_each_container_and_the_round_trip_parses_it():
    script = status.node_script(PAIR, HEAD)
    assert "nccl.*.log" in script and "/status" in script and "docker exec" in script
    out = "@@sc@@ nccl\n" + (CAPTURED / "default.log").read_text() + "\n@@sc@@ nccl rc=0\n"
    assert "NCCL INFO" in split_sections(out)["nccl"].out


def test_every_container_writes_its_ranks_nccl_init_to_a_file():
    env = profiles.container_env(profiles.load_profile("testbed"), PAIR, HEAD)
    assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_DEBUG_SUBSYS"] == "INIT,NET"
    assert env["NCCL_DEBUG_FILE"] == f"{contract.NCCL_LOG_DIR}/nccl.%h.%p.log"


def test_up_fails_when_the_engines_ranks_use_sockets_and_passes_without_nccl():
    from types import SimpleNamespace

    import pytest

    from sparkcluster.errors import StageError
    from sparkcluster.remote.fanout import ConnectedHosts
    from sparkcluster.up.stages import serve

    def cluster(text: str) -> ConnectedHosts:
        out = f"@@sc@@ nccl\n{text}\n@@sc@@ nccl rc=0\n"
        return ConnectedHosts(
            PAIR,
            {
                n: SimpleNamespace(name=n, run=lambda script, timeout, warn: SimpleNamespace(stdout=out))
                for n in (HEAD, WORKER)
            },
        )

    r = SimpleNamespace(inv=PAIR, cluster=cluster((CAPTURED / "socket.log").read_text()))
    with pytest.raises(StageError) as e:
        serve.engine_transport(r)
    assert "stage 'serve' failed on" in str(e.value) and "TCP sockets" in str(e.value)
    assert serve.engine_transport(SimpleNamespace(inv=PAIR, cluster=cluster(""))) == {}
