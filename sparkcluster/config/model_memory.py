"""What the controller remembers of a model's size, for `lint`, which runs offline.

`doctor` and `up` read the hub's listing of the profile's model on the head (facts/model_listing):
its weight files' listed sizes and its config.json. They remember the figures here, per
repository and revision, so `lint` judges a profile against a node's memory without the hub. One
small JSON file in the controller's state folder; writing is best effort and atomic.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from sparkcluster import log

FILENAME = "model-sizes.json"
KEEP = 50
# the config.json fields the KV-cache arithmetic reads (node/memory_fit.kv_min)
CONFIG_KEYS = (
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_size",
    "torch_dtype",
    "dtype",
    "kv_lora_rank",
    "layer_types",
    "layers_block_type",
    "hybrid_override_pattern",
    "sliding_window",
    "use_sliding_window",
)


def path() -> Path:
    return log.state_dir() / FILENAME


def key(repo: str, revision: str | None) -> str:
    return f"{repo}@{revision or 'main'}"


def slim(config: dict | None) -> dict | None:
    """The fields of config.json the arithmetic reads (a text_config's too), nothing else."""
    if not isinstance(config, dict):
        return None
    out = {k: config[k] for k in CONFIG_KEYS if k in config}
    out |= {k: config[k] for k in config if k.startswith(("mamba", "ssm_"))}
    for sub in ("text_config", "llm_config"):
        if isinstance(config.get(sub), dict):
            out[sub] = slim(config[sub])
    return out


def load() -> dict[str, dict]:
    try:
        doc = json.loads(path().read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in doc.items() if isinstance(v, dict)} if isinstance(doc, dict) else {}


def get(repo: str, revision: str | None) -> dict | None:
    """{"weights": bytes, "commit": ..., "source": ..., "config": {...} or None}, or None."""
    got = load().get(key(repo, revision))
    return got if got and isinstance(got.get("weights"), int) else None


def remember(repo: str, revision: str | None, weights: int, commit: str, source: str, config: dict | None) -> None:
    entry = {"weights": int(weights), "commit": commit, "source": source, "config": slim(config)}
    old = load()
    k = key(repo, revision)
    if old.get(k) == entry:
        return
    merged = dict(list(({kk: v for kk, v in old.items() if kk != k} | {k: entry}).items())[-KEEP:])
    p = path()
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=p.parent, prefix=".model-sizes.", delete=False) as f:
            json.dump(merged, f, indent=1)
        os.replace(f.name, p)
    except OSError as e:
        log.get(__name__).debug("could not remember a model's size", error=str(e))
