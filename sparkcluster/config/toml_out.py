"""TOML written by sparkcluster (a performance record, an imported profile): a key and a value as TOML
spells them. Each writer lays its own tables out; the quoting is this one. Standard library only."""

from __future__ import annotations

import datetime as dt
import math
import re
from typing import Any


def key(k: str) -> str:
    """A bare key where TOML allows one, else a quoted one."""
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else value(str(k))


def value(v: Any) -> str:
    """A value: booleans, integers, finite floats, dates, arrays and inline tables of them, strings."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError("not a finite number")
        return repr(v)
    if isinstance(v, dt.date):
        return v.isoformat()
    if isinstance(v, list):
        return "[" + ", ".join(value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{key(a)} = {value(b)}" for a, b in v.items()) + " }"
    s = str(v)
    out = s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    return f'"{out}"'
