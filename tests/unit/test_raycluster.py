"""Ray membership as Ray's state API reports it on the head, compared with the inventory."""

from __future__ import annotations

import json

from conftest import inventory_dict, make_inventory

from sparkcluster.deployment.ray_members import RayNode, membership_problems, nodes_from_state_api

HEAD_IP, WORKER_IP = "198.19.2.1", "198.19.2.2"


def nodes_line(rows: list[dict]) -> str:
    """The Ray state API document (`/api/v0/nodes`) for these rows, as the head's curl prints it."""
    result = [
        {
            "node_id": f"id{i}",
            "node_ip": r["ip"],
            "is_head_node": i == 0,
            "state": "ALIVE" if r["alive"] else "DEAD",
            "node_name": r.get("host", ""),
            "resources_total": {"CPU": 2.0, "GPU": r["gpus"], f"node:{r['ip']}": 1.0},
        }
        for i, r in enumerate(rows)
    ]
    return json.dumps({"result": True, "msg": "", "data": {"result": {"total": len(result), "result": result}}})


def parse_membership(text: str):
    return nodes_from_state_api(text)


def good_rows() -> list[dict]:
    return [
        {"ip": HEAD_IP, "alive": True, "gpus": 1.0, "host": "spark-head"},
        {"ip": WORKER_IP, "alive": True, "gpus": 1.0, "host": "spark-worker"},
    ]


def test_inventory_ips_are_what_the_tests_assume():
    inv = make_inventory()
    assert (str(inv.head.control_ip), str(inv.workers[0].control_ip)) == (HEAD_IP, WORKER_IP)


def test_state_api_document_to_nodes():
    assert parse_membership(nodes_line(good_rows())) == [
        RayNode(HEAD_IP, True, 1.0, "spark-head"),
        RayNode(WORKER_IP, True, 1.0, "spark-worker"),
    ]


def test_dead_node_and_gpu_as_float():
    (n,) = parse_membership(nodes_line([{"ip": HEAD_IP, "alive": False, "gpus": 2}]))
    assert n == RayNode(HEAD_IP, False, 2.0, "")
    assert isinstance(n.gpus, float)


def test_no_answer_is_none():
    # the dashboard is not up yet: curl prints nothing, or an error
    assert parse_membership("") is None
    assert parse_membership("curl: (7) Failed to connect to 127.0.0.1 port 8265") is None


def test_empty_cluster():
    assert parse_membership(nodes_line([])) == []


def test_all_good_has_no_problems():
    assert membership_problems(make_inventory(), parse_membership(nodes_line(good_rows()))) == []


def test_worker_missing():
    rows = good_rows()[:1]
    problems = membership_problems(make_inventory(), parse_membership(nodes_line(rows)))
    assert problems == [f"spark-worker has not joined at {WORKER_IP}"]


def test_dead_worker_counts_as_missing():
    rows = good_rows()
    rows[1]["alive"] = False
    problems = membership_problems(make_inventory(), parse_membership(nodes_line(rows)))
    assert problems == [f"spark-worker has not joined at {WORKER_IP}"]


def test_worker_at_link_local_address_is_missing_and_a_stranger():
    for wrong in ("169.254.12.7", "172.17.0.1", "192.168.1.12"):
        rows = good_rows()
        rows[1]["ip"] = wrong
        problems = membership_problems(make_inventory(), parse_membership(nodes_line(rows)))
        assert len(problems) == 2, problems
        assert problems[0] == f"spark-worker has not joined at {WORKER_IP}"
        assert wrong in problems[1]
        assert "no inventory control IP" in problems[1]
        assert not any("spark-head" in p for p in problems)


def test_gpu_count_wrong():
    rows = good_rows()
    rows[1]["gpus"] = 0.0
    problems = membership_problems(make_inventory(), parse_membership(nodes_line(rows)))
    assert problems == ["spark-worker reports 0 GPU(s), expected 1"]
    rows[1]["gpus"] = 2.0
    assert membership_problems(make_inventory(), parse_membership(nodes_line(rows))) == [
        "spark-worker reports 2 GPU(s), expected 1"
    ]


def test_gpu_count_from_inventory():
    data = inventory_dict()
    data["nodes"][1]["gpus"] = 2
    inv = make_inventory(data)
    rows = good_rows()
    rows[1]["gpus"] = 2.0
    assert membership_problems(inv, parse_membership(nodes_line(rows))) == []


def test_nothing_joined():
    problems = membership_problems(make_inventory(), [])
    assert problems == [f"spark-head has not joined at {HEAD_IP}", f"spark-worker has not joined at {WORKER_IP}"]
