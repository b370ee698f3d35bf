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


def uvicorn(msg: str) -> None:
    """uvicorn's own format: `INFO:     Application startup complete.`"""
    print(f"INFO:     {msg}", file=sys.stderr, flush=True)
