"""The chain planned for several workers (issue 27): the order is the inventory's, each hop on a
data-plane subnet its two nodes share (a switch's rail, a ring's cable), else the control IPs."""

from __future__ import annotations

import ipaddress

from test_topology import PORT0, _four, _ring, _switch

from sparkcluster.facts import HostFacts, parsers
from sparkcluster.movement import chain


def test_a_pair_is_one_hop_on_their_shared_subnet():
    inv, found = _four("switch", _switch)
    hops = chain.plan(inv, found, ["spark-2"])
    assert hops == [chain.Hop("spark-1", "198.19.1.1", "spark-2", "198.19.1.2", "198.19.1.0/24")]
    assert chain.describe(hops, 0) == "from spark-1 over 198.19.1.1 -> 198.19.1.2 (198.19.1.0/24), the end of the chain"


def test_a_switch_of_four_chains_along_one_rail_so_the_heads_port_carries_one_copy():
    inv, found = _four("switch", _switch)
    hops = chain.plan(inv, found, ["spark-4", "spark-2", "spark-3"])  # the order is the inventory's
    assert [(h.src, h.dst) for h in hops] == [("spark-1", "spark-2"), ("spark-2", "spark-3"), ("spark-3", "spark-4")]
    assert [(h.src_ip, h.dst_ip) for h in hops] == [
        ("198.19.1.1", "198.19.1.2"),
        ("198.19.1.2", "198.19.1.3"),
        ("198.19.1.3", "198.19.1.4"),
    ]
    assert sum(h.src == "spark-1" for h in hops) == 1
    assert chain.describe(hops, 1) == (
        "from spark-2 over 198.19.1.2 -> 198.19.1.3 (198.19.1.0/24), forwarding to "
        "spark-4 over 198.19.1.3 -> 198.19.1.4 (198.19.1.0/24) as it arrives"
    )


def test_a_ring_of_four_sends_along_its_cables():
    inv, found = _four("ring", _ring)
    hops = chain.plan(inv, found, ["spark-2", "spark-3", "spark-4"])
    assert [(h.src, h.src_ip, h.dst, h.dst_ip, h.via) for h in hops] == [
        ("spark-1", "198.19.112.1", "spark-2", "198.19.112.2", "198.19.112.0/24"),
        ("spark-2", "198.19.123.2", "spark-3", "198.19.123.3", "198.19.123.0/24"),
        ("spark-3", "198.19.134.3", "spark-4", "198.19.134.4", "198.19.134.0/24"),
    ]


def test_a_ring_hop_between_nodes_without_a_cable_takes_the_control_link():
    inv, found = _four("ring", _ring)
    hops = chain.plan(inv, found, ["spark-2", "spark-4"])  # spark-3 holds the data already
    assert hops[0].via == "198.19.112.0/24"
    assert (hops[1].src_ip, hops[1].dst_ip, hops[1].via) == ("192.168.1.12", "192.168.1.14", "the control link")


def test_no_facts_or_no_address_falls_back_to_the_control_ips():
    inv, found = _four("switch", _switch)
    assert chain.plan(inv, {}, ["spark-2"])[0].via == "the control link"
    found["spark-2"] = HostFacts(
        "spark-2",
        interfaces={
            PORT0[0]: parsers.Interface(
                PORT0[0],
                9000,
                True,
                True,
                "UP",
                [parsers.Address(ipaddress.IPv4Address("10.9.9.2"), ipaddress.IPv4Network("10.9.9.0/24"))],
            )
        },
    )
    h = chain.plan(inv, found, ["spark-2"])[0]
    assert (h.src_ip, h.dst_ip) == ("192.168.1.11", "192.168.1.12")
