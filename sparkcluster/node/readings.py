"""Readings of the engine and the node, each written once: the agent uses them inside the container
and the controller imports the same functions (Prometheus text, /proc/meminfo, Ray's state API, the
shared-memory segment names, the one-token completion's request and verdict, /health).

Standard library only: this file is shipped into every container."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request

# ---- Prometheus text (vLLM's /metrics) ---------------------------------------------------------

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eE]+|NaN|[+-]Inf)\s*(\d+)?\s*$")


def prometheus(text: str, names) -> dict[str, float]:
    """{metric name: value} for the names asked, each summed over its label sets (one engine per
    model here); a name absent from the text is absent from the result."""
    out: dict[str, float] = {}
    wanted = set(names)
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line.strip())
        if not m or m.group(1) not in wanted:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        out[m.group(1)] = out.get(m.group(1), 0.0) + value
    return out


RUNNING, WAITING, GENERATED = "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:generation_tokens_total"
KV_USAGE = "vllm:kv_cache_usage_perc"
# What moves while the engine advances work (docs/field-notes.md, "What counts as progress"): in
# vLLM's V1 engine a partly computed (chunked) prefill produces no output, so the token counters
# stand still until the whole prompt is in; the scheduler's KV-cache usage grows with every chunk
# it schedules (SchedulerStats.kv_cache_usage, published each step), and the request counters and
# queue gauges move whenever work comes or goes.
PROGRESS = (
    GENERATED,
    "vllm:prompt_tokens_total",
    KV_USAGE,
    RUNNING,
    WAITING,
    "vllm:request_success_total",
    "vllm:num_preemptions_total",
    "vllm:prefix_cache_queries_total",
    "vllm:iteration_tokens_total_count",
)


def engine_figures(metrics: str) -> tuple[float | None, float | None]:
    """(requests running, generated tokens total) from vLLM's Prometheus text, summed over labels."""
    got = prometheus(metrics, (RUNNING, GENERATED))
    return got.get(RUNNING), got.get(GENERATED)


def progress_figures(metrics: str) -> dict[str, float]:
    """Every progress series the engine exposes, by name (absent ones absent)."""
    return prometheus(metrics, PROGRESS)


# ---- /proc/meminfo -----------------------------------------------------------------------------


def meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo as {field: bytes} (fields in kB converted; counts left as they are)."""
    vals = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            vals[key.strip()] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)
    return vals


def mem_available(text: str) -> int | None:
    return meminfo(text).get("MemAvailable")


def mem_total(text: str) -> int | None:
    return meminfo(text).get("MemTotal")


def held(text: str) -> dict[str, int]:
    """What holds a node's memory as far as /proc/meminfo tells it, in bytes: processes' own pages
    (AnonPages), shared memory (Shmem: /dev/shm, IPC segments) and the rest that MemAvailable does
    not count (the kernel and drivers, the GPU's allocations on unified memory). What a refused
    start names (issue 36)."""
    m = meminfo(text)
    total, avail = m.get("MemTotal"), m.get("MemAvailable")
    anon, shm = m.get("AnonPages", 0), m.get("Shmem", 0)
    out = {"processes": anon, "shared memory": shm}
    if total is not None and avail is not None:
        out["kernel, drivers and GPU"] = max(0, total - avail - anon - shm)
    return out


# ---- Ray's state API (/api/v0/nodes) -----------------------------------------------------------


def ray_rows(text: str) -> list[dict]:
    """Ray state API `/api/v0/nodes`: {"data": {"result": {"result": [{node_ip, state, resources_total}]}}}."""
    return ray_listing(text)[0]


def ray_listing(text: str) -> tuple[list[dict], bool]:
    """(rows, complete): the rows as `ray_rows`, and whether they are every row the request asked
    for. The API filters the nodes (the request's `filter_keys`/`filter_values`), sorts them by
    node_id and cuts them at its `limit`; its `num_filtered` says how many passed the filter, so a
    whole answer holds that many (its `total` counts every node the GCS holds, filtered out or not:
    Ray 2.60's `state_aggregator.list_nodes`; tests/captured/ray-2.60). No rows is no answer."""
    try:
        doc = json.loads(text)
    except ValueError:
        return [], False
    data = doc.get("data") if isinstance(doc, dict) else None
    result = data.get("result") if isinstance(data, dict) else None
    rows = result.get("result") if isinstance(result, dict) else result
    rows = [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []
    wanted = result.get("num_filtered") if isinstance(result, dict) else None
    complete = bool(rows) and isinstance(wanted, int) and len(rows) >= wanted
    return rows, complete


def ray_node_query(url: str, node_id: str) -> str:
    """`url` (Ray's state API for nodes: contract.STATE_API_URL) asking for one node by its node_id,
    in whatever state it is (Ray's filter `node_id=`, the one `ray get nodes ID` sends): a DEAD
    node's row says why it died."""
    query = {"filter_keys": "node_id", "filter_predicates": "=", "filter_values": node_id, "detail": "true"}
    return urllib.parse.urlunsplit(urllib.parse.urlsplit(url)._replace(query=urllib.parse.urlencode(query)))


def live_at(rows: list[dict], ip: str) -> list[dict]:
    """Ray's live nodes at `ip`."""
    return [r for r in rows if r.get("state") == "ALIVE" and r.get("node_ip") == ip]


def alive_gpus(rows: list[dict], ip: str) -> float:
    """GPUs Ray counts on its live nodes at `ip`."""
    return sum(float(r.get("resources_total", {}).get("GPU", 0)) for r in live_at(rows, ip))


# ---- shared-memory segments vLLM's processes create (multiprocessing) ---------------------------

SHM_SEGMENT = re.compile(r"/dev/shm/psm_[0-9a-zA-Z_]+")


# ---- the endpoint ------------------------------------------------------------------------------


def one_token_body(model: str, max_tokens: int = 1) -> dict:
    """The completion every probe sends (agent, status, up, bench): one short chat turn."""
    return {"model": model, "max_tokens": max_tokens, "messages": [{"role": "user", "content": "ping"}]}


def http_status(url: str, timeout: float) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def one_token(base: str, model: str, api_key: str | None, timeout: float) -> str:
    """ "" when a one-token completion returns within `timeout`, else why not."""
    body = json.dumps(one_token_body(model)).encode()
    req = urllib.request.Request(
        f"{base}/v1/chat/completions",
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", **({"Authorization": f"Bearer {api_key}"} if api_key else {})},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout):
            return ""
    except urllib.error.HTTPError as e:
        return "" if e.code == 401 else f"a one-token completion answered HTTP {e.code}"
    except OSError:  # timeouts included
        return f"a one-token completion did not return within {timeout:g}s"
