"""structlog set-up: a human or JSON stream on stderr, and a debug log file per user.

Everything that reaches either sink passes through `redact.mask_obj` first.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import sys
from pathlib import Path

import structlog

from . import redact


def state_dir() -> Path:
    """sparkcluster's own files on the controller (the debug log, what it remembers)."""
    return Path(os.environ.get("XDG_STATE_HOME", "~/.local/state")).expanduser() / "sparkcluster"


def debug_log_path() -> Path:
    return state_dir() / "debug.log"


def _redact(_logger, _method, event_dict):
    return redact.mask_obj(event_dict)


def configure(level: str = "warning", fmt: str = "text") -> Path:
    path = debug_log_path()
    path.parent.mkdir(parents=True, exist_ok=True)

    renderer = structlog.processors.JSONRenderer() if fmt == "json" else structlog.dev.ConsoleRenderer(colors=False)
    pre_chain = [
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _redact,
    ]
    stderr_handler = logging.StreamHandler(sys.stderr)
    stderr_handler.setLevel(getattr(logging, level.upper()))
    stderr_handler.setFormatter(structlog.stdlib.ProcessorFormatter(processor=renderer, foreign_pre_chain=pre_chain))
    # every command appends at debug level: bounded, so months of use do not fill a laptop's disk
    file_handler = logging.handlers.RotatingFileHandler(path, maxBytes=5 * 2**20, backupCount=2)
    file_handler.setLevel(logging.DEBUG)
    file_handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        processor=structlog.processors.JSONRenderer(), foreign_pre_chain=pre_chain))

    root = logging.getLogger()
    root.handlers[:] = [stderr_handler, file_handler]
    root.setLevel(logging.DEBUG)
    # paramiko's own chatter is noise at our level of abstraction
    logging.getLogger("paramiko").setLevel(logging.WARNING)
    logging.getLogger("urllib3").setLevel(logging.WARNING)
    logging.getLogger("docker").setLevel(logging.WARNING)

    structlog.configure(
        processors=[
            structlog.stdlib.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _redact,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    return path


def get(name: str = "sparkcluster"):
    return structlog.get_logger(name)
