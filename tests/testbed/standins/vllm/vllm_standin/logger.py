"""vLLM-style logging for the test double: `INFO 11-22 03:15:02 [file.py:123] message` on stderr."""

from __future__ import annotations

import logging
import sys

_FORMAT = "%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s"
_DATEFMT = "%m-%d %H:%M:%S"
_configured = False


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time of the record."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value):
        pass


def init_logger(name: str) -> logging.Logger:
    global _configured
    root = logging.getLogger("vllm")
    if not _configured:
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter(_FORMAT, _DATEFMT))
        root.addHandler(handler)
        root.setLevel(logging.DEBUG if _debug() else logging.INFO)
        root.propagate = False
        _configured = True
    return logging.getLogger("vllm." + name.rsplit(".", 1)[-1])


def _debug() -> bool:
    import os

    return os.environ.get("VLLM_LOGGING_LEVEL", "INFO").upper() == "DEBUG"


_UVICORN_LEVELS = {"trace": 5, "debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}
uvicorn_level = 20  # set from --uvicorn-log-level


def set_uvicorn_level(name: str) -> None:
    global uvicorn_level
    uvicorn_level = _UVICORN_LEVELS.get(name, 20)


def uvicorn(msg: str, level: str = "info") -> None:
    """uvicorn's own format: `INFO:     Application startup complete.` (hidden below its level)"""
    if _UVICORN_LEVELS[level] >= uvicorn_level:
        tag = level.upper() + ":"
        print(f"{tag:<9} {msg}", file=sys.stderr, flush=True)
