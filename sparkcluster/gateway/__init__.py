"""One endpoint for every model on the cluster (issue 36): an OpenAI- and Anthropic-compatible
gateway on the head that routes by the request's `model` over every deployment, passes bodies and
SSE streams through untouched, and takes a deployment out of rotation on the supervisor's verdict,
not on vLLM's `/health` (which stays 200 while a rank is stopped: docs/field-notes.md).

Two halves, kept apart because one of them runs inside a container:
- shipped into the gateway's container (standard library plus Starlette, uvicorn, httpx and
  prometheus-client, all of which vLLM's image already has; relative imports only): `entrypoint`
  and what it imports (`routes`, `auth`, `health`, `figures`, `proxy`, `exposure`, `app`, `tracing`, and
  the node contract), found by `programs.modules` (gateway/rollout.py); OpenTelemetry, for the optional
  request traces, only by name where the config asks for traces (gateway/tracing);
- the controller's: `rollout` (the gateway's config, container and steps from the inventory, the deployments
  and the secrets), `deploy` (those steps carried out through the Docker API) and `litellm` (the export
  for owners who want LiteLLM's proxy instead).
"""
