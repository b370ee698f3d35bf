"""Ray membership as the head's snippet prints it, compared with the inventory."""

from __future__ import annotations

import json

from conftest import inventory_dict, make_inventory

from sparkcluster.raycluster import MEMBERSHIP_SNIPPET, RayNode, membership_problems, parse_membership

HEAD_IP, WORKER_IP = "198.19.2.1", "198.19.2.2"


def nodes_line(rows: list[dict]) -> str:
    return "@@nodes " + json.dumps(rows)


def good_rows() -> list[dict]:
    return [{"ip": HEAD_IP, "alive": True, "gpus": 1.0, "host": "spark-head"},
            {"ip": WORKER_IP, "alive": True, "gpus": 1.0, "host": "spark-worker"}]


def test_inventory_ips_are_what_the_tests_assume():
    inv = make_inventory()
    assert (str(inv.head.control_ip), str(inv.workers[0].control_ip)) == (HEAD_IP, WORKER_IP)


def test_parse_membership_among_other_output():
    out = "2026-11-22 INFO worker.py: Connecting to existing Ray cluster\n" + nodes_line(good_rows()) + "\ntrailing\n"
    assert parse_membership(out) == [RayNode(HEAD_IP, True, 1.0, "spark-head"),
                                     RayNode(WORKER_IP, True, 1.0, "spark-worker")]


def test_parse_membership_types_and_missing_host():
    out = nodes_line([{"ip": HEAD_IP, "alive": 1, "gpus": 2}])
    (n,) = parse_membership(out)
    assert n == RayNode(HEAD_IP, True, 2.0, "")
    assert isinstance(n.gpus, float) and n.alive is True


def test_parse_membership_without_marker_is_none():
    assert parse_membership("") is None
    assert parse_membership("Traceback (most recent call last):\nConnectionError: no Ray\n") is None


def test_parse_membership_empty_list():
    assert parse_membership(nodes_line([])) == []


def test_snippet_prints_the_marker_parse_reads():
    assert "@@nodes " in MEMBERSHIP_SNIPPET
    compile(MEMBERSHIP_SNIPPET, "<snippet>", "exec")


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
        "spark-worker reports 2 GPU(s), expected 1"]


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
