"""The tokens each answer cost, as the engine reported them, read from the answer on its way through.

Where the count is, in the APIs the gateway forwards:
- a whole answer (JSON): its `usage` (OpenAI's `prompt_tokens`/`completion_tokens`; Anthropic's
  Messages and OpenAI's Responses `input_tokens`/`output_tokens`);
- an OpenAI chat or completions stream: only when the request asked for it with
  `stream_options.include_usage` ("an additional chunk will be streamed before the data: [DONE]
  message ... the choices field will always be an empty array": OpenAI's API reference, Create chat
  completion, `stream_options`; vLLM does the same). The gateway asks for it on every stream
  (`prepare`) and drops that chunk where the client did not ask (`Meter`), so the client sees the
  stream it would have had;
- an Anthropic stream: `message_start`'s `message.usage` and `message_delta`'s `usage` (its output
  count so far: the last one is the answer's); a Responses stream: `response.completed`'s
  `response.usage`.

A stream is read event by event only where an event carries `"usage"`; a part of an event held back
is one the client could not have used yet (an SSE event is dispatched at its blank line). Standard
library only (shipped into the gateway's container).
"""

from __future__ import annotations

import json
import re
import time

STREAMED_USAGE = ("/v1/chat/completions", "/v1/completions")  # where stream_options.include_usage is asked
WHOLE_CAP = 1024 * 1024  # a whole answer past this (embeddings) is read for its usage in its tail only
TAIL = 64 * 1024
_END = re.compile(rb"\r\n\r\n|\n\n")
_COUNT = re.compile(rb'"(prompt_tokens|completion_tokens|input_tokens|output_tokens)"\s*:\s*(\d+)')


def prepare(body: bytes, doc: dict | None, endpoint: str) -> tuple[bytes, bool]:
    """The body to send upstream, and whether the gateway asked for the usage chunk the client did
    not (the Meter then drops it). Only an OpenAI stream without `include_usage` changes."""
    if endpoint not in STREAMED_USAGE or not isinstance(doc, dict) or doc.get("stream") is not True:
        return body, False
    opts = doc.get("stream_options")
    if isinstance(opts, dict) and opts.get("include_usage") is True:
        return body, False
    doc = dict(doc)
    doc["stream_options"] = {**(opts if isinstance(opts, dict) else {}), "include_usage": True}
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode(), True


def _usage_of(doc) -> dict | None:
    if not isinstance(doc, dict):
        return None
    for holder in (doc, doc.get("message"), doc.get("response")):
        if isinstance(holder, dict) and isinstance(holder.get("usage"), dict):
            return holder["usage"]
    return None


class Meter:
    """One answer's tokens and time to its first byte, read as its bytes pass (`feed` returns what
    goes on to the client)."""

    def __init__(self, drop_usage_chunk: bool, started: float | None = None, settle=None):
        self.drop = drop_usage_chunk
        self.settle = settle  # called with how the relay ended (proxy.forward's outcome), once
        self.started = time.monotonic() if started is None else started
        self.prompt: int | None = None
        self.completion: int | None = None
        self.ttft_s: float | None = None
        self.streamed = False
        self.whole: list[bytes] = []
        self.size = 0
        self.tail = b""
        self.held = b""

    def begin(self, content_type: str, length: str | None) -> None:
        # a stream with a length said cannot lose a byte: nothing is dropped from it
        self.streamed = "text/event-stream" in (content_type or "")
        self.drop = self.drop and self.streamed and length is None

    def feed(self, chunk: bytes) -> bytes:
        if self.ttft_s is None and chunk:
            self.ttft_s = time.monotonic() - self.started
        if not self.streamed:
            self.size += len(chunk)
            if self.size <= WHOLE_CAP:
                self.whole.append(chunk)
            else:
                self.whole = []
            self.tail = (self.tail + chunk)[-TAIL:]
            return chunk
        if not self.held and b'"usage"' not in chunk and chunk.endswith((b"\n\n", b"\r\n\r\n")):
            return chunk
        data = self.held + chunk
        cut = max((m.end() for m in _END.finditer(data)), default=0)
        done, self.held = data[:cut], data[cut:]
        if b'"usage"' not in done:
            return done
        out, at = [], 0
        for m in _END.finditer(done):
            event = done[at : m.end()]
            at = m.end()
            if self._event(event):
                out.append(event)
        return b"".join(out)

    def _event(self, event: bytes) -> bool:
        """Count what one event says; False where it is the usage chunk the client did not ask for."""
        if b'"usage"' not in event:
            return True
        data = b"".join(
            line[5:].lstrip(b" ") for line in event.replace(b"\r\n", b"\n").split(b"\n") if line.startswith(b"data:")
        )
        try:
            doc = json.loads(data)
        except ValueError:
            return True
        self._count(_usage_of(doc))
        return not (self.drop and isinstance(doc, dict) and doc.get("choices") == [] and "usage" in doc)

    def _count(self, usage: dict | None) -> None:
        if not usage:
            return
        p = usage.get("prompt_tokens", usage.get("input_tokens"))
        c = usage.get("completion_tokens", usage.get("output_tokens"))
        if isinstance(p, int) and not isinstance(p, bool):
            self.prompt = p
        if isinstance(c, int) and not isinstance(c, bool):
            self.completion = c

    def end(self) -> bytes:
        """What is left to send once the answer is over (a stream's unfinished last event, as it came)."""
        if not self.streamed:
            if self.whole:
                try:
                    self._count(_usage_of(json.loads(b"".join(self.whole))))
                    return b""
                except ValueError:
                    pass
            found = {k.decode(): int(v) for k, v in _COUNT.findall(self.tail)}
            self._count(found)
            return b""
        rest, self.held = self.held, b""
        return rest

    def done(self, outcome: str) -> None:
        settle, self.settle = self.settle, None
        if settle is not None:
            settle(outcome)

    def tokens(self) -> tuple[int, int]:
        return self.prompt or 0, self.completion or 0
