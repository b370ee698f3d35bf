"""engine_traits: both sides of each behaviour gate (vLLM 0.21 older executor, 0.32 V2 executor)."""

from sparkcluster.config.engine_traits import traits


def test_vllm_0_21_older_executor():
    t = traits("0.21.0")
    assert t.ray_executor == "v1"
    assert t.head_values_overwrite_ranks and t.checks_unique_node_ips
    assert "unique IP address" in t.node_ip_consequence()


def test_vllm_0_32_v2_executor():
    t = traits("0.32.0")
    assert t.ray_executor == "v2"
    assert not t.head_values_overwrite_ranks and not t.checks_unique_node_ips
    assert "does not check node IPs itself" in t.node_ip_consequence()


def test_v2_switch_forwarded_by_the_profile_wins():
    assert traits("0.32.0", {"VLLM_USE_RAY_V2_EXECUTOR_BACKEND": "0"}).ray_executor == "v1"
    assert traits("0.31.9", {"VLLM_USE_RAY_V2_EXECUTOR_BACKEND": "1"}).ray_executor == "v2"
    assert traits("0.32.1rc1").ray_executor == "v2"


def test_vllm_host_ip_check_follows_the_served_version():
    # both sides of the gate, through the check itself
    from tests.unit.test_checks import W, healthy, results, vllm_host_ip_wrong

    for version, says in (("0.21.0", "unique IP address"), ("0.32.0", "does not check node IPs itself")):
        s = healthy()
        s.expect["vllm_version"] = version
        vllm_host_ip_wrong(s)
        r = results(s)[("net.vllm_host_ip", W)]
        assert r.status == "fail" and says in r.detail, r.detail
