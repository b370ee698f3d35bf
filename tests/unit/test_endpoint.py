"""endpoint: the vLLM metric names status reads, from real /metrics output."""

from pathlib import Path

from sparkcluster.deployment.endpoint import METRICS, parse_metrics

CAPTURED = Path(__file__).resolve().parents[1] / "captured" / "vllm-0.32-metrics.txt"


def test_parse_metrics_real_vllm_0_32():
    m = parse_metrics(CAPTURED.read_text())
    assert set(m) == set(METRICS.values())  # every name status reads exists in vLLM 0.32
    assert m["requests_running"] == 2.0
    assert m["requests_waiting"] == 0.0
    assert m["generation_tokens_total"] == 6064.0
    assert m["prompt_tokens_total"] == 774.0
    # summed over the finished_reason label set (stop 0 + length 22 + abort 0)
    assert m["requests_succeeded_total"] == 22.0
    assert 0.0 <= m["kv_cache_usage"] < 1.0


def test_parse_metrics_ignores_comments_other_names_and_garbage():
    text = (
        "# HELP vllm:num_requests_running x\n# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0"} 3\n'
        'vllm:num_requests_running_other 9\nnot a sample\nvllm:kv_cache_usage_perc{a="}"} nan-ish\n'
    )
    assert parse_metrics(text) == {"requests_running": 3.0}
