"""Readings of the engine and the node, written once: the agent uses them in the container and the
controller imports them (Prometheus text, MemAvailable, /health, the one-token probe, Ray's
membership from its state API)."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request


def mem_available(meminfo: str) -> int | None:
    m = re.search(r"^MemAvailable:\s+(\d+)\s*kB", meminfo, re.M)
    return int(m.group(1)) * 1024 if m else None


_METRIC = re.compile(r"^(vllm:num_requests_running|vllm:generation_tokens_total)(?:\{[^}]*\})?\s+([-+0-9.eE]+)\s*$")


def engine_figures(metrics: str) -> tuple[float | None, float | None]:
    """(requests running, generated tokens total) from vLLM's Prometheus text, summed over labels."""
    got: dict[str, float] = {}
    for line in metrics.splitlines():
        m = _METRIC.match(line.strip())
        if m:
            got[m.group(1)] = got.get(m.group(1), 0.0) + float(m.group(2))
    return got.get("vllm:num_requests_running"), got.get("vllm:generation_tokens_total")


def http_status(url: str, timeout: float) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def one_token(base: str, model: str, api_key: str | None, timeout: float) -> str:
    """"" when a one-token completion returns within `timeout`, else why not."""
    body = json.dumps({"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "ping"}]}).encode()
    req = urllib.request.Request(f"{base}/v1/chat/completions", data=body, method="POST",
                                 headers={"Content-Type": "application/json",
                                          **({"Authorization": f"Bearer {api_key}"} if api_key else {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout):
            return ""
    except urllib.error.HTTPError as e:
        return "" if e.code == 401 else f"a one-token completion answered HTTP {e.code}"
    except OSError:  # timeouts included
        return f"a one-token completion did not return within {timeout:g}s"
