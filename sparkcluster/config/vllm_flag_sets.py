"""The `vllm serve` flags each vLLM version accepts, as data: lint checks `serve.extra_flags`
against the set of the profile's `image.vllm_version` (a typo such as `--max-modle-len` is caught
before build, image, weights and Ray, with the closest spelling), and says the flags went unchecked
for a version not listed here.

A set is `complete` only when captured whole from that release (its `vllm serve --help=all`, or
every option its public `arg_utils.py`/`cli_args.py` registers): then any other flag is refused.
A partial set refuses only a flag that is a near miss of one it lists (a typo), since a real flag
may simply be missing from it. To add a release: run `vllm serve --help=all` in its image, keep the
`--flag` names, and add them here with where they came from.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FlagSet:
    version: str
    source: str
    complete: bool
    flags: frozenset[str]


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


FLAG_SETS: dict[str, FlagSet] = {
    "0.21.0": FlagSet(
        "0.21.0",
        "the flag names of vLLM 0.21 (NGC 26.05.post1) that the testbed's vLLM double accepts "
        "(tests/testbed/standins/vllm/vllm_standin/arg_utils.py, checked against real vLLM's parser): a subset",
        False,
        _names(
            """
            --allow-credentials --allowed-headers --allowed-local-media-path --allowed-methods --allowed-origins
            --api-key --api-server-count --async-scheduling --block-size --calculate-kv-scales --chat-template
            --chat-template-content-format --code-revision --collect-detailed-traces --compilation-config
            --config-format --cpu-offload-gb --cudagraph-capture-sizes --data-parallel-address
            --data-parallel-backend --data-parallel-rank --data-parallel-rpc-port --data-parallel-size
            --data-parallel-size-local --data-parallel-start-rank --decode-context-parallel-size
            --disable-cascade-attn --disable-chunked-mm-input --disable-custom-all-reduce --disable-fastapi-docs
            --disable-frontend-multiprocessing --disable-log-requests --disable-log-stats
            --disable-sliding-window --disable-uvicorn-access-log --distributed-executor-backend --download-dir
            --dtype --enable-auto-tool-choice --enable-chunked-prefill --enable-eplb --enable-expert-parallel
            --enable-force-include-usage --enable-log-outputs --enable-log-requests --enable-lora
            --enable-prefix-caching --enable-prompt-embeds --enable-prompt-tokens-details
            --enable-request-id-headers --enable-server-load-tracking --enable-sleep-mode
            --enable-tokenizer-info-endpoint --enforce-eager --exclude-tools-when-tool-choice-none
            --generation-config --gpu-memory-utilization --headless --hf-config-path --hf-overrides --hf-token
            --host --ignore-patterns --kv-cache-dtype --kv-cache-memory-bytes --kv-events-config
            --kv-sharing-fast-prefill --kv-transfer-config --limit-mm-per-prompt --load-format
            --logits-processors --long-prefill-token-threshold --lora-modules --mamba-cache-dtype
            --mamba-ssm-cache-dtype --max-cudagraph-capture-size --max-log-len --max-logprobs --max-lora-rank
            --max-loras --max-model-len --max-num-batched-tokens --max-num-partial-prefills --max-num-seqs
            --max-parallel-loading-workers --middleware --mm-processor-kwargs --model --model-impl
            --model-loader-extra-config --moe-backend --no-async-scheduling --no-calculate-kv-scales
            --no-disable-cascade-attn --no-disable-chunked-mm-input --no-disable-custom-all-reduce
            --no-disable-sliding-window --no-enable-chunked-prefill --no-enable-eplb --no-enable-expert-parallel
            --no-enable-log-requests --no-enable-lora --no-enable-prefix-caching --no-enable-prompt-embeds
            --no-enable-sleep-mode --no-enforce-eager --no-kv-sharing-fast-prefill --no-ray-workers-use-nsight
            --no-skip-tokenizer-init --no-trust-remote-code --no-use-tqdm-on-load --num-gpu-blocks-override
            --otlp-traces-endpoint --override-generation-config --pipeline-parallel-size --port
            --prefix-caching-hash-algo --pt-load-map-location --quantization --ray-workers-use-nsight
            --reasoning-parser --reasoning-parser-plugin --response-role --return-tokens-as-token-ids --revision
            --root-path --runner --safetensors-load-strategy --scheduling-policy --seed --served-model-name
            --show-hidden-metrics-for-version --skip-tokenizer-init --speculative-config --ssl-certfile
            --ssl-keyfile --stream-interval --structured-outputs-config --tensor-parallel-size --tokenizer
            --tokenizer-mode --tokenizer-revision --tool-call-parser --tool-parser-plugin --trust-remote-code
            --uds --use-tqdm-on-load --uvicorn-log-level --worker-cls --worker-extension-cls
            """
        ),
    ),
}
