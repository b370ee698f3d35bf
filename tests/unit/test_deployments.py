"""Deployments (a profile on a set of nodes): grouping containers by their labels, which nodes a
run touches, what it would replace; and `status --on-change`'s memory and hook environment."""

from __future__ import annotations

import subprocess

import pytest
from conftest import make_inventory

from sparkcluster.config import profile as profiles
from sparkcluster.deployment import deployments
from sparkcluster.errors import InputError
from sparkcluster.facts import parsers
from sparkcluster.labels import CLUSTER_LABEL, NODES_LABEL, PROFILE_LABEL
from sparkcluster.status import fleet

INV = make_inventory()
A, B = INV.nodes[0].name, INV.nodes[1].name


def c(name: str, profile: str, nodes: str | None, cluster: str | None = None) -> dict:
    labels = {CLUSTER_LABEL: cluster or INV.cluster.name, PROFILE_LABEL: profile}
    if nodes is not None:
        labels[NODES_LABEL] = nodes
    return {"Names": [f"/{name}"], "Labels": labels}


def test_group_by_profile_and_node_set():
    found = deployments.group(
        INV,
        {
            A: [c("s-head", "single", A)],
            B: [c("s-head", "single", B), c("other", "x", B, cluster="another-cluster")],
        },
    )
    assert [d.key for d in found] == [f"single@{A}", f"single@{B}"]
    pair = deployments.group(INV, {A: [c("h", "pair", f"{A},{B}")], B: [c("w", "pair", f"{A},{B}")]})
    assert [(d.key, d.containers) for d in pair] == [(f"pair@{A}+{B}", {A: ["h"], B: ["w"]})]
    # a container made before deployments existed belongs to every node of its profile
    old = deployments.group(INV, {A: [c("h", "pair", None)]})
    assert old[0].nodes == (A, B)


def test_group_reads_docker_inspect_too():
    """status finds deployments in its SSH round trip's `docker inspect` output (Config.Labels,
    Name), the Engine API lists them as Labels and Names: the same deployments either way."""

    def inspected(name, profile, nodes):
        ps = c(name, profile, nodes)
        return parsers.container_inspect(
            {"Name": ps["Names"][0], "Config": {"Labels": ps["Labels"]}, "State": {"Status": "running"}}
        )

    found = deployments.group(INV, {A: [inspected("s-head", "single", A)], B: [inspected("s-head", "single", B)]})
    assert [(d.key, d.containers) for d in found] == [
        (f"single@{A}", {A: ["s-head"]}),
        (f"single@{B}", {B: ["s-head"]}),
    ]


def test_target_needs_a_node_for_a_profile_as_wide_as_one_node():
    tp1 = profiles.load_profile("testbed-single")
    tp2 = profiles.load_profile("testbed")
    assert deployments.target(INV, tp2, None) is INV
    with pytest.raises(InputError, match="runs on 1 GPU"):
        deployments.target(INV, tp1, None)
    sub = deployments.target(INV, tp1, B)
    assert [(n.name, n.role) for n in sub.nodes] == [(B, "head")]
    one = INV.only([A])
    assert deployments.target(one, tp1, None) is one


def test_a_pair_of_four_nodes_is_named_node_by_node():
    data = {
        "cluster": {"name": "four", "topology": "switch"},
        "nodes": [
            {
                "name": f"s{i}",
                "role": "head" if i == 1 else "worker",
                "ssh": f"s{i}",
                "control_if": "e",
                "control_ip": f"10.0.0.{i}",
                "data_plane": [{"netdev": "e", "hca": "h"}],
            }
            for i in range(1, 5)
        ],
    }
    four = make_inventory(data)
    tp2 = profiles.load_profile("testbed")
    with pytest.raises(InputError, match="some of the nodes") as e:
        deployments.target(four, tp2, ())
    # the fix names nodes that make the profile's width, each with its own --node: it runs as printed
    assert "repeat --node" in e.value.message and e.value.fix == "sparkcluster up --profile testbed --node s1 --node s2"
    assert e.value.nodes == ("s1", "s2")
    sub = deployments.target(four, tp2, ("s3", "s4"))
    assert [(n.name, n.role) for n in sub.nodes] == [("s3", "head"), ("s4", "worker")]
    assert deployments.node_flags(("s3", "s4")) == " --node s3 --node s4" and deployments.node_flags(()) == ""


