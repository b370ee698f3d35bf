"""Secret values known to this process, and the one function that masks them.

Every secret read from the environment or a `.env` is registered here before it is used, so logs,
`--dry-run` output and error messages can be passed through `mask()` without knowing which
secrets exist.
"""

from __future__ import annotations

import threading
from pathlib import Path

MASK = "******"
# the .env the tool reads when none is named (config/secrets.py: --env-file, else
# $SPARKCLUSTER_ENV_FILE, else this); here, on the lowest floor, so every fix that names a missing
# secret (movement's gated-repository error too) names this one path
DEFAULT_ENV_FILE = Path("~/.config/sparkcluster/.env")


def set_fix(name: str, value: str = "...", path: Path | None = None) -> str:
    """The fix that names a missing secret: the line that appends it to the .env the tool reads
    (`path` where one was named, else DEFAULT_ENV_FILE), created 0600, runnable as printed once the
    value is filled in; the environment is the other place."""
    where = str(path) if path is not None else str(DEFAULT_ENV_FILE)
    folder = where.rsplit("/", 1)[0] if "/" in where else "."
    return (
        f"(umask 077; mkdir -p {folder}; echo '{name}={value}' >> {where}) "
        f"-- {where} must have mode 0600; or set {name} in the environment"
    )


_lock = threading.Lock()
_values: set[str] = set()


def register(value: str | None) -> None:
    # very short values would mask innocent text everywhere; real tokens are long
    if value and len(value) >= 4:
        with _lock:
            _values.add(value)


def mask(text: str) -> str:
    if not text:
        return text
    with _lock:
        values = sorted(_values, key=len, reverse=True)
    for v in values:
        if v in text:
            text = text.replace(v, MASK)
    return text


def mask_obj(obj):
    """Mask secrets in nested str/list/dict values (log event dicts, JSON output)."""
    if isinstance(obj, str):
        return mask(obj)
    if isinstance(obj, dict):
        return {k: mask_obj(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(mask_obj(v) for v in obj)
    return obj
