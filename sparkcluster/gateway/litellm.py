"""`gateway export --litellm`: the same deployments as a LiteLLM proxy config, for owners who want
LiteLLM's keys and budgets (sparkrun's default proxy). The shape is sparkrun's (one `model_list`
entry per served name, `openai/NAME` at the deployment's `api_base`, `drop_params`, a master key;
sparkrun `src/sparkrun/proxy/engine.py`); two deployments serving one name become two entries of
one `model_name`, which LiteLLM balances. Secrets are LiteLLM's `os.environ/NAME` references, never
values. Tested pin (shared/ecosystem.md A): `litellm[proxy]==1.108.7` with `prometheus-client`;
without a database a wrong key gets 400 or 500 rather than 401, and `/v1/messages` is rewritten
into the upstream's `/v1/responses`.
"""

from __future__ import annotations

import json

from .rollout import Upstream

PIN = "litellm[proxy]==1.108.7"


def _q(s: str) -> str:
    return json.dumps(s)  # a JSON string is a YAML scalar, whatever it holds


def render(ups: list[Upstream], cluster: str, upstream_key: bool) -> str:
    lines = [
        f"# LiteLLM proxy config for cluster {cluster}, written by sparkcluster gateway export --litellm.",
        f"# Run: pip install '{PIN}' prometheus-client; litellm --config THIS_FILE --port 4000",
        "# with LITELLM_MASTER_KEY (and VLLM_API_KEY, when the engines want one) in the environment.",
        "model_list:",
    ]
    for u in ups:
        for name in u.names:
            lines += [
                f"  - model_name: {_q(name)}",
                "    litellm_params:",
                f"      model: {_q('openai/' + name)}",
                f"      api_base: {_q(u.url + '/v1')}",
                # a service (issue 60) is sent no engine's key, as by the gateway
                f"      api_key: {_q('os.environ/VLLM_API_KEY' if upstream_key and not u.paths else 'none')}",
                "    model_info:",
                f"      sparkcluster_deployment: {_q(u.key)}",
            ]
    if not ups:
        lines[-1] = "model_list: []"
    lines += [
        "litellm_settings:",
        "  drop_params: true",
        "general_settings:",
        '  master_key: "os.environ/LITELLM_MASTER_KEY"',
        "  require_auth_for_metrics_endpoint: false",
    ]
    return "\n".join(lines) + "\n"
