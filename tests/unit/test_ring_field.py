"""What real clusters of four Sparks, 100G ports and reboots hit (issue 35): the ring's rules in lint,
a `--node` part of a ring judged as what it is, crossed cables, the fabric figures by PCIe half and
port speed, a ring cable on one twin, NCCL's failure signatures on published output, and the probe's
own NCCL environment on the capture from a real GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_topology import PORT0, PORT1, _four, _ring

from sparkcluster import checks
from sparkcluster.config import inventory, lint, topology
from sparkcluster.config import profile as profiles
from sparkcluster.errors import InputError
from sparkcluster.fabric import judge, measure, nccl_log, signatures
from sparkcluster.fabric.nccl_log import ProbeResult
from sparkcluster.facts import HostFacts, parsers
from sparkcluster.node import fabric_probe

NCCL = Path(__file__).parents[1] / "captured" / "nccl"
NAMES = ["spark-1", "spark-2", "spark-3", "spark-4"]


def ring_inv(n: int = 4, hcas=((PORT0[0], PORT0[1]), (PORT1[0], PORT1[1])), kind=None) -> inventory.Inventory:
    return inventory.Inventory.model_validate(
        {
            "cluster": {"name": "ring", "topology": kind or ("ring" if n >= 4 else "direct")},
            "nodes": [
                {
                    "name": f"spark-{i}",
                    "role": "head" if i == 1 else "worker",
                    "ssh": f"spark-{i}",
                    "control_if": "enP7s7",
                    "control_ip": f"192.168.1.{10 + i}",
                    "data_plane": [{"netdev": nd, "hca": h} for nd, h in hcas],
                }
                for i in range(1, n + 1)
            ],
        }
    )


# --- lint: what a ring serves on ----------------------------------------------------------------


def rules(problems) -> dict[str, lint.Problem]:
    return {p.rule: p for p in problems if p.rule.startswith("ring-")}


def test_a_ring_refuses_ray_and_pipeline_parallel_saying_why():
    got = rules(lint.lint(profiles.load_profile("testbed-pp"), ring_inv()))
    assert set(got) == {"ring-executor", "ring-pp"}
    assert "by IP address, not along the ring's cables" in got["ring-executor"].message
    assert 'executor = "mp"' in got["ring-executor"].fix
    # cable order A,B,C,D: TP=2 x PP=2 puts the pipeline groups on the ring's diagonals
    assert "{spark-1,spark-3}; {spark-2,spark-4}" in got["ring-pp"].message
    assert "A,B,D,C" in got["ring-pp"].message and "tensor_parallel_size = 4" in got["ring-pp"].fix


def test_tp_across_the_ring_with_mp_passes_lint():
    assert lint.lint(profiles.load_profile("testbed-ring"), ring_inv()) == []


def test_a_ring_listed_from_another_node_than_the_head_is_refused():
    """`--node-rank` runs head first, then the workers in inventory order: cable order only when the
    inventory starts at the head (container/spec.node_rank)."""
    inv = ring_inv()
    nodes = [inv.nodes[1], inv.nodes[0], *inv.nodes[2:]]
    got = rules(lint.lint(profiles.load_profile("testbed-ring"), inv.model_copy(update={"nodes": nodes})))
    assert set(got) == {"ring-order"} and "before the head spark-1" in got["ring-order"].message


def test_the_same_profile_through_a_switch_is_not_judged_by_ring_rules():
    inv = ring_inv()
    switch = inv.model_copy(update={"cluster": inv.cluster.model_copy(update={"topology": "switch"})})
    assert rules(lint.lint(profiles.load_profile("testbed-pp"), switch)) == {}


def test_a_ring_of_more_than_four_warns_and_does_not_stop_up():
    prof = profiles.load_profile("testbed-ring")
    prof = prof.model_copy(update={"serve": prof.serve.model_copy(update={"tensor_parallel_size": 5})})
    found = lint.lint(prof, ring_inv(5))
    assert [(p.rule, p.severity) for p in found] == [("ring-size", "warn")]
    assert "rings of 4 Sparks only" in found[0].message and "warning:" in found[0].line()
    assert lint.failures(found) == []


# --- a --node part of a ring ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "chosen, kind",
    [
        (["spark-2"], "single"),
        (["spark-2", "spark-3"], "direct"),
        (["spark-1", "spark-4"], "direct"),  # the cable that closes the ring
        (NAMES, "ring"),
    ],
)
def test_a_part_of_a_ring_is_judged_as_what_it_is(chosen, kind):
    part = ring_inv().only(chosen)
    assert part.cluster.topology == kind
    # a pair out of a ring gets a pair's NCCL variables and figures, not the ring's
    if kind == "direct":
        assert "NCCL_ALGO" not in topology.nccl_env(part.cluster.topology)
        assert judge.figures_kind(part) == "half"


@pytest.mark.parametrize(
    "chosen, why",
    [
        (["spark-1", "spark-3"], "not next to each other in the ring"),
        (["spark-1", "spark-2", "spark-3"], "a stretch of a ring is a chain"),
    ],
)
def test_a_part_of_a_ring_no_cable_serves_is_refused(chosen, why):
    with pytest.raises(InputError, match=why):
        ring_inv().only(chosen)


def test_two_of_a_mesh_are_a_direct_pair():
    assert topology.subset("mesh", ["a", "b", "c"], ["a", "c"]) == "direct"
    assert topology.subset("switch", ["a", "b", "c", "d"], ["a", "c"]) == "switch"


def test_a_pair_cut_from_a_ring_is_not_held_to_position_pairing():
    """spark-1's port 0 meets spark-2's port 1: by position that is 'crossed', but one cable joins
    them and each node's other port faces a third node; NCCL routes by subnet."""
    inv, found = _four("ring", _ring)
    for f in found.values():
        f.hcas = {
            PORT0[1]: parsers.Hca(PORT0[1], "4: ACTIVE", [PORT0[0]]),
            PORT1[1]: parsers.Hca(PORT1[1], "4: ACTIVE", [PORT1[0]]),
        }
    pair = inv.only(["spark-1", "spark-2"])
    ctx = checks.Context(pair, {n: found[n] for n in ("spark-1", "spark-2")}, {}, checks.Expect())
    got = {(r.id, r.node): r for r in checks.run_checks(ctx, only={"rdma.hca"})}
    assert got[("rdma.hca", "spark-2")].status == "ok", got


