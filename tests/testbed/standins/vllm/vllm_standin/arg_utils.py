"""The `vllm` command line, with vLLM 0.21's flag names (test double; see package docstring).

Only flags that exist in the real vLLM are accepted, so an unknown one fails as it would there:
argparse's `vllm: error: unrecognized arguments: ...` and exit status 2. `--swap-space` is
rejected: the NGC 26.05 image this stands in for no longer has it. As in vLLM's
FlexibleArgumentParser, `--max_model_len` is read as `--max-model-len`.
"""

from __future__ import annotations

import argparse
import json
import re

from vllm_standin import __version__

BOOL = argparse.BooleanOptionalAction


def human_readable_int(value: str) -> int:
    """vLLM's parser for --max-model-len and friends: 1k=1000, 1K=1024, 1m, 1M, ... and -1."""
    value = value.strip()
    m = re.fullmatch(r"(-?\d+(?:\.\d+)?)([kKmMgGtT]?)", value)
    if not m:
        if value.lower() == "auto":
            return -1
        raise argparse.ArgumentTypeError(f"Invalid number format: {value!r}")
    number, suffix = m.groups()
    mult = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}.get(
        suffix, 1
    )
    if suffix == "" and "." in number:
        raise argparse.ArgumentTypeError(f"Decimals are not allowed without a suffix: {value!r}")
    return int(float(number) * mult)


def json_arg(value: str):
    try:
        return json.loads(value)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"invalid JSON {value!r}: {e}") from None


def optimization_level_or_json(value: str):
    if value.isdigit():
        return {"level": int(value)}
    return json_arg(value)


