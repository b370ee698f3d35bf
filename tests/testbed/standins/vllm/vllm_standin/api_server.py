"""OpenAI-compatible HTTP front end of the test double (stdlib ThreadingHTTPServer).

Start-up order as in vLLM: the port is bound (not listened on) first, the engine starts (Ray
cluster, ranks, checks, "weight loading"), and only then does the socket listen and
`Starting vLLM API server 0 on http://HOST:PORT` / `Application startup complete.` appear.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
import traceback
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from vllm_standin import __version__, checks, knobs
from vllm_standin.logger import init_logger, set_uvicorn_level, uvicorn
from vllm_standin.ray_executor import EngineDeadError, Interrupted, make_executor
from vllm_standin.worker import VOCAB

logger = init_logger(__name__)

DRAIN_SECONDS = 5.0
DEFAULT_MAX_TOKENS = 16
DEFAULT_MAX_MODEL_LEN = 4096
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
E2E_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)


class Aborted(Exception):
    """The request was aborted because the server is shutting down."""


class Histogram:
    def __init__(self, buckets):
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float) -> None:
        self.sum += v
        self.count += 1
        for i, b in enumerate(self.buckets):
            if v <= b:
                self.counts[i] += 1

    def render(self, name: str, labels: str) -> list[str]:
        out = [f'{name}_bucket{{{labels},le="{b}"}} {c}.0' for b, c in zip(self.buckets, self.counts)]
        out.append(f'{name}_bucket{{{labels},le="+Inf"}} {self.count}.0')
        out.append(f"{name}_count{{{labels}}} {self.count}.0")
        out.append(f"{name}_sum{{{labels}}} {self.sum}")
        return out


class Engine:
    """Request bookkeeping, token generation through the ranks, metrics, drain/death state."""

    def __init__(self, args, executor):
        self.args = args
        self.executor = executor
        self.model = args.model
        self.served = list(args.served_model_name or [args.model])
        self.max_model_len = (
            args.max_model_len
            if args.max_model_len and args.max_model_len > 0
            else checks.MODEL_DERIVED_MAX_LEN.get(args.model, DEFAULT_MAX_MODEL_LEN)
        )
        self.lock = threading.Lock()
        self.running = 0
        self.inflight = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.success: dict[str, int] = {"stop": 0, "length": 0, "abort": 0}
        self.ttft = Histogram(TTFT_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self.dead = False
        self.draining = False
        self.drain_deadline = 0.0
        self.on_dead = None  # callback

    # -- request lifecycle --------------------------------------------------------------------
    def enter(self) -> None:
        with self.lock:
            self.inflight += 1

    def leave(self) -> None:
        with self.lock:
            self.inflight -= 1

    def _check_abort(self) -> None:
        if self.draining and time.time() >= self.drain_deadline:
            raise Aborted()

    def generate(self, prompt_tokens: int, max_tokens: int, seed: int, finish_reason: str = "length"):
        """Yields token strings. Raises EngineDeadError / Aborted."""
        if self.dead:
            raise EngineDeadError("EngineCore is dead")
        k = knobs.load()
        if isinstance(k.get("kill_rank"), int) and not isinstance(k.get("kill_rank"), bool):
            self.executor.kill_rank(k["kill_rank"])
        t0 = time.time()
        with self.lock:
            self.running += 1
            self.prompt_tokens += prompt_tokens
        finished = "abort"
        try:
            while k.get("hang_completions"):
                self._check_abort()
                time.sleep(0.2)
                k = knobs.load()
            delay = float(k.get("token_delay_seconds") or 0)
            timeout = float(k.get("step_timeout_seconds") or 60)
            for i in range(max_tokens):
                self._check_abort()
                try:
                    word = self.executor.step_all(i, seed, timeout)
                except EngineDeadError as e:
                    self._die(e)
                    raise
                if delay:
                    time.sleep(delay)
                with self.lock:
                    self.generation_tokens += 1
                    if i == 0:
                        self.ttft.observe(time.time() - t0)
                split = k.get("diverge_from")
                if isinstance(split, int) and not isinstance(split, bool) and i >= split:
                    word = VOCAB[(VOCAB.index(word) + 1) % len(VOCAB)] if word in VOCAB else word + "s"
                yield word[::-1] if k.get("garble_answers") else word
            finished = finish_reason
        finally:
            with self.lock:
                self.running -= 1
                if finished != "abort":
                    self.success[finished] = self.success.get(finished, 0) + 1
                self.e2e.observe(time.time() - t0)

    def _die(self, e: Exception) -> None:
        with self.lock:
            if self.dead:
                return
            self.dead = True
        logger.error("EngineCore encountered a fatal error: %s", e)
        logger.error("Engine core proc EngineCore_DP0 died unexpectedly, shutting down client.")
        if self.on_dead:
            self.on_dead()

    # -- metrics --------------------------------------------------------------------------------
    def metrics(self) -> str:
        name = self.served[0]
        lab = f'engine="0",model_name="{name}"'
        with self.lock:
            lines = [
                "# HELP vllm:num_requests_running Number of requests in model execution batches.",
                "# TYPE vllm:num_requests_running gauge",
                f"vllm:num_requests_running{{{lab}}} {float(self.running)}",
                "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
                "# TYPE vllm:num_requests_waiting gauge",
                f"vllm:num_requests_waiting{{{lab}}} 0.0",
                "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
                "# TYPE vllm:kv_cache_usage_perc gauge",
                f"vllm:kv_cache_usage_perc{{{lab}}} {min(1.0, self.running * 0.01)}",
                "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.",
                "# TYPE vllm:prompt_tokens_total counter",
                f"vllm:prompt_tokens_total{{{lab}}} {float(self.prompt_tokens)}",
                "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
                "# TYPE vllm:generation_tokens_total counter",
                f"vllm:generation_tokens_total{{{lab}}} {float(self.generation_tokens)}",
                "# HELP vllm:request_success_total Count of successfully processed requests.",
                "# TYPE vllm:request_success_total counter",
            ]
            for reason, n in sorted(self.success.items()):
                lines.append(f'vllm:request_success_total{{{lab},finished_reason="{reason}"}} {float(n)}')
            lines += [
                "# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.",
                "# TYPE vllm:time_to_first_token_seconds histogram",
                *self.ttft.render("vllm:time_to_first_token_seconds", lab),
                "# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.",
                "# TYPE vllm:e2e_request_latency_seconds histogram",
                *self.e2e.render("vllm:e2e_request_latency_seconds", lab),
            ]
        return "\n".join(lines) + "\n"


def _words(x) -> int:
    if isinstance(x, str):
        return len(x.split())
    if isinstance(x, list):
        return sum(_words(p.get("text", "")) if isinstance(p, dict) else _words(p) for p in x)
    return 0


class ApiError(Exception):
    def __init__(self, status: int, message: str, etype: str = "BadRequestError", param=None):
        super().__init__(message)
        self.status, self.message, self.etype, self.param = status, message, etype, param

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.etype, "param": self.param, "code": self.status}}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""
    engine: Engine = None  # set on the subclass
    api_key: str | None = None
    access_log = True

    # -- plumbing -------------------------------------------------------------------------------
    def log_message(self, format, *args):  # noqa: A002 - BaseHTTPRequestHandler's signature
        pass

    def log_request(self, code="-", size="-"):
        if not self.access_log:
            return
        try:
            phrase = HTTPStatus(int(code)).phrase
        except (ValueError, TypeError):
            phrase = ""
        host, port = self.client_address[:2]
        uvicorn(f'{host}:{port} - "{self.command} {self.path} {self.request_version}" {code} {phrase}')

    def _send(self, status: int, body: bytes = b"", ctype: str = "application/json", headers=None):
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if self.engine.draining:
            self.send_header("connection", "close")
            self.close_connection = True
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, obj) -> None:
        self._send(status, json.dumps(obj).encode())

    def _body(self) -> dict:
        n = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(n) if n else b""
        try:
            data = json.loads(raw or b"null")
        except ValueError as e:
            raise ApiError(400, f"Invalid JSON body: {e}") from None
        if not isinstance(data, dict):
            raise ApiError(400, "Request body must be a JSON object")
        return data

    def _authorized(self) -> bool:
        if not self.api_key or not self.path.startswith("/v1"):
            return True
        return self.headers.get("authorization", "") == f"Bearer {self.api_key}"

    def _dispatch(self, method: str) -> None:
        eng = self.engine
        path = self.path.split("?", 1)[0]
        if eng.draining:
            self._json(503, {"error": "Server is shutting down"})
            return
        if not self._authorized():
            self._json(401, {"error": "Unauthorized"})
            return
        routes = {
            "/health": {"GET": self.h_health},
            "/ping": {"GET": self.h_health, "POST": self.h_health},
            "/version": {"GET": self.h_version},
            "/metrics": {"GET": self.h_metrics},
            "/v1/models": {"GET": self.h_models},
            "/v1/chat/completions": {"POST": self.h_chat},
            "/v1/completions": {"POST": self.h_completions},
        }
        if path not in routes:
            self._json(404, {"detail": "Not Found"})
            return
        fn = routes[path].get("GET" if method == "HEAD" else method)
        if fn is None:
            self._json(405, {"detail": "Method Not Allowed"})
            return
        eng.enter()
        try:
            fn()
        except ApiError as e:
            self._json(e.status, e.body())
        except EngineDeadError:
            self._json(
                500,
                ApiError(
                    500,
                    "EngineCore encountered an issue. See stack trace (above) for the root cause.",
                    "InternalServerError",
                ).body(),
            )
        except Aborted:
            self.close_connection = True
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception:  # noqa: BLE001 - a bug in the double: answer 500, keep serving
            logger.exception("Error in %s %s", method, path)
            self.close_connection = True
            try:
                self._json(500, ApiError(500, "Internal Server Error", "InternalServerError").body())
            except OSError:
                pass
        finally:
            eng.leave()

    def do_GET(self):
        self._dispatch("GET")

    def do_HEAD(self):
        self._dispatch("HEAD")

    def do_POST(self):
        self._dispatch("POST")

    # -- routes ---------------------------------------------------------------------------------
    def h_health(self):
        self._send(503 if self.engine.dead else 200, b"")

    def h_version(self):
        self._json(200, {"version": __version__})

    def h_metrics(self):
        self._send(200, self.engine.metrics().encode(), "text/plain; version=0.0.4; charset=utf-8")

    def h_models(self):
        eng = self.engine
        created = int(time.time())
        self._json(
            200,
            {
                "object": "list",
                "data": [
                    {
                        "id": n,
                        "object": "model",
                        "created": created,
                        "owned_by": "vllm",
                        "root": eng.model,
                        "parent": None,
                        "max_model_len": eng.max_model_len,
                        "permission": [
                            {
                                "id": f"modelperm-{uuid.uuid4().hex}",
                                "object": "model_permission",
                                "created": created,
                                "allow_create_engine": False,
                                "allow_sampling": True,
                                "allow_logprobs": True,
                                "allow_search_indices": False,
                                "allow_view": True,
                                "allow_fine_tuning": False,
                                "organization": "*",
                                "group": None,
                                "is_blocking": False,
                            }
                        ],
                    }
                    for n in eng.served
                ],
            },
        )

    def _common(self, req: dict, prompt_tokens: int) -> tuple[str, int, bool, int]:
        eng = self.engine
        model = req.get("model") or eng.served[0]
        if model not in eng.served:
            raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
        explicit = "max_tokens" in req or "max_completion_tokens" in req
        mt = req.get("max_completion_tokens", req.get("max_tokens"))
        if mt is None:
            mt = DEFAULT_MAX_TOKENS
        if not isinstance(mt, int) or isinstance(mt, bool) or mt < 1:
            raise ApiError(400, f"max_tokens must be at least 1, got {mt}.", param="max_tokens")
        if prompt_tokens + mt > eng.max_model_len:
            raise ApiError(
                400,
                (
                    f"This model's maximum context length is {eng.max_model_len} tokens. However, you "
                    f"requested {prompt_tokens + mt} tokens ({prompt_tokens} in the messages, {mt} in "
                    "the completion). Please reduce the length of the messages or completion."
                ),
            )
        seed = req.get("seed")
        if not isinstance(seed, int):
            seed = sum(map(ord, json.dumps(req.get("messages", req.get("prompt", "")))))
        return model, mt, explicit, seed

    def h_chat(self):
        req = self._body()
        msgs = req.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise ApiError(400, "messages: Field required (a non-empty list)", param="messages")
        if req.get("tool_choice") == "auto" and not (
            self.engine.args.enable_auto_tool_choice and self.engine.args.tool_call_parser
        ):
            raise ApiError(
                400, '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
            )
        broken = knobs.load().get("tools_error")
        if req.get("tools") and isinstance(broken, str) and broken:
            raise ApiError(500, broken, "InternalServerError")
        ptoks = sum(_words(m.get("content", "")) for m in msgs if isinstance(m, dict)) + 3 * len(msgs)
        model, mt, explicit, seed = self._common(req, ptoks)
        self._run(req, "chat", model, ptoks, mt, explicit, seed)

    def h_completions(self):
        req = self._body()
        prompt = req.get("prompt")
        if prompt is None:
            raise ApiError(400, "prompt: Field required", param="prompt")
        ptoks = max(1, _words(prompt if isinstance(prompt, (str, list)) else str(prompt)))
        model, mt, explicit, seed = self._common(req, ptoks)
        self._run(req, "text", model, ptoks, mt, explicit, seed)

    def _run(self, req, kind, model, ptoks, mt, explicit, seed):
        eng = self.engine
        rid = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        obj = "chat.completion" if kind == "chat" else "text_completion"
        finish = "length" if explicit else "stop"
        gen = eng.generate(ptoks, mt, seed, finish)
        if not req.get("stream"):
            words = []
            for i, w in enumerate(gen):
                words.append(w if i == 0 else " " + w)
            text = "".join(words)
            usage = {
                "prompt_tokens": ptoks,
                "total_tokens": ptoks + len(words),
                "completion_tokens": len(words),
                "prompt_tokens_details": None,
            }
            if kind == "chat":
                choice = {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": text,
                        "refusal": None,
                        "annotations": None,
                        "audio": None,
                        "function_call": None,
                        "tool_calls": [],
                        "reasoning_content": None,
                    },
                    "logprobs": None,
                    "finish_reason": finish,
                    "stop_reason": None,
                }
            else:
                choice = {
                    "index": 0,
                    "text": text,
                    "logprobs": None,
                    "finish_reason": finish,
                    "stop_reason": None,
                    "prompt_logprobs": None,
                }
            self._json(
                200,
                {
                    "id": rid,
                    "object": obj,
                    "created": created,
                    "model": model,
                    "choices": [choice],
                    "service_tier": None,
                    "system_fingerprint": None,
                    "usage": usage,
                    "prompt_logprobs": None,
                    "kv_transfer_params": None,
                },
            )
            return
        # -- streaming (SSE over chunked transfer encoding) --
        include_usage = bool((req.get("stream_options") or {}).get("include_usage"))
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()

        def chunk(payload) -> None:
            data = ("data: " + (payload if isinstance(payload, str) else json.dumps(payload)) + "\n\n").encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        cobj = obj + ".chunk" if kind == "chat" else obj

        def choice(delta_text, fr=None, first=False):
            if kind == "chat":
                delta = {"role": "assistant", "content": ""} if first else {"content": delta_text}
                return {
                    "index": 0,
                    "delta": delta,
                    "logprobs": None,
                    "finish_reason": fr,
                    **({"stop_reason": None} if fr else {}),
                }
            return {"index": 0, "text": delta_text, "logprobs": None, "finish_reason": fr, "stop_reason": None}

        n = 0
        try:
            if kind == "chat":
                chunk(
                    {"id": rid, "object": cobj, "created": created, "model": model, "choices": [choice("", first=True)]}
                )
            for i, w in enumerate(gen):
                n += 1
                chunk(
                    {
                        "id": rid,
                        "object": cobj,
                        "created": created,
                        "model": model,
                        "choices": [choice(w if i == 0 else " " + w)],
                    }
                )
            chunk({"id": rid, "object": cobj, "created": created, "model": model, "choices": [choice("", fr=finish)]})
            if include_usage:
                chunk(
                    {
                        "id": rid,
                        "object": cobj,
                        "created": created,
                        "model": model,
                        "choices": [],
                        "usage": {"prompt_tokens": ptoks, "total_tokens": ptoks + n, "completion_tokens": n},
                    }
                )
        except EngineDeadError:
            err = ApiError(
                500,
                "EngineCore encountered an issue. See stack trace (above) for the root cause.",
                "InternalServerError",
            ).body()
            chunk(err)
        except Aborted:
            # the engine aborted the request on shutdown: end the stream
            pass
        chunk("[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
        self.close_connection = self.close_connection or eng.draining


def _non_default_args(args) -> dict:
    from vllm_standin.arg_utils import build_parser

    sub = build_parser()._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    defaults = vars(sub.parse_args([]))
    out = {}
    for k, v in vars(args).items():
        if k in ("subparser",) or k not in defaults:
            continue
        if k == "model" and v == args.model_tag:
            continue
        if v != defaults[k]:
            out[k] = "<redacted>" if k == "api_key" else v
    return out


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


def _print_failure(exc: BaseException) -> None:
    logger.error("EngineCore failed to start.")
    traceback.print_exception(exc, file=sys.stderr)
    sys.stderr.write(
        "Traceback (most recent call last):\n"
        '  File "/usr/local/bin/vllm", line 8, in <module>\n'
        "    sys.exit(main())\n"
        "RuntimeError: Engine core initialization failed. See root cause above. "
        "Failed core proc(s): {'EngineCore_DP0': 1}\n"
    )
    sys.stderr.flush()


def run_server(args) -> int:
    stop = threading.Event()
    state = {"signal": None, "exit_code": 0}

    def on_signal(signum, _frame):
        state["signal"] = signal.Signals(signum).name
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    host = args.host if args.host is not None else "0.0.0.0"
    set_uvicorn_level(args.uvicorn_log_level)
    logger.info("vLLM API server version %s (test double, not vLLM)", __version__)
    logger.info("non-default args: %s", _non_default_args(args))
    if args.data_parallel_size > 1:
        _print_failure(RuntimeError("data parallel (--data-parallel-size > 1) is not supported by the test double"))
        return 1

    try:
        sock = _bind(host, args.port)
    except OSError as e:
        traceback.print_exception(e, file=sys.stderr)
        return 1
    err = checks.max_model_len_error(args.model, args.max_model_len, dict(os.environ))
    if err:
        traceback.print_exception(ValueError(err), file=sys.stderr)
        sock.close()
        return 1

    executor = None
    try:
        executor = make_executor(args, stop)
        logger.info(
            "Initializing a V1 LLM engine (v%s) with config: model=%r, tensor_parallel_size=%d, "
            "pipeline_parallel_size=%d, distributed_executor_backend=%s, max_model_len=%s, "
            "gpu_memory_utilization=%s, enforce_eager=%s, kv_cache_dtype=%s, quantization=%s",
            __version__,
            args.model,
            args.tensor_parallel_size,
            args.pipeline_parallel_size,
            args.distributed_executor_backend,
            args.max_model_len,
            args.gpu_memory_utilization,
            args.enforce_eager,
            args.kv_cache_dtype,
            args.quantization,
        )
        executor.start()
    except Interrupted:
        logger.info("Received %s during engine start-up; shutting down.", state["signal"])
        executor.shutdown()
        sock.close()
        return 0
    except Exception as e:  # noqa: BLE001 - any start-up failure is the engine's death
        _print_failure(e)
        if executor is not None:
            executor.shutdown()
        sock.close()
        return 1

    engine = Engine(args, executor)
    logger.info("init engine (profile, create kv cache, warmup model) took %.2f seconds", 0.05)

    handler = type(
        "BoundHandler",
        (Handler,),
        {
            "engine": engine,
            "api_key": args.api_key,
            "access_log": not args.disable_uvicorn_access_log,
        },
    )
    server = ThreadingHTTPServer((host, args.port), handler, bind_and_activate=False)
    server.socket.close()
    server.socket = sock
    server.daemon_threads = True
    server.block_on_close = False
    sock.listen(128)

    def on_dead():
        if os.environ.get("VLLM_KEEP_ALIVE_ON_ENGINE_DEATH", "0") in ("1", "true", "True"):
            return
        state["exit_code"] = 1
        threading.Timer(0.5, stop.set).start()

    engine.on_dead = on_dead

    logger.info("Starting vLLM API server 0 on http://%s:%d", host, args.port)
    logger.info("Available routes are:")
    for route, methods in (
        ("/health", "GET"),
        ("/metrics", "GET"),
        ("/version", "GET"),
        ("/v1/models", "GET"),
        ("/v1/chat/completions", "POST"),
        ("/v1/completions", "POST"),
    ):
        logger.info("Route: %s, Methods: %s", route, methods)
    uvicorn(f"Started server process [{os.getpid()}]")
    uvicorn("Waiting for application startup.")
    uvicorn("Application startup complete.")

    serve_thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="http", daemon=True
    )
    serve_thread.start()
    stats = threading.Thread(target=_log_stats, args=(engine, stop), daemon=True)
    if not args.disable_log_stats:
        stats.start()

    while not stop.wait(0.5):
        pass

    # -- graceful shutdown ----------------------------------------------------------------------
    if state["signal"]:
        logger.info("Received %s, shutting down.", state["signal"])
    uvicorn("Shutting down")
    server.shutdown()  # stop accepting
    try:
        sock.close()
    except OSError:
        pass
    engine.drain_deadline = time.time() + DRAIN_SECONDS
    engine.draining = True
    if engine.inflight > 0:
        uvicorn("Waiting for connections to close. (CTRL+C to force quit)")
    while engine.inflight > 0 and time.time() < engine.drain_deadline + 1.0:
        time.sleep(0.05)
    if engine.inflight > 0:
        logger.warning("%d request(s) still in flight after %.0f s; aborting them.", engine.inflight, DRAIN_SECONDS)
    uvicorn("Waiting for application shutdown.")
    uvicorn("Application shutdown complete.")
    uvicorn(f"Finished server process [{os.getpid()}]")
    logger.info("Shutting down FastAPI HTTP server.")
    executor.shutdown()
    logger.info("Engine shut down; exiting with status %d.", state["exit_code"])
    return state["exit_code"]


def _log_stats(engine: Engine, stop: threading.Event) -> None:
    last_p, last_g, last_t = 0, 0, time.time()
    while not stop.wait(10.0):
        now = time.time()
        p, g, running = engine.prompt_tokens, engine.generation_tokens, engine.running
        if p == last_p and g == last_g and running == 0:
            last_t = now
            continue
        dt = max(1e-6, now - last_t)
        logger.info(
            "Engine 000: Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f "
            "tokens/s, Running: %d reqs, Waiting: 0 reqs, GPU KV cache usage: %.1f%%, Prefix "
            "cache hit rate: 0.0%%",
            (p - last_p) / dt,
            (g - last_g) / dt,
            running,
            min(100.0, running * 1.0),
        )
        last_p, last_g, last_t = p, g, now
