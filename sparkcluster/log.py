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

from sparkcluster import redact


def state_dir() -> Path:
    """sparkcluster's own files on the controller (the debug log, what it remembers)."""
    return Path(os.environ.get("XDG_STATE_HOME", "~/.local/state")).expanduser() / "sparkcluster"


_in_use: Path | None = None  # where this process writes its debug log (configure decides)


def debug_log_path() -> Path:
    return _in_use or state_dir() / "debug.log"


def _fallback_path() -> Path:
    import tempfile

    return Path(tempfile.gettempdir()) / f"sparkcluster-{os.getuid()}" / "debug.log"


def _file_handler(path: Path) -> logging.Handler:
    """The debug log, or (when it cannot be written: a `sudo sparkcluster ...` left it root's) one in
    the temporary folder, said once on stderr: a log must never be why a command fails."""
    global _in_use
    reasons = []
    for p in (path, _fallback_path()):
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            handler = logging.handlers.RotatingFileHandler(p, maxBytes=5 * 2**20, backupCount=2)
        except OSError as e:
            reasons.append(f"{p}: {e.strerror or e}")
            continue
        _in_use = p
        if reasons:
            sys.stderr.write(
                f"warning: cannot write the debug log ({reasons[0]}); writing {p} instead\n"
                f"fix: sudo chown -R $(id -un) {path.parent}\n"
            )
        return handler
    _in_use = None
    sys.stderr.write(f"warning: no debug log ({'; '.join(reasons)})\n")
    return logging.NullHandler()


def _redact(_logger, _method, event_dict):
    return redact.mask_obj(event_dict)


STEPS_LOGGER = "sparkcluster.steps"  # `up`'s one event per step: the record of what ran


class _LevelOrSteps(logging.Filter):
    """Passes records at `level` and above, and every step event: in JSON, those are what a
    script reads to know which steps ran, so they do not wait for -v."""

    def __init__(self, level: int):
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= self.level or record.name == STEPS_LOGGER


def configure(level: str = "warning", fmt: str = "text") -> Path:
    global _in_use
    _in_use = None
    path = debug_log_path()

    renderer = structlog.processors.JSONRenderer() if fmt == "json" else structlog.dev.ConsoleRenderer(colors=False)
    pre_chain = [
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _redact,
    ]
    stderr_handler = logging.StreamHandler(sys.stderr)
    wanted = getattr(logging, level.upper())
    if fmt == "json":
        stderr_handler.setLevel(min(wanted, logging.INFO))
        stderr_handler.addFilter(_LevelOrSteps(wanted))
    else:
        stderr_handler.setLevel(wanted)
    stderr_handler.setFormatter(structlog.stdlib.ProcessorFormatter(processor=renderer, foreign_pre_chain=pre_chain))
    # paramiko logs its transport thread's failures (a host that never sends its greeting) as
    # tracebacks: the debug log keeps them, the terminal gets the one line the CLI makes of the error
    stderr_handler.addFilter(lambda record: not record.name.startswith("paramiko"))
    # every command appends at debug level: bounded, so months of use do not fill a laptop's disk
    file_handler = _file_handler(path)
    file_handler.setLevel(logging.DEBUG)
    file_handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(processor=structlog.processors.JSONRenderer(), foreign_pre_chain=pre_chain)
    )

    logging.raiseExceptions = False  # a log write that fails (disk full) is not the command's failure
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
    return _in_use or path


def get(name: str = "sparkcluster"):
    return structlog.get_logger(name)