# --- port crossing -----------------------------------------------------------------------------


def _crossing(addrs):
    inv, found = _four("ring", addrs)
    ctx = checks.Context(inv, found, {}, checks.Expect())
    return {r.node: r for r in checks.run_checks(ctx, only={"net.crossing"})}


def test_a_ring_cabled_port_0_to_port_1_passes():
    assert {n: r.status for n, r in _crossing(_ring).items()} == dict.fromkeys(NAMES, "ok")


def test_a_crossed_cable_fails_on_its_two_ends_with_the_fix():
    """spark-2's two cables swapped between its ports: its cable to spark-1 joins port 0 to port 0,
    its cable to spark-3 port 1 to port 1. Each crossed cable fails on both its ends; spark-4, whose
    cables are right, passes."""

    def swapped(i):
        a = _ring(i)
        return {PORT0[0]: a[PORT1[0]], PORT1[0]: a[PORT0[0]]} if i == 2 else a

    got = _crossing(swapped)
    assert {n: r.status for n, r in got.items()} == {
        "spark-1": "fail",
        "spark-2": "fail",
        "spark-3": "fail",
        "spark-4": "ok",
    }
    assert "joins spark-1's port 0 to spark-2's port 0" in got["spark-1"].detail
    assert "joins spark-2's port 1 to spark-3's port 1" in got["spark-3"].detail
    assert got["spark-2"].detail.count("the cable on") == 2 and "ibv_modify_qp error 110" in got["spark-2"].detail
    assert "port 0 of one node to port 1 of the next" in got["spark-2"].fix


def test_port_names_say_which_port():
    from sparkcluster.checks.wiring import port_of

    assert port_of("roceP2p1s0f1", "enP2p1s0f1np1") == port_of("rocep1s0f1", "") == "1"
    assert port_of("mlx5_0", "enp1s0f0np0") == "0" and port_of("mlx5_0", "eth0") is None


# --- figures: PCIe halves, port speed, the ring's lines ---------------------------------------------


def result(busbw: float, nbytes: int = 1 << 30) -> ProbeResult:
    return ProbeResult("all_gather", nbytes, 1.0, busbw * 2, busbw, 2, "nccl")


