"""TEST DOUBLE of vLLM 0.21 for the sparkcluster testbed -- this is NOT vLLM.

It loads no model and touches no GPU. It reproduces only what sparkcluster can observe of
`vllm serve MODEL --tensor-parallel-size N --distributed-executor-backend ray`:

* the CLI surface (`vllm --version`, real flag names, argparse errors, `--swap-space` rejected);
* the Ray executor's start-up: a placement group of N `{"GPU": 1}` bundles, one rank actor per
  bundle, the driver-to-rank environment copy (VLLM_/NCCL_/UCX_/HF_ minus
  `$VLLM_CONFIG_ROOT/ray_non_carry_over_env_vars.json`, never VLLM_HOST_IP), the per-rank IP
  checks, NCCL interface/HCA selection and the model-specific variable agreement check;
* the OpenAI-compatible HTTP API (/health, /v1/models, /v1/chat/completions, /v1/completions,
  /metrics, API-key auth) opening only after "weight loading", and graceful SIGTERM shutdown.

Test-only knobs live in `$HF_HOME/standin-knobs.json` (see knobs.py); sparkcluster never knows them.
"""

__version__ = "0.21.0"
