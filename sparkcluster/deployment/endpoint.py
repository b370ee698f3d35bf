"""What the OpenAI-compatible endpoint says about the engine behind it, from the controller.

`/health` is not readiness: vLLM answers it without a round trip to the engine, so a rank that is
stopped leaves it at 200 while every completion hangs (seen with vLLM 0.32: a SIGSTOPped rank-1
worker; field notes "Health is not readiness"). A one-token completion with a bound is the probe
that tells a wedged engine from a serving one. `/metrics` gives the serving figures under vLLM's
own `vllm:` names. The canary's completions (`ask_canary`) and one-stream speed (`ask_speed`) are
asked here too, by `up`'s serve stage, `upgrade` and `bench --canary`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

import httpx

from sparkcluster import redact
from sparkcluster.errors import ConnectError, InputError, SparkError
from sparkcluster.node import canary, readings

PROBE_TIMEOUT_S = 10.0
# the vLLM metric names status reads (vLLM 0.2x-0.3x; labelled per engine and model)
METRICS = {
    "vllm:num_requests_running": "requests_running",
    "vllm:num_requests_waiting": "requests_waiting",
    "vllm:kv_cache_usage_perc": "kv_cache_usage",
    "vllm:generation_tokens_total": "generation_tokens_total",
    "vllm:prompt_tokens_total": "prompt_tokens_total",
    "vllm:request_success_total": "requests_succeeded_total",
}


@contextlib.contextmanager
def reached(host, inv, port: int) -> Iterator[str]:
    """The base URL at which the controller asks a deployment's engine: its head's address (`host`,
    the head's SSH connection; `inv`, the deployment's inventory) when the owner lets engines listen
    on every address (`engines_listen = "all"`); else (the default: the gateway the only door) a
    local port forwarded through that SSH connection to where the engine listens on the head (its
    control address, loopback on a one-node cluster), for as long as the block runs."""
    if inv.cluster.engines_listen != "control":
        yield f"http://{host.address}:{port}"
        return
    from sparkcluster.remote.forward import Forward  # only with engines_listen = "control"

    ip = inv.engine_address()
    try:  # once, so that an sshd refusing to forward is said as such, not read as an engine not answering
        host.tunnel(ip, port).close()
    except (InputError, ConnectError):  # forwarding refused, or the SSH connection itself lost
        raise
    except Exception:  # noqa: BLE001 - nothing listens there yet: the caller's questions find it not answering
        pass
    with Forward(lambda: host.tunnel(ip, port)) as fwd:
        yield fwd.url()


def ssh_forward(inv, port: int) -> tuple[str, str]:
    """(the OpenSSH command that brings a deployment's engine to this machine's `port`, the base URL
    then), as printed to the owner when the engine listens only on the cluster's side (`inv`, the
    deployment's inventory): `ssh -L` through the head's SSH target, as the controller itself does."""
    import shlex

    from sparkcluster.config.inventory import _TARGET  # the SSH target's own grammar

    head = inv.head
    argv = ["ssh", "-N"]
    if inv.cluster.ssh_config:
        argv += ["-F", str(inv.resolve(inv.cluster.ssh_config))]
    m = _TARGET.match(head.ssh)
    target = head.ssh
    if m and m.group("port"):
        argv += ["-p", m.group("port")]
        target = (f"{m.group('user')}@" if m.group("user") else "") + m.group("host")
    argv += ["-L", f"{port}:{inv.engine_address()}:{port}", target]
    return shlex.join(argv), f"http://127.0.0.1:{port}/v1"


@dataclass
class EngineView:
    health: int | None = None
    models: list[str] = field(default_factory=list)
    responds: bool | None = None  # None: not probed (no /health 200 or no model)
    probe: str = ""  # why not, when it does not respond
    metrics: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


def parse_metrics(text: str, wanted: dict[str, str] = METRICS) -> dict[str, float]:
    """Prometheus text -> {our name: value}, summed over label sets (the agent's own reader)."""
    return {wanted[k]: v for k, v in readings.prometheus(text, wanted).items()}


def look(
    endpoint: str, api_key: str | None, model: str | None = None, probe_timeout: float = PROBE_TIMEOUT_S
) -> EngineView:
    """/health, then (only when 200) /v1/models, /metrics and a one-token completion to the served
    model (or `model`). Never raises for what the endpoint answers."""
    view = EngineView()
    hdrs = headers({"VLLM_API_KEY": api_key} if api_key else {})
    with httpx.Client(timeout=3.0) as c:
        view.health = health(c, endpoint)
        if view.health != 200:
            return view
        try:
            r = c.get(f"{endpoint}/v1/models", headers=hdrs)
            if r.status_code == 200:
                view.models = [m["id"] for m in r.json().get("data", [])]
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            pass
        try:
            r = c.get(f"{endpoint}/metrics")
            if r.status_code == 200:
                view.metrics = parse_metrics(r.text)
        except httpx.HTTPError:
            pass
        target = model or (view.models[0] if view.models else None)
        if target:
            ok, why = one_token(c, endpoint, target, hdrs, timeout=probe_timeout)
            if "HTTP 401" in why:  # no key or another key: says nothing about the engine
                view.probe = (
                    "not probed: the endpoint wants the API key "
                    f"(VLLM_API_KEY in the environment or {redact.DEFAULT_ENV_FILE})"
                )
            else:
                view.responds, view.probe = ok, "" if ok else why
    return view


# ---- the endpoint's own answers, over HTTP (httpx): shared by up, status and bench


def warm_up(base: str, model: str, secrets: dict[str, str]) -> float:
    """One short completion, so the first user request does not pay for the JIT compilation.
    Best effort, as before: its answer is not judged, only its time is reported."""
    started = time.monotonic()
    with httpx.Client() as client:
        one_token(client, base, model, headers(secrets), timeout=120, max_tokens=8)
    return time.monotonic() - started


def headers(secrets: dict[str, str]) -> dict[str, str]:
    key = secrets.get("VLLM_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def one_token(
    client: httpx.Client, base: str, model: str, hdrs: dict[str, str], timeout: float, max_tokens: int = 1
) -> tuple[bool, str]:
    try:
        r = client.post(
            f"{base}/v1/chat/completions",
            headers=hdrs,
            timeout=timeout,
            json=readings.one_token_body(model, max_tokens),
        )
    except httpx.TimeoutException:
        return False, f"a {max_tokens}-token completion did not return within {timeout:g}s"
    except httpx.HTTPError as e:
        return False, f"completion request failed: {e}"
    if r.status_code != 200:
        return False, f"completion answered HTTP {r.status_code}: {r.text[:200]}"
    return True, "ok"


def health(client: httpx.Client, base: str) -> int | None:
    try:
        return client.get(f"{base}/health", timeout=3).status_code
    except httpx.HTTPError:
        return None


def ask_canary(address: str, port: int, model: str, secrets: dict[str, str], timeout: float = 120) -> list:
    """The canary's prompts, one request at a time from the controller, greedily (node/canary)."""
    base = f"http://{address}:{port}"
    out = []
    with httpx.Client() as client:
        for prompt in canary.PROMPTS:
            try:
                r = client.post(
                    f"{base}/v1/completions",
                    json=canary.request_body(model, prompt),
                    headers=headers(secrets),
                    timeout=timeout,
                )
            except httpx.HTTPError as e:
                raise SparkError(
                    f"the canary's completion failed: {e}", "sparkcluster status; sparkcluster logs"
                ) from None
            if r.status_code != 200:
                raise SparkError(
                    f"the canary's completion answered HTTP {r.status_code}: {redact.mask(r.text[:200])}",
                    "sparkcluster status; sparkcluster logs",
                )
            out.append(canary.answer_from(prompt, r.json()))
    return out


def ask_chat(address: str, port: int, model: str, secrets: dict[str, str], kind: str, timeout: float = 120) -> str:
    """One chat request of `kind` ("tools" or "reasoning", node/canary), from the controller: why its
    answer is not a well-formed 200 (node/canary.chat_problem), or "" when it is."""
    try:
        with httpx.Client() as client:
            r = client.post(
                f"http://{address}:{port}/v1/chat/completions",
                json=canary.chat_body(kind, model),
                headers=headers(secrets),
                timeout=timeout,
            )
    except httpx.HTTPError as e:
        return f"the {kind} chat request failed: {e}"
    return redact.mask(canary.chat_problem(kind, r.status_code, r.text))


def ask_speed(
    address: str,
    port: int,
    model: str,
    secrets: dict[str, str],
    *,
    warmup: int = 2,
    requests: int = 4,
    tokens: int = 64,
) -> float:
    """Decode tokens per second at concurrency 1, from the controller: `warmup` requests first, not
    counted (the first requests after a start compile, fill caches and warm the engine up), then
    `requests` timed one after another. The canary of `upgrade` compares it with the last good serve's
    own figure, measured the same way, so the controller's round trip cancels out."""
    base = f"http://{address}:{port}"
    body = {"model": model, "prompt": canary.PROMPTS[0], "max_tokens": tokens, "temperature": 0, "ignore_eos": True}
    counted, seconds = 0, 0.0
    with httpx.Client() as client:
        for i in range(warmup + requests):
            t = time.monotonic()
            try:
                r = client.post(f"{base}/v1/completions", json=body, headers=headers(secrets), timeout=120)
            except httpx.HTTPError as e:
                raise SparkError(f"the canary's bench failed: {e}", "sparkcluster status; sparkcluster logs") from None
            if r.status_code != 200:
                raise SparkError(
                    f"the canary's bench answered HTTP {r.status_code}: {redact.mask(r.text[:200])}",
                    "sparkcluster status; sparkcluster logs",
                )
            if i >= warmup:
                seconds += time.monotonic() - t
                counted += int((r.json().get("usage") or {}).get("completion_tokens") or 0)
    return counted / seconds if seconds > 0 else 0.0
