"""Several deployments on one node (issue 60, item 1): each in a slot of its own, with its own
container names and port block; slot 0 keeps the names and ports of before (an upgrade of
sparkcluster recreates nothing); admission by the one memory arithmetic (node/memory_fit.admit),
whose refusal names who holds how much; `down --profile` removes one deployment's containers only;
`events` reads each deployment's journal."""

from __future__ import annotations

import json

import pytest
from conftest import make_inventory

from sparkcluster.config import profile as profiles
from sparkcluster.config.images import image_ref
from sparkcluster.config.inventory import MAX_SLOTS, port_block
from sparkcluster.container.spec import agent_config, ray_start_argv, spec_for
from sparkcluster.deployment import deployments
from sparkcluster.errors import InputError
from sparkcluster.facts import HostFacts, parsers
from sparkcluster.labels import (
    CLUSTER_LABEL,
    MEMORY_LABEL,
    NODES_LABEL,
    PROFILE_LABEL,
    ROLE_LABEL,
    SLOT_LABEL,
    container_name,
    slot_of,
)
from sparkcluster.monitor import scrape
from sparkcluster.node import memory_fit
from sparkcluster.node.contract import CONFIG_PATH, STATE_API_URL
from sparkcluster.up import bringup
from sparkcluster.up.plan import make_plan

HEAD, WORKER = "spark-head", "spark-worker"
GB = 10**9
CLUSTER = make_inventory().cluster.name


@pytest.fixture(scope="module")
def single() -> profiles.Profile:
    return profiles.load_profile("testbed-single")


def test_slot_zero_keeps_the_names_and_ports_of_before():
    # the names every container made before issue 60 carries: an upgrade must find them again
    assert container_name("c", "head", HEAD) == "sparkcluster-c-head"
    assert container_name("c", "worker", WORKER) == "sparkcluster-c-worker-spark-worker"
    assert container_name("c", "head", HEAD, 0) == "sparkcluster-c-head"
    assert container_name("c", "head", HEAD, 2) == "sparkcluster-c-d2-head"
    assert container_name("c", "worker", WORKER, 1) == "sparkcluster-c-d1-worker-spark-worker"
    inv = make_inventory()
    assert inv.at_slot(0) is inv and inv.slot == 0 and inv.ray_ports() == {}
    b = port_block(0, inv.cluster)
    c = inv.cluster
    assert (b["api_port"], b["ray_port"], b["master_port"], b["agent_port"]) == (
        c.api_port,
        c.ray_port,
        c.master_port,
        c.agent_port,
    )
    for n in inv.nodes:  # `ray start` exactly as before: no port flag more
        assert not any("worker-port" in a or "dashboard-port" in a for a in ray_start_argv(inv, n))
        assert agent_config(inv, n)["state_api"] == STATE_API_URL


def test_no_two_slots_share_a_port():
    inv = make_inventory()
    used: dict[int, str] = {}
    for slot in range(MAX_SLOTS):
        b = port_block(slot, inv.cluster)
        ports = [v for k, v in b.items() if v is not None and "worker" not in k]
        if slot:  # a later slot's worker range: its own, clear of Ray's default range (10002-19999)
            assert 19999 < b["min_worker_port"] <= b["max_worker_port"]
            ports += list(range(b["min_worker_port"], b["max_worker_port"] + 1))
            assert not 10002 <= b["client_server_port"] <= 19999
        for p in ports:
            assert p not in used, f"slot {slot}: port {p} is also {used[p]}"
            used[p] = f"slot {slot}"
    with pytest.raises(ValueError):
        port_block(MAX_SLOTS, inv.cluster)


def test_a_later_slot_gets_its_own_names_labels_ports_and_ray_flags(single):
    inv = make_inventory().only([HEAD])
    one, two = inv, inv.at_slot(1)
    assert two.slot == 1 and two.cluster.api_port == one.cluster.api_port + 10
    assert (two.cluster.ray_port, two.cluster.master_port, two.cluster.agent_port) == (
        one.cluster.ray_port + 10,
        one.cluster.master_port + 10,
        one.cluster.agent_port + 10,
    )
    assert one.cluster.api_port == 8000  # the copy never changes the inventory it came from
    image = image_ref(two, single)
    a, b = spec_for(one, single, one.head, image), spec_for(two, single, two.head, image)
    assert a.name != b.name and b.name.endswith("-d1-head")
    assert SLOT_LABEL not in a.labels and b.labels[SLOT_LABEL] == "1"
    assert a.labels[MEMORY_LABEL] == b.labels[MEMORY_LABEL] == "0.2"
    assert json.loads(b.files[CONFIG_PATH])["report_port"] == two.cluster.agent_port == 8307
    head = ray_start_argv(two, two.head)
    assert "--port=6389" in head and "--dashboard-port=8275" in head
    assert "--ray-client-server-port=20000" in head and "--min-worker-port=20010" in head
    assert agent_config(two, two.head)["state_api"].startswith("http://127.0.0.1:8275/")
    pair = make_inventory().at_slot(2)
    worker = ray_start_argv(pair, pair.workers[0])
    assert f"--address={pair.head.control_ip}:6399" in worker
    assert "--dashboard-port=8285" not in worker and "--min-worker-port=21010" in worker