def test_two_hcas_of_one_pcie_half_are_not_a_pair():
    assert judge.pcie_half("rocep1s0f1") == ("p1", "1") and judge.pcie_half("roceP2p1s0f0") == ("P2p1", "0")
    assert judge.halves(["rocep1s0f0", "rocep1s0f1"]) == 1
    assert judge.halves(["rocep1s0f1", "roceP2p1s0f1"]) == 2
    pair = ring_inv(2)
    assert judge.figures_kind(pair) == "half"  # two cables on rocep1s0f0+rocep1s0f1: one x4 half
    twins = ring_inv(2, hcas=(("enp1s0f1np1", "rocep1s0f1"), ("enP2p1s0f1np1", "roceP2p1s0f1")))
    assert judge.figures_kind(twins) == "pair"
    # one half measuring its ~12.3 GB/s passes as one half, where a pair's figures would WARN
    half = judge.Expectation(roce=True, topology="half")
    assert judge.judge_bandwidth([result(12.3)], half, ["a", "b"]).status == "ok"


def test_figures_scale_with_the_negotiated_port_speed_and_say_so():
    """A switch's 100G auto-negotiation (tonyd2wild GLM-5.3 4x PR #6): a healthy 100G pair measures
    about half a 200G pair's figure and must not FAIL (which would stop `up`)."""
    at100 = judge.Expectation(roce=True, topology="pair", port_mbps=100_000)
    healthy, floor, source = judge.thresholds(at100)
    assert (healthy, floor) == (round(18.55 * 0.5, 2), round(10.05 * 0.5, 2))
    assert "scaled to a 100G port" in source
    r = judge.judge_bandwidth([result(10.0)], at100, ["a", "b"])
    assert r.status == "ok"
    r = judge.judge_bandwidth([result(4.0)], at100, ["a", "b"])
    assert r.status == "fail" and "scaled to a 100G port" in r.detail and "MiaAI-Lab GLM-5.3 #118" in r.detail
    # one PCIe half carries ~100 Gb/s anyway: a 100G port does not lower its figures
    assert judge.thresholds(judge.Expectation(True, "half", port_mbps=100_000))[:2] == (11.35, 6.15)


def test_the_slowest_data_plane_port_sets_the_pace():
    inv = ring_inv(2)
    facts = {}
    for n, speed in (("spark-1", 200_000), ("spark-2", 100_000)):
        f = HostFacts(node=n, hostname=n)
        f.interfaces = {
            nd: parsers.Interface(nd, 9000, True, True, "UP", speed_mbps=speed) for nd in (PORT0[0], PORT1[0])
        }
        facts[n] = f
    assert measure.port_mbps(inv, facts) == 100_000 and measure.expectation(inv, facts).port_mbps == 100_000
    assert measure.port_mbps(inv, None) is None


def test_ring_lines_cite_nvidia_and_the_mesh_measurement():
    ring = judge.Expectation(roce=True, topology="ring")
    assert judge.judge_bandwidth([result(9.5)], ring, NAMES).status == "fail"
    r = judge.judge_bandwidth([result(15.0)], ring, NAMES)
    assert (
        r.status == "warn" and "dgx-spark-playbooks PR #103" in r.detail and "eugr spark-vllm-docker #252" in r.detail
    )


def test_a_ring_cable_on_one_twin_only_warns_on_its_node():
    lone = judge.judge_cabling(ring_inv())
    assert {r.node: r.status for r in lone} == dict.fromkeys(NAMES, "warn")
    assert "port 0 (rocep1s0f0)" in lone[0].detail and "port 1 (rocep1s0f1)" in lone[0].detail
    assert "roceP2p1s0fN" in lone[0].fix
    four = (
        ("enp1s0f0np0", "rocep1s0f0"),
        ("enP2p1s0f0np0", "roceP2p1s0f0"),
        ("enp1s0f1np1", "rocep1s0f1"),
        ("enP2p1s0f1np1", "roceP2p1s0f1"),
    )
    assert {r.status for r in judge.judge_cabling(ring_inv(4, four))} == {"ok"}
    inv = ring_inv()
    switch = inv.model_copy(update={"cluster": inv.cluster.model_copy(update={"topology": "switch"})})
    assert judge.judge_cabling(switch) == []


# --- NCCL failure signatures, on published output --------------------------------------------------