def test_conflicts_are_other_deployments_sharing_a_node():
    single_a = deployments.Deployment("single", (A,))
    single_b = deployments.Deployment("single", (B,))
    pair = deployments.Deployment("pair", (A, B))
    assert deployments.conflicts([single_a, single_b], INV.only([A]), "single") == []
    assert deployments.conflicts([single_a, single_b], INV, "pair") == [single_a, single_b]
    assert deployments.conflicts([pair], INV.only([B]), "single") == [pair]
    assert deployments.conflicts([pair], INV, "pair") == []
    assert deployments.select([single_a, single_b, pair], B, None) == [single_b, pair]
    assert deployments.select([single_a, single_b, pair], None, "pair") == [pair]


def test_on_change_reports_changes_appearances_and_departures():
    assert fleet.changes({"a@x": "healthy", "b@y": "healthy"}, {"a@x": "degraded", "c@z": "healthy"}) == [
        ("a@x", "healthy", "degraded"),
        ("c@z", "", "healthy"),
        ("b@y", "healthy", "gone"),
    ]
    assert fleet.changes({"a@x": "healthy"}, {"a@x": "healthy"}) == []


def test_on_change_command_gets_hostile_text_as_data(tmp_path):
    class St:
        problems = ['it\'s $(touch pwned) `id` "quoted"']

    env = fleet.hook_env("single@spark-a", "healthy", "degraded", St())
    assert env["SPARKCLUSTER_NODES"] == "spark-a" and env["SPARKCLUSTER_PROFILE"] == "single"
    out = subprocess.run(
        ["sh", "-c", 'printf "%s|%s|%s" "$SPARKCLUSTER_DEPLOYMENT" "$SPARKCLUSTER_STATE" "$SPARKCLUSTER_PROBLEMS"'],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert out.stdout == "single@spark-a|degraded|" + St.problems[0]
    assert not (tmp_path / "pwned").exists()


def test_a_failing_on_change_command_warns_and_its_change_is_offered_again(tmp_path, monkeypatch):
    """Issue 23: an alert that did not go out is a warning, and the next status runs it again."""
    from types import SimpleNamespace

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    st = SimpleNamespace(deployment="testbed@spark-head+spark-worker", state="degraded", problems=["x"], nodes=[])
    seen = tmp_path / "seen"
    failing = f'echo "$SPARKCLUSTER_STATE" >> {seen}; exit 3'
    warned = fleet.notify_changes("c", [st], failing)
    assert len(warned) == 1 and "exited 3" in warned[0] and "runs again" in warned[0]
    assert fleet.notify_changes("c", [st], failing)  # offered again: still not delivered
    assert seen.read_text().split() == ["degraded", "degraded"]
    assert fleet.notify_changes("c", [st], f'echo "$SPARKCLUSTER_STATE" >> {seen}') == []  # delivered
    assert fleet.notify_changes("c", [st], f"echo again >> {seen}") == []  # nothing changed since
    assert seen.read_text().split() == ["degraded", "degraded", "degraded"]


def test_down_node_refuses_when_what_runs_there_cannot_be_read():
    """Issue 23: a node unreachable, or whose Docker does not answer, is never "no deployment"."""
    from sparkcluster.down.down_plan import _refuse_unknown
    from sparkcluster.errors import SparkError

    silent = {"spark-b": "spark-b: the Docker engine did not answer containers (Read timed out)"}
    with pytest.raises(SparkError, match="spark-b: cannot tell what runs there.*Read timed out") as e:
        _refuse_unknown("spark-b", None, [], silent)
    assert e.value.exit_code != 0 and "docker ps" in e.value.fix
    with pytest.raises(SparkError, match="no deployment of 'single' on the nodes that answer; cannot read spark-b"):
        _refuse_unknown(None, "single", [], silent)
    _refuse_unknown("spark-a", None, [], silent)  # another node: what it runs was read


def test_the_gateway_is_no_deployment():
    """Issue 36: the gateway's container carries the cluster's label but serves no model of its own:
    it never shows as a deployment (so `down --node` never takes it for one, nor status for a node's)."""
    from sparkcluster.labels import GATEWAY_ROLE, ROLE_LABEL

    gw = {"Names": ["/sparkcluster-x-gateway"], "Labels": {CLUSTER_LABEL: INV.cluster.name, ROLE_LABEL: GATEWAY_ROLE}}
    found = deployments.group(INV, {A: [gw, c("s-head", "single", A)], B: [c("s-head", "single", B)]})
    assert [d.key for d in found] == [f"single@{A}", f"single@{B}"]