def test_the_plan_of_a_later_slot_leaves_the_first_slots_containers_alone(single):
    """`up --beside`: the facts hold only this slot's containers (`gather`), so the plan creates its
    own and never removes the other's; the engine listens on the slot's API port. One node without Ray
    serves the base image as pulled: the head holds it."""
    inv = make_inventory().only([HEAD]).at_slot(1)
    plan = make_plan(
        inv,
        single,
        {HEAD: HostFacts(HEAD, hostname=HEAD, image_id="sha256:" + "ab" * 32)},
        serving=False,
        replace=False,
    )
    assert plan.remove == {}
    assert [s.name for s in plan.containers] == [f"sparkcluster-{CLUSTER}-d1-head"]
    assert plan.serve.container == f"sparkcluster-{CLUSTER}-d1-head" and plan.serve.port == 8010
    assert plan.serve.argv[plan.serve.argv.index("--port") + 1] == "8010"


def test_facts_split_a_nodes_containers_by_slot(monkeypatch):
    from sparkcluster import facts as facts_mod

    first = {"Id": "a", "Name": "/sparkcluster-testbed-head", "Config": {"Labels": {PROFILE_LABEL: "x"}}}
    later = {"Id": "b", "Name": "/sparkcluster-testbed-d1-head", "Config": {"Labels": {SLOT_LABEL: "1"}}}
    got = HostFacts(HEAD, ours=parsers.docker_inspect_json(json.dumps([first, later])))
    monkeypatch.setattr(facts_mod, "parse", lambda *a: got)
    monkeypatch.setattr(facts_mod, "probe_script", lambda *a, **k: "")

    class Host:
        name, node = HEAD, make_inventory().node(HEAD)

        def run(self, *a, **k):
            return type("R", (), {"timed_out": False, "stdout": ""})()

    out = facts_mod.gather(Host(), make_inventory().only([HEAD]).at_slot(1), None)
    assert [c.id for c in out.ours] == ["b"] and [c.id for c in out.beside] == ["a"]
    assert slot_of({}) == 0 and slot_of({SLOT_LABEL: "x"}) == 0


def _listed(name, profile, slot=0, fraction=None, cid=None, role="head"):
    labels = {CLUSTER_LABEL: CLUSTER, PROFILE_LABEL: profile, NODES_LABEL: HEAD, ROLE_LABEL: role}
    if slot:
        labels[SLOT_LABEL] = str(slot)
    if fraction is not None:
        labels[MEMORY_LABEL] = str(fraction)
    return {"Id": cid or name + "-id", "Names": [f"/{name}"], "Labels": labels}


def test_grouping_reads_slots_ids_and_shares():
    inv = make_inventory()
    found = deployments.group(
        inv,
        {
            HEAD: [
                _listed(f"sparkcluster-{CLUSTER}-head", "a", 0, 0.2),
                _listed(f"sparkcluster-{CLUSTER}-d1-head", "b", 1),
            ]
        },
    )
    assert [(d.profile, d.slot, d.ids, d.fraction) for d in found] == [
        ("a", 0, {HEAD: {f"sparkcluster-{CLUSTER}-head-id"}}, 0.2),
        ("b", 1, {HEAD: {f"sparkcluster-{CLUSTER}-d1-head-id"}}, None),
    ]
    assert deployments.free_slot(found, (HEAD,)) == 2
    assert deployments.free_slot(found, (WORKER,)) == 0
    assert deployments.slot_for(found, (HEAD,), "b") == 1  # a deployment keeps its slot
    sub = found[1].inventory(inv)
    assert sub.slot == 1 and [n.name for n in sub.nodes] == [HEAD] and sub.cluster.api_port == 8010
    full = [deployments.Deployment(str(i), (HEAD,), slot=i) for i in range(MAX_SLOTS)]
    with pytest.raises(InputError, match="no slot is left"):
        deployments.free_slot(full, (HEAD,))


def test_admission_counts_every_share_and_the_floor():
    total, floor = 128 * GB, 6 * memory_fit.GiB
    a = memory_fit.Held("'qwen'", 0.55)  # seed 004's Spark 1: --gpu-memory-utilization 0.55
    assert memory_fit.admit(total, [a], memory_fit.Held("'asr'", 0.2), floor) is None
    why = memory_fit.admit(total, [a, memory_fit.Held("'tts'", 0.2)], memory_fit.Held("'gemma'", 0.3), floor)
    assert why is not None
    assert "'qwen' holds 70.4 GB" in why and "'tts' holds 25.6 GB" in why
    assert why.startswith("'gemma' needs 38.4 GB") and "short" in why
    unknown = memory_fit.admit(total, [memory_fit.Held("'old'", None)], memory_fit.Held("'b'", 0.1), floor)
    assert "'old' holds an unknown share" in unknown


