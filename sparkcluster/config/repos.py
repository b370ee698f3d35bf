"""Every hub repository a profile needs on every node before any container starts.

Every container serves with HF_HUB_OFFLINE=1, so whatever the engine reads from the hub must be in
each node's HF cache first, staged with the model's resolution, verification and replication:

- the model itself (`model`, at `revision`);
- a separate tokenizer repository (`serve.tokenizer`: the al-engr.com Spark stack of May 2026 serves RedHatAI's NVFP4
weights with
  Qwen's own tokenizer, `--tokenizer Qwen/Qwen3.6-35B-A3B`), without its weight files: that repository
  is the full BF16 model, of which the tokenizer needs only the small files;
- a speculative-decoding draft or MTP assistant model named in `serve.speculative_config["model"]`
  (the al-engr.com Spark stack's Gemma 4 drafter `google/gemma-4-26B-A4B-it-assistant`);
- a file the serve command reads from a repository: the corti.com two-Spark Nemotron build log's reasoning-parser
plugin, given as its
  hub URL (`https://huggingface.co/ORG/NAME/raw/REV/PATH`); only that file of the repository is
  staged (all of it when the repository is the model's own), and linked at the path the serve
  command passes (`profile.reasoning_plugin`).

A value that is not an ORG/NAME hub id (a path inside the container) is not staged: it is the
owner's to place.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sparkcluster.movement.hfcache import is_hub_model

if TYPE_CHECKING:  # pragma: no cover
    from sparkcluster.config.profile import Profile

# the public hub's file URLs: /ORG/NAME/raw/REV/PATH (the seed's launcher) or /ORG/NAME/resolve/REV/PATH
_HUB_FILE = re.compile(r"^https://huggingface\.co/([^/]+/[^/]+)/(?:raw|resolve)/([^/]+)/(.+)$")


@dataclass(frozen=True)
class Need:
    """One repository at one revision; `files` None: the whole snapshot, else only these files."""

    roles: tuple[str, ...]  # "model", "tokenizer", "draft model", "reasoning-parser plugin"
    repo: str
    revision: str
    files: tuple[str, ...] | None = None
    weights: bool = True  # False: leave out the weight files (a tokenizer repository)

    @property
    def role(self) -> str:
        return ", ".join(self.roles)

    def describe(self) -> str:
        only = (
            f" (only {', '.join(self.files)})"
            if self.files is not None
            else ""
            if self.weights
            else " (without weight files)"
        )
        return f"{self.role} {self.repo}@{self.revision}{only}"

    def keeps(self, path: str) -> bool:
        """Whether the file of the snapshot is staged."""
        if self.files is not None:
            return path in self.files
        return self.weights or not is_weight_file(path)


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".onnx", ".ckpt")


def is_weight_file(path: str) -> bool:
    return path.lower().endswith(WEIGHT_SUFFIXES)


def plugin_file(url: str | None) -> tuple[str, str, str] | None:
    """(repo, revision, path in the repo) of a reasoning-parser plugin given by its hub URL, else None
    (a URL elsewhere is fetched by the serve stage, as before)."""
    m = _HUB_FILE.match(url or "")
    if not m or not is_hub_model(m[1]):
        return None
    return m[1], m[2], m[3]


def needed(prof: Profile) -> list[Need]:
    """The repositories the profile needs, the model first; one entry per (repo, revision)."""
    wants: list[tuple[str, str, str, str | None]] = []  # role, repo, revision, one file or None
    if is_hub_model(prof.model):
        wants.append(("model", prof.model, prof.revision or "main", None))
    tok = prof.serve.tokenizer
    if tok and is_hub_model(tok):
        wants.append(("tokenizer", tok, "main", None))  # weights left out below, unless another role needs them
    spec = prof.serve.speculative_config or {}
    draft = spec.get("model")
    if isinstance(draft, str) and is_hub_model(draft):
        rev = spec.get("revision")
        wants.append(("draft model", draft, rev if isinstance(rev, str) and rev else "main", None))
    plugin = plugin_file(prof.serve.reasoning_parser_plugin_url)
    if plugin:
        wants.append(("reasoning-parser plugin", plugin[0], plugin[1], plugin[2]))
    out: dict[tuple[str, str], Need] = {}
    for role, repo, rev, file in wants:
        key = (repo, rev)
        files, weights = (None if file is None else (file,)), role != "tokenizer"
        if key in out:
            had = out[key]
            if had.files is None or files is None:
                # the whole snapshot wins over one file; weights when any whole-snapshot role needs them
                whole = [x for x in ((had.files, had.weights), (files, weights)) if x[0] is None]
                out[key] = Need(had.roles + (role,), repo, rev, None, any(wt for _, wt in whole))
            else:
                out[key] = Need(had.roles + (role,), repo, rev, tuple(dict.fromkeys(had.files + files)))
        else:
            out[key] = Need((role,), repo, rev, files, weights)
    return list(out.values())
