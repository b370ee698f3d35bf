"""The fabric test's controller side, pure parts: which node a direction names, what the inventory
says the fabric is, the ranks' environment, and a result of several nodes in doctor's table."""

import io

from rich.console import Console

from sparkcluster.checks import Result, report
from sparkcluster.config import inventory
from sparkcluster.fabric import judge, launch, measure
from sparkcluster.fabric.nccl_log import ProbeResult, parse

PAIR = """
[cluster]
name = "pair"
[[nodes]]
name = "a"
role = "head"
ssh = "u@a"
control_if = "enp1s0f0np0"
control_ip = "10.0.0.1"
data_plane = [{ netdev = "enp1s0f0np0", hca = "rocep1s0f0" }, { netdev = "enP2p1s0f0np0", hca = "roceP2p1s0f0" }]
[[nodes]]
name = "b"
role = "worker"
ssh = "u@b"
control_if = "enp1s0f0np0"
control_ip = "10.0.0.2"
data_plane = [{ netdev = "enp1s0f0np0", hca = "rocep1s0f0" }, { netdev = "enP2p1s0f0np0", hca = "roceP2p1s0f0" }]
"""


def p2p(src: int, dst: int, gbps: float) -> ProbeResult:
    return ProbeResult("p2p", 256 << 20, 1.0, gbps, gbps, 2, "gloo", src, dst)


def test_a_slow_direction_names_its_sender_only():
    out = judge.judge_directions([p2p(0, 1, 0.9), p2p(1, 0, 0.03)], {0: "a", 1: "b"})
    assert [(r.node, r.status) for r in out] == [("a", "ok"), ("b", "fail")]
    assert "b -> a: 0.03 GB/s" in out[1].detail and "egress" in out[1].fix


def test_equal_directions_pass_and_no_p2p_says_nothing():
    out = judge.judge_directions([p2p(0, 1, 0.9), p2p(1, 0, 0.8)], {0: "a", 1: "b"})
    assert {r.status for r in out} == {"ok"}
    assert judge.judge_directions([], {0: "a"}) == []


def test_probe_p2p_lines_are_parsed_with_their_ends():
    line = (
        'SPARKCLUSTER_FABRIC {"algbw_GBps": 0.5, "backend": "gloo", "busbw_GBps": 0.5, "bytes": 1048576, '
        '"dst": 0, "op": "p2p", "ranks": 2, "src": 1, "time_us": 2000.0}'
    )
    (r,) = parse(line).results
    assert (r.op, r.src, r.dst, r.algbw_gbps) == ("p2p", 1, 0, 0.5)


def test_expectation_from_the_inventory():
    inv = inventory.parse(PAIR)
    e = measure.expectation(inv)
    assert e.roce and e.topology == "pair" and e.healthy_gbps is None
    own = inventory.parse(PAIR + "\n[fabric]\nhealthy_gbps = 0.5\nfloor_gbps = 0.1\nmax_bytes = 67108864\n")
    e = measure.expectation(own)
    assert (e.healthy_gbps, e.floor_gbps) == (0.5, 0.1)
    assert "67108864" in measure.probe_args(own)
    single = inventory.parse(PAIR.split("[[nodes]]")[0] + "[[nodes]]" + PAIR.split("[[nodes]]")[1])
    assert measure.expectation(single).topology == "single" and not measure.expectation(single).roce


def test_each_rank_gets_its_rank_and_the_heads_control_address():
    inv = inventory.parse(PAIR.replace('control_ip = "10.0.0.2"', 'control_ip = "10.0.0.2"\ngpus = 2'))
    env = launch.rank_env(inv, 29517)
    assert sorted(env["a"]) == [0] and sorted(env["b"]) == [1, 2]
    assert env["b"][2]["LOCAL_RANK"] == "1" and env["b"][2]["WORLD_SIZE"] == "3"
    assert {e["MASTER_ADDR"] for n in env.values() for e in n.values()} == {"10.0.0.1"}
    assert env["a"][0]["NCCL_DEBUG"] == "INFO"
    assert measure.rank_nodes(inv) == {0: "a", 1: "b", 2: "b"}


def test_the_cleanup_shell_spares_itself():
    assert '"$$"' in launch.KILL_PROBES and launch.PROBE_PATH in launch.KILL_PROBES


def test_a_result_of_several_nodes_shows_in_each_column():
    buf = io.StringIO()
    report.table(
        [Result("fabric.bandwidth", "a+b", "fail", "slow", "fix it")], ["a", "b"], Console(file=buf, width=120)
    )
    row = next(line for line in buf.getvalue().splitlines() if line.startswith("fabric.bandwidth"))
    assert row.count("FAIL") == 2


def test_up_measures_the_fabric_only_when_it_creates_the_containers_of_several_nodes():
    from types import SimpleNamespace

    from sparkcluster.config import profile as profiles
    from sparkcluster.up.stages import collective

    inv, prof = inventory.parse(PAIR), profiles.load_profile("testbed")
    plan = SimpleNamespace(inventory=inv, profile=prof, containers=["spec"])
    (step,) = collective.steps(plan)
    assert step.id == "fabric/a/test" and "before vllm serve" in step.description
    assert collective.steps(SimpleNamespace(inventory=inv, profile=prof, containers=[])) == []
    off = prof.model_copy(update={"fabric_test": False})
    assert collective.steps(SimpleNamespace(inventory=inv, profile=off, containers=["spec"])) == []


def test_a_fabric_fail_stops_up_naming_the_node(monkeypatch):
    from types import SimpleNamespace

    import pytest

    from sparkcluster.errors import StageError
    from sparkcluster.up.stages import collective

    monkeypatch.setattr(
        measure,
        "run",
        lambda *a, **kw: [
            Result(
                "fabric.transport", "b", "fail", "NCCL uses TCP sockets; likely cause: no /dev/infiniband", "add it"
            ),
            Result("fabric.bandwidth", "a+b", "ok", "fine"),
        ],
    )
    r = SimpleNamespace(cluster=None, inv=None, plan=SimpleNamespace(profile=None, image="i", facts={}))
    with pytest.raises(StageError) as e:
        collective.run_test(r)
    assert "stage 'fabric' failed on b" in str(e.value) and e.value.fix == "add it"


def test_the_h100_run_with_both_directions_is_judged_as_a_roce_pair_would_be():
    """Real NCCL 2.28.9 on one H100, sockets forced, each rank its own NCCL_HOSTID (two "nodes"):
    the probe at its current revision, directions included (tests/captured/README.md)."""
    from pathlib import Path

    cap = Path(__file__).resolve().parents[1] / "captured" / "nccl"
    logs = {n: parse((cap / f"device-p2p-rank{r}.log").read_text()) for r, n in ((0, "a"), (1, "b"))}
    out = {
        (r.id, r.node): r
        for r in judge.judge(logs, judge.Expectation(roce=True, topology="pair"), rank_node={0: "a", 1: "b"})
    }
    assert out[("fabric.transport", "b")].status == "fail" and "TCP sockets" in out[("fabric.transport", "b")].detail
    assert (
        out[("fabric.bandwidth", "a+b")].status == "fail"
        and "1.851 GB/s at 1 GiB" in out[("fabric.bandwidth", "a+b")].detail
    )
    assert out[("fabric.direction", "a")].status == "ok" and out[("fabric.direction", "b")].status == "ok"
    assert "a -> b: 2.064 GB/s" in out[("fabric.direction", "a")].detail