def test_up_beside_is_refused_naming_who_holds_the_memory(single):
    inv = make_inventory().only([HEAD]).at_slot(1)
    big = single.model_copy(
        update={"name": "big", "serve": single.serve.model_copy(update={"gpu_memory_utilization": 0.7})}
    )
    held = [deployments.Deployment("testbed-single", (HEAD,), slot=0, fraction=0.2)]
    facts = {HEAD: HostFacts(HEAD, mem=parsers.MemInfo(24 * memory_fit.GiB, 20 * memory_fit.GiB, 0))}
    with pytest.raises(InputError) as e:
        bringup._admit(inv, big, facts, held)
    assert "'big'" in e.value.message and "testbed-single" in e.value.message
    assert any("'testbed-single' holds 5.2 GB" in d for d in e.value.details), e.value.details
    assert "down --profile testbed-single" in e.value.fix and "--beside" in e.value.fix
    bringup._admit(inv, single, facts, held)  # a second 0.2 fits beside the first
    with pytest.raises(InputError, match="memory"):  # MemTotal unread: nothing is admitted blind
        bringup._admit(inv, single, {HEAD: HostFacts(HEAD)}, held)


def test_monitoring_scrapes_a_later_slots_engine_and_agents():
    inv = make_inventory()
    found = [
        deployments.Deployment("testbed-single", (HEAD,), slot=0),
        deployments.Deployment("testbed-single", (HEAD,), slot=1),
    ]
    served = scrape.served(inv, found)
    assert [s.port for s in served] == [8000, 8010]
    got = {(t.job, t.address) for t in scrape.targets(inv, served)}
    ip = inv.node(HEAD).control_ip
    assert (scrape.AGENT_JOB, f"{ip}:8297") in got and (scrape.AGENT_JOB, f"{ip}:8307") in got
    assert (scrape.VLLM_JOB, f"{ip}:8010") in got


class _Api:
    def __init__(self, listed):
        self.listed = listed

    def containers(self, all=False, filters=None):
        return self.listed

    def inspect_container(self, name):
        return {}


def test_events_reads_each_deployments_journal():
    from sparkcluster.cli import events_cmd

    api = _Api(
        [
            _listed(f"sparkcluster-{CLUSTER}-head", "a"),
            _listed(f"sparkcluster-{CLUSTER}-d1-head", "b", 1),
            _listed(f"sparkcluster-{CLUSTER}-d1-worker-x", "b", 1, role="worker"),
        ]
    )
    assert events_cmd.journals(api, CLUSTER, HEAD, None) == [
        (f"sparkcluster-{CLUSTER}-d1-head", "b"),
        (f"sparkcluster-{CLUSTER}-head", "a"),
    ]
    assert events_cmd.journals(api, CLUSTER, HEAD, "b") == [(f"sparkcluster-{CLUSTER}-d1-head", "b")]
    assert events_cmd.journals(api, CLUSTER, HEAD, "zzz") == []


def test_placement_keeps_a_slot_asks_for_beside_and_replace_clears_the_nodes():
    D = deployments.Deployment
    first, later = D("a", (HEAD,), slot=0), D("b", (HEAD,), slot=1)
    pair = D("pair", (HEAD, WORKER), slot=0)
    # nothing runs: slot 0, the names and ports of before
    assert bringup.placement([], [], (HEAD,), "a", False, False) == (0, [], False)
    # another runs: refused unless --beside (the caller names it), beside in the lowest free slot
    assert bringup.placement([first], [first], (HEAD,), "b", False, False) == (0, [], False)
    assert bringup.placement([first], [first], (HEAD,), "b", False, True) == (1, [], True)
    # a second `up` of either keeps its slot without being asked again: nothing is recreated
    assert bringup.placement([first, later], [later], (HEAD,), "a", False, False) == (0, [], True)
    assert bringup.placement([first, later], [first], (HEAD,), "b", False, False) == (1, [], True)
    # alone in slot 1 (the first taken down): it stays there
    assert bringup.placement([later], [], (HEAD,), "b", False, False) == (1, [], False)
    # --replace: slot 0, alone; the other slot's deployment and a pair over the node taken down whole
    assert bringup.placement([first, later], [first], (HEAD,), "b", True, False) == (0, [later], False)
    assert bringup.placement([pair], [pair], (HEAD,), "a", True, False) == (0, [pair], False)
    # the pair in the node's next free slot beside a one-node deployment on one of its nodes
    assert bringup.placement([first], [first], (HEAD, WORKER), "pair", False, True) == (1, [], True)