@pytest.mark.parametrize(
    "capture, topo, cause",
    [
        ("published-regmr-enomem-nccl-tests-206.txt", None, "kernel-cma-regmr"),
        ("published-regmr-enomem-gb10-kernel7.txt", "ring", "kernel-cma-regmr"),
        ("published-modify-qp-110-nccl-2013.txt", "ring", "qp-timeout-point-to-point"),
        ("published-modify-qp-110-nccl-2013.txt", "mesh", "qp-timeout-point-to-point"),
        ("published-modify-qp-110-nccl-2013.txt", "direct", "qp-timeout-pair"),
        ("published-modify-qp-61-spark-ring.txt", "ring", "gid-missing"),
        ("published-modify-qp-61-spark-pair.txt", "direct", "gid-missing"),
    ],
)
def test_each_published_failure_names_its_one_cause(capture, topo, cause):
    found = signatures.causes((NCCL / capture).read_text(), topo)
    assert [s.cause for s in found] == [cause]


def test_the_fixes_say_what_to_do():
    by = {s.cause: s for s in signatures.SIGNATURES}
    assert "kho=off" in by["kernel-cma-regmr"].fix and "6.17" in by["kernel-cma-regmr"].fix
    assert "port 0 of one node to port 1 of the next" in by["qp-timeout-point-to-point"].fix
    assert "NCCL_ALGO=Ring" in by["qp-timeout-point-to-point"].fix
    assert "leave NCCL_IB_GID_INDEX unset" in by["gid-missing"].fix
    assert signatures.fix_for((NCCL / "default.log").read_text()) is None  # a healthy log names nothing


def test_the_fabric_verdict_carries_the_causes_fix():
    """A rank's log with NCCL's own WARN line (the published 61 line, as NCCL prints it with its
    host:pid:tid prefix): fabric.transport fails with the GID fix, not the generic one."""
    line = (NCCL / "published-modify-qp-61-spark-ring.txt").read_text().splitlines()[0]
    text = (NCCL / "device-ring-rank0.log").read_text() + f"spark-2:871:900 [0] {line}\n"
    log = nccl_log.parse(text)
    r = judge.judge_node("spark-2", log, judge.Expectation(roce=True, topology="ring"), {}, {})
    assert r.status == "fail" and "cause: NCCL used a GID that does not exist" in r.detail
    assert "leave NCCL_IB_GID_INDEX unset" in r.fix


# --- the probe's own NCCL environment, read back from a real GPU run -------------------------------


def test_the_probe_runs_with_the_engines_nccl_environment():
    from sparkcluster.fabric import launch

    assert fabric_probe.ENGINE_NCCL_ENV == {"NCCL_CUMEM_ENABLE": "0"}
    assert launch.PROBE_NCCL_ENV["NCCL_CUMEM_ENABLE"] == "0" and "ENV" in launch.PROBE_NCCL_ENV["NCCL_DEBUG_SUBSYS"]
    inv = ring_inv()
    assert all(env["NCCL_CUMEM_ENABLE"] == "0" for ranks in launch.rank_env(inv, 1).values() for env in ranks.values())


def test_the_ring_capture_shows_the_ring_variables_and_cumem_off_taking_effect():
    logs = [nccl_log.parse((NCCL / f"device-ring-rank{r}.log").read_text()) for r in (0, 1)]
    for log in logs:
        env = log.ranks[0].env
        assert env["NCCL_ALGO"] == "Ring" and env["NCCL_CUMEM_ENABLE"] == "0" and env["NCCL_NET_PLUGIN"] == "none"
        assert log.ranks[0].nnodes == 2 and log.ranks[0].kinds() == {"NET/Socket"}  # two "nodes", one GPU
    top = nccl_log.largest(logs[0].results)
    assert top.nbytes == 1 << 30 and logs[0].done
    assert {r.op for r in logs[0].results} == {"all_gather", "all_reduce", "p2p"}
    tuning = (NCCL / "device-ring-tuning-rank0.log").read_text()
    algos = {line.split("Algo ")[1].split()[0] for line in tuning.splitlines() if " -> Algo " in line}
    assert algos == {"RING"}  # NCCL built its trees at init, and ran every collective on rings


def test_the_engines_own_nccl_failure_gets_the_same_fix_in_status():
    from sparkcluster.fabric import engine_nccl

    line = (NCCL / "published-regmr-enomem-nccl-tests-206.txt").read_text().strip()
    text = (NCCL / "device-ring-rank1.log").read_text() + f"spark-2:901:950 [0] {line}\n"
    _, problems = engine_nccl.summaries(ring_inv(), {"spark-2": text})
    assert problems and problems[0][0] == "spark-2" and "kho=off" in problems[0][1]
