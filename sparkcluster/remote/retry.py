"""The only place sparkcluster retries anything: transient errors only, always bounded, logged
before each sleep. Authentication and host-key failures are never `Transient`, so never retried.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, stop_before_delay, wait_exponential

from sparkcluster import log

T = TypeVar("T")
_log = log.get(__name__)


class Transient(Exception):
    """A failure that may pass on its own: a refused or timed-out connection, a busy daemon."""

    def __init__(self, host: str, message: str):
        super().__init__(f"{host}: {message}")
        self.host = host
        self.message = message


def _before_sleep(what: str):
    def hook(state) -> None:
        err = state.outcome.exception()
        _log.info(
            "retrying", what=what, attempt=state.attempt_number, sleep=round(state.next_action.sleep, 2), error=str(err)
        )

    return hook


def transient(
    fn: Callable[[], T], *, attempts: int, what: str, max_wait: float = 4.0, within: float | None = None
) -> T:
    """Call fn, retrying only on `Transient`, at most `attempts` times with exponential back-off,
    and (with `within`) never starting an attempt that would begin later than `within` seconds
    after the first: a bound the caller promised holds for the retries together."""
    stop = stop_after_attempt(attempts)
    if within is not None:
        stop = stop | stop_before_delay(within)
    for attempt in Retrying(
        retry=retry_if_exception_type(Transient),
        stop=stop,
        wait=wait_exponential(multiplier=0.5, max=max_wait),
        before_sleep=_before_sleep(what),
        reraise=True,
    ):
        with attempt:
            return fn()
    raise AssertionError("unreachable")


def poll(check: Callable[[], T | None], *, timeout: float, interval: float, what: str) -> T | None:
    """Call check until it returns something other than None, or the bound passes (then None).

    For waiting on a state (Ray membership, an endpoint answering), not for retrying errors.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value is not None:
            return value
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        _log.debug("waiting", what=what, remaining=round(remaining, 1))
        time.sleep(min(interval, remaining))
