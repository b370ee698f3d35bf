"""The client's key: `Authorization: Bearer KEY` (OpenAI's clients) or `x-api-key: KEY`
(Anthropic's), compared with every configured key in constant time, so neither which key matched
nor how much of it did shows in the time an answer takes."""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Mapping


def presented(headers: Mapping[str, str]) -> str | None:
    """The key the client sent, from either header; None when it sent none."""
    auth = headers.get("authorization") or ""
    scheme, _, value = auth.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    key = headers.get("x-api-key")
    return key.strip() if key and key.strip() else None


def allowed(given: str | None, keys: Iterable[str]) -> bool:
    """True when `given` equals one of `keys`. Every key is compared, whatever matched before."""
    if given is None:
        return False
    probe = given.encode()
    ok = False
    for k in keys:
        ok |= hmac.compare_digest(probe, k.encode())
    return ok