def add_serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model_tag", nargs="?", default=None, help="The model tag to serve.")
    p.add_argument("--model", default=None, help="Name or path of the Hugging Face model to use.")

    fe = p.add_argument_group("Frontend")
    fe.add_argument("--host", default=None, help="Host name (default 0.0.0.0).")
    fe.add_argument("--port", type=int, default=8000)
    fe.add_argument("--uds", default=None)
    fe.add_argument(
        "--uvicorn-log-level", default="info", choices=["critical", "debug", "error", "info", "trace", "warning"]
    )
    fe.add_argument("--disable-uvicorn-access-log", action="store_true")
    fe.add_argument("--allow-credentials", action="store_true")
    fe.add_argument("--allowed-origins", type=json_arg, default=["*"])
    fe.add_argument("--allowed-methods", type=json_arg, default=["*"])
    fe.add_argument("--allowed-headers", type=json_arg, default=["*"])
    fe.add_argument("--api-key", default=None, help="If provided, the server will require this key in the header.")
    fe.add_argument("--chat-template", default=None)
    fe.add_argument("--chat-template-content-format", default="auto", choices=["auto", "string", "openai"])
    fe.add_argument("--response-role", default="assistant")
    fe.add_argument("--ssl-keyfile", default=None)
    fe.add_argument("--ssl-certfile", default=None)
    fe.add_argument("--root-path", default=None)
    fe.add_argument("--middleware", action="append", default=[])
    fe.add_argument("--return-tokens-as-token-ids", action="store_true")
    fe.add_argument("--disable-frontend-multiprocessing", action="store_true")
    fe.add_argument("--enable-request-id-headers", action="store_true")
    fe.add_argument("--enable-auto-tool-choice", action="store_true")
    fe.add_argument("--tool-call-parser", default=None)
    fe.add_argument("--tool-parser-plugin", default="")
    fe.add_argument("--exclude-tools-when-tool-choice-none", action="store_true")
    fe.add_argument("--enable-prompt-tokens-details", action="store_true")
    fe.add_argument("--enable-server-load-tracking", action="store_true")
    fe.add_argument("--enable-force-include-usage", action="store_true")
    fe.add_argument("--enable-tokenizer-info-endpoint", action="store_true")
    fe.add_argument("--enable-log-outputs", action="store_true")
    fe.add_argument("--disable-fastapi-docs", action="store_true")
    fe.add_argument("--max-log-len", type=int, default=None)
    fe.add_argument("--enable-log-requests", action=BOOL, default=False)
    fe.add_argument("--disable-log-requests", action="store_true", help="[DEPRECATED] Disable logging requests.")
    fe.add_argument("--disable-log-stats", action="store_true")
    fe.add_argument("--headless", action="store_true")
    fe.add_argument("--api-server-count", "-asc", type=int, default=1)

    mc = p.add_argument_group("ModelConfig")
    mc.add_argument("--runner", default="auto", choices=["auto", "generate", "pooling", "draft"])
    mc.add_argument("--tokenizer", default=None)
    mc.add_argument("--tokenizer-mode", default="auto")
    mc.add_argument("--trust-remote-code", action=BOOL, default=False)
    mc.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float", "float16", "float32", "half"])
    mc.add_argument("--seed", type=int, default=None)
    mc.add_argument("--hf-config-path", default=None)
    mc.add_argument("--allowed-local-media-path", default="")
    mc.add_argument("--revision", default=None)
    mc.add_argument("--code-revision", default=None)
    mc.add_argument("--tokenizer-revision", default=None)
    mc.add_argument("--max-model-len", type=human_readable_int, default=None)
    mc.add_argument("--quantization", "-q", default=None)
    mc.add_argument("--enforce-eager", action=BOOL, default=False)
    mc.add_argument("--max-logprobs", type=int, default=20)
    mc.add_argument("--disable-sliding-window", action=BOOL, default=False)
    mc.add_argument("--disable-cascade-attn", action=BOOL, default=False)
    mc.add_argument("--skip-tokenizer-init", action=BOOL, default=False)
    mc.add_argument("--enable-prompt-embeds", action=BOOL, default=False)
    mc.add_argument("--served-model-name", nargs="+", default=None)
    mc.add_argument("--config-format", default="auto")
    mc.add_argument("--hf-token", nargs="?", const=True, default=None)
    mc.add_argument("--hf-overrides", type=json_arg, default={})
    mc.add_argument("--generation-config", default="auto")
    mc.add_argument("--override-generation-config", type=json_arg, default={})
    mc.add_argument("--enable-sleep-mode", action=BOOL, default=False)
    mc.add_argument("--model-impl", default="auto")
    mc.add_argument("--logits-processors", nargs="+", default=None)

    lc = p.add_argument_group("LoadConfig")
    lc.add_argument("--load-format", default="auto")
    lc.add_argument("--download-dir", default=None)
    lc.add_argument("--safetensors-load-strategy", default="lazy")
    lc.add_argument("--model-loader-extra-config", type=json_arg, default={})
    lc.add_argument("--ignore-patterns", nargs="+", default=None)
    lc.add_argument("--use-tqdm-on-load", action=BOOL, default=True)
    lc.add_argument("--pt-load-map-location", default="cpu")

    pc = p.add_argument_group("ParallelConfig")
    pc.add_argument("--distributed-executor-backend", default=None, choices=["external_launcher", "mp", "ray", "uni"])
    pc.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    pc.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    pc.add_argument("--decode-context-parallel-size", "-dcp", type=int, default=1)
    pc.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    pc.add_argument("--data-parallel-rank", "-dpn", type=int, default=None)
    pc.add_argument("--data-parallel-start-rank", "-dpr", type=int, default=None)
    pc.add_argument("--data-parallel-size-local", "-dpl", type=int, default=None)
    pc.add_argument("--data-parallel-address", "-dpa", default=None)
    pc.add_argument("--data-parallel-rpc-port", "-dpp", type=int, default=None)
    pc.add_argument("--data-parallel-backend", "-dpb", default="mp")
    pc.add_argument("--enable-expert-parallel", action=BOOL, default=False)
    pc.add_argument("--enable-eplb", action=BOOL, default=False)
    pc.add_argument("--max-parallel-loading-workers", type=int, default=None)
    pc.add_argument("--ray-workers-use-nsight", action=BOOL, default=False)
    pc.add_argument("--disable-custom-all-reduce", action=BOOL, default=False)
    pc.add_argument("--worker-cls", default="auto")
    pc.add_argument("--worker-extension-cls", default="")

    cc = p.add_argument_group("CacheConfig")
    cc.add_argument("--block-size", type=int, default=None)
    cc.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    cc.add_argument("--kv-cache-memory-bytes", type=human_readable_int, default=None)
    cc.add_argument(
        "--kv-cache-dtype",
        default="auto",
        choices=["auto", "bfloat16", "fp8", "fp8_ds_mla", "fp8_e4m3", "fp8_e5m2", "fp8_inc"],
    )
    cc.add_argument("--num-gpu-blocks-override", type=int, default=None)
    cc.add_argument("--enable-prefix-caching", action=BOOL, default=None)
    cc.add_argument("--prefix-caching-hash-algo", default="sha256")
    cc.add_argument("--cpu-offload-gb", type=float, default=0)
    cc.add_argument("--calculate-kv-scales", action=BOOL, default=False)
    cc.add_argument("--kv-sharing-fast-prefill", action=BOOL, default=False)
    cc.add_argument("--mamba-cache-dtype", default="auto", choices=["auto", "bfloat16", "float16", "float32"])
    cc.add_argument("--mamba-ssm-cache-dtype", default="auto", choices=["auto", "bfloat16", "float16", "float32"])

    sc = p.add_argument_group("SchedulerConfig")
    sc.add_argument("--max-num-batched-tokens", type=human_readable_int, default=None)
    sc.add_argument("--max-num-seqs", type=int, default=None)
    sc.add_argument("--max-num-partial-prefills", type=int, default=1)
    sc.add_argument("--long-prefill-token-threshold", type=int, default=0)
    sc.add_argument("--scheduling-policy", default="fcfs", choices=["fcfs", "priority"])
    sc.add_argument("--enable-chunked-prefill", action=BOOL, default=None)
    sc.add_argument("--disable-chunked-mm-input", action=BOOL, default=False)
    sc.add_argument("--async-scheduling", action=BOOL, default=False)
    sc.add_argument("--stream-interval", type=int, default=1)

    co = p.add_argument_group("CompilationConfig")
    co.add_argument("--compilation-config", "-O", type=optimization_level_or_json, default={})
    co.add_argument("--cudagraph-capture-sizes", nargs="+", type=int, default=None)
    co.add_argument("--max-cudagraph-capture-size", type=int, default=None)

    ke = p.add_argument_group("Kernel / MoE")
    ke.add_argument("--moe-backend", default="auto")

    so = p.add_argument_group("StructuredOutputs / Reasoning")
    so.add_argument("--reasoning-parser", default="")
    so.add_argument("--reasoning-parser-plugin", default="")
    so.add_argument("--structured-outputs-config", type=json_arg, default={})

    sp = p.add_argument_group("SpeculativeConfig / others")
    sp.add_argument("--speculative-config", type=json_arg, default=None)
    sp.add_argument("--kv-transfer-config", type=json_arg, default=None)
    sp.add_argument("--kv-events-config", type=json_arg, default=None)
    sp.add_argument("--limit-mm-per-prompt", type=json_arg, default={})
    sp.add_argument("--mm-processor-kwargs", type=json_arg, default=None)
    sp.add_argument("--otlp-traces-endpoint", default=None)
    sp.add_argument("--collect-detailed-traces", default=None)
    sp.add_argument("--show-hidden-metrics-for-version", default=None)
    sp.add_argument("--enable-lora", action=BOOL, default=None)
    sp.add_argument("--max-loras", type=int, default=1)
    sp.add_argument("--max-lora-rank", type=int, default=16)
    sp.add_argument("--lora-modules", nargs="+", default=None)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vllm",
        allow_abbrev=False,
        description=f"vLLM CLI (test double standing in for vLLM {__version__})",
    )
    parser.add_argument("-v", "--version", action="version", version=__version__)
    sub = parser.add_subparsers(dest="subparser", metavar="{chat,complete,serve,bench,collect-env,run-batch}")
    serve = sub.add_parser(
        "serve",
        help="Launch a local OpenAI-compatible API server to serve LLM completions via HTTP.",
        description="Launch a local OpenAI-compatible API server to serve LLM completions via HTTP.",
        usage="vllm serve [model_tag] [options]",
        allow_abbrev=False,
    )
    add_serve_args(serve)
    return parser


_FLAG_RE = re.compile(r"^--[A-Za-z0-9_-]+")


def normalize_argv(argv: list[str]) -> list[str]:
    """`--max_model_len=8` -> `--max-model-len=8`, as vLLM's FlexibleArgumentParser does."""
    out = []
    for a in argv:
        m = _FLAG_RE.match(a)
        if m and "_" in m.group(0):
            a = m.group(0).replace("_", "-") + a[m.end() :]
        out.append(a)
    return out


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(normalize_argv(argv))
    if args.subparser is None:
        parser.print_help()
        parser.exit(1)
    if args.subparser == "serve":
        if args.model_tag is not None and args.model is not None and args.model_tag != args.model:
            pass  # vLLM warns and uses the positional model_tag
        args.model = args.model_tag or args.model or "Qwen/Qwen3-0.6B"
        if args.api_key is None:
            import os

            args.api_key = os.environ.get("VLLM_API_KEY") or None
    return args
