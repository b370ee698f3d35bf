"""The test double's own knobs (never known to sparkcluster).

A JSON object in `standin-knobs.json` inside the Hugging Face cache dir (`$HF_HOME`, else
`$XDG_CACHE_HOME/huggingface`, else `~/.cache/huggingface`). Re-read on every use, so a test can
toggle it while the server runs. A missing file means defaults; a broken one logs a warning and
means defaults. `$VLLM_STANDIN_KNOBS` (a JSON object) sets knobs under the file's: an image built
FROM the double with `ENV VLLM_STANDIN_KNOBS=...` is an image that misbehaves whatever the cache
holds (the bad new image of an upgrade test).
"""

from __future__ import annotations

import json
import os
from typing import Any

FILENAME = "standin-knobs.json"

DEFAULTS: dict[str, Any] = {
    # seconds standing in for weight loading (the port opens only after it)
    "load_seconds": 2.0,
    # /health keeps answering 200 but completions never return (stuck engine)
    "hang_completions": False,
    # delay per generated token
    "token_delay_seconds": 0.01,
    # how long to wait for the placement group (i.e. for N GPUs in the cluster); real vLLM: 1800
    "pg_wait_seconds": 60.0,
    # timeout of one generation step across all ranks
    "step_timeout_seconds": 60.0,
    # every generated word reversed: the engine answers, but not what it answered before (a bad image)
    "garble_answers": False,
    # if an int k: from the k-th generated token on, each word is another of the vocabulary: the engine
    # answers as before up to there, then splits (another image's kernels rounding a greedy answer
    # differently: numerics changed, nothing else)
    "diverge_from": None,
    # if a text: every chat request carrying `tools` answers HTTP 500 with it as vLLM's error message
    # (an image whose tool-call path is broken while completions work)
    "tools_error": None,
    # if an int k: rank k's actor exits on the next request (simulates a dead rank / engine death)
    "kill_rank": None,
    # where a rank looks for RDMA devices (lets a testbed fake HCAs; read on the rank's node)
    "ib_sysfs_dir": "/sys/class/infiniband",
    "uverbs_dir": "/dev/infiniband",
    # where a rank looks for network interfaces
    "net_sysfs_dir": "/sys/class/net",
}


def hf_home(environ: dict[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    if env.get("HF_HOME"):
        return env["HF_HOME"]
    xdg = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(xdg, "huggingface")


def knobs_path(environ: dict[str, str] | None = None) -> str:
    return os.path.join(hf_home(environ), FILENAME)


ENV = "VLLM_STANDIN_KNOBS"


def _merge(out: dict[str, Any], data) -> None:
    if isinstance(data, dict):
        for k, v in data.items():
            if k in out:
                out[k] = v


def load(environ: dict[str, str] | None = None) -> dict[str, Any]:
    env = os.environ if environ is None else environ
    out = dict(DEFAULTS)
    try:
        _merge(out, json.loads(env.get(ENV) or "{}"))
    except ValueError:
        pass
    path = knobs_path(environ)
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        return out
    except (OSError, ValueError) as e:
        from vllm_standin.logger import init_logger

        init_logger(__name__).warning("Ignoring unreadable knob file %s: %s", path, e)
        return out
    _merge(out, data)
    return out
