"""The size of the profile's model as its repository lists it (issue 52): the hub's listing, read on
the head (the node that downloads it), else the listing the head kept when it last verified the
snapshot; and the model's config.json, from the head's HF cache or else from the hub. Nothing is
downloaded but config.json. What `doctor` and `up`'s preflight judge a node's memory with
(node/memory_fit), remembered for `lint` (config/model_memory)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from sparkcluster.config import model_memory
from sparkcluster.errors import SparkError
from sparkcluster.movement import hfcache
from sparkcluster.node.memory_fit import weight_bytes


@dataclass(frozen=True)
class Listing:
    weights: int | None  # bytes of the weight files, the whole model (all ranks)
    source: str  # where the figure came from, or why it is unknown
    config: dict | None = None
    commit: str = ""


def _config(head, inv, prof, m: hfcache.Manifest, endpoint: str, token: str) -> dict | None:
    if "config.json" not in {f.path for f in m.files}:
        return None
    cached = hfcache.snapshot_file(inv.hf_cache(inv.head.name), m.repo, m.commit, "config.json")
    got = head.run(["cat", cached], timeout=30, warn=True)
    if not got.ok:
        got = head.run(
            hfcache.fetch_command(endpoint, m.repo, m.commit, "config.json"),
            timeout=60,
            stdin=token.encode(),
            warn=True,
        )
    try:
        doc = json.loads(got.stdout) if got.ok else None
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def read(head, inv, prof, token: str = "") -> Listing:
    """The model's listed weights and config.json; never raises for the hub (an unknown says why)."""
    if not hfcache.is_hub_model(prof.model):
        return Listing(None, f"the model {prof.model} is a path inside the container, not a listed repository")
    endpoint = inv.cluster.hf_endpoint or hfcache.PUBLIC_HUB
    revision = prof.revision or "main"
    try:
        res = head.run(hfcache.resolve_command(endpoint, prof.model, revision), timeout=60, stdin=token.encode())
        m = hfcache.parse_resolve(res.stdout, prof.model, revision, endpoint)
        source = f"the hub's listing of {prof.model}@{m.commit[:12]}"
    except hfcache.HubUnavailable as e:
        got = head.run(hfcache.cached_command(inv.hf_cache(inv.head.name), prof.model, revision), timeout=60, warn=True)
        m = hfcache.parse_cached(got.stdout, prof.model, revision) if got.ok else None
        if m is None:
            return Listing(None, f"no listing of {prof.model}: {e.message}")
        source = f"the listing of {prof.model}@{m.commit[:12]} the head verified (the hub did not answer)"
    except SparkError as e:  # gated, not found, the command failed: the size is unknown, said so
        return Listing(None, f"no listing of {prof.model}: {e.message}")
    weights = weight_bytes((f.path, f.size) for f in m.files)
    config = _config(head, inv, prof, m, endpoint, token)
    model_memory.remember(prof.model, prof.revision, weights, m.commit, source, config)
    return Listing(weights, source, config, m.commit)
