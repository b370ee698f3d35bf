"""Secret values known to this process, and the one function that masks them.

Every secret read from the environment or a `.env` is registered here before it is used, so logs,
`--dry-run` output and error messages can be passed through `mask()` without knowing which
secrets exist.
"""

from __future__ import annotations

import threading

MASK = "******"
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
