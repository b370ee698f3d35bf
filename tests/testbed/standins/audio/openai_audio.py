"""TEST DOUBLE of an ASR/TTS service (seed 004's Parakeet ASR on :8765, Chatterbox TTS on :8882) for
the testbed (issue 60 item 2): a thin HTTP wrapper over two real small programs of Debian bookworm,
espeak-ng 1.51 (speaks) and pocketsphinx 0.8 with its en-us model (transcribes), answering the OpenAI
audio routes and a `/health`. Standard library only (the image's python3 3.11).

- `POST /v1/audio/speech`: OpenAI's JSON body (`model`, `input`, `voice`, `response_format`), answered
  with WAV audio (espeak-ng's own format: 22050 Hz mono, 16-bit); `response_format` "wav" (or none).
  https://platform.openai.com/docs/api-reference/audio/createSpeech
- `POST /v1/audio/transcriptions`: OpenAI's multipart form (`file`, `model`, `response_format` "json"
  or "text"), a WAV file of 16-bit samples, answered `{"text": ...}`. pocketsphinx reads 16 kHz mono
  audio (pocketsphinx_continuous 0.8's own table of arguments: `-samprate 16000`; the en-us model's
  `feat.params`: `-upperf 6800`, filters up to 6.8 kHz, which a 16 kHz rate holds), so the file is
  mixed down and resampled to that first.
  https://platform.openai.com/docs/api-reference/audio/createTranscription
- `GET /health`: 200 while it serves. A fault for the testbed's supervisor test: while the file
  UNHEALTHY exists it answers 503; the stand-in removes that file when it starts, so the supervisor's
  restart is what brings it back.

It is a stand-in: espeak-ng's voice and pocketsphinx's hypotheses are far from Chatterbox's and
Parakeet's; what is real is the HTTP shape, the process the supervisor starts and watches, and the
audio that goes through the gateway.
"""

from __future__ import annotations

import argparse
import audioop  # deprecated in 3.11, present until 3.13: the image's python3 is bookworm's 3.11
import io
import json
import os
import subprocess
import tempfile
import wave
from email.parser import BytesParser
from email.policy import default as email_policy
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

UNHEALTHY = "/tmp/audio-standin-unhealthy"
RATE = 16000  # pocketsphinx's en-us model
ROUTES = ("/v1/audio/speech", "/v1/audio/transcriptions")


class Refused(Exception):
    """A request this stand-in cannot answer: 400, with the message."""


def speak(text: str) -> bytes:
    """espeak-ng's WAV of `text` (read from stdin: never on a command line)."""
    p = subprocess.run(["espeak-ng", "--stdin", "--stdout"], input=text.encode(), capture_output=True, timeout=60)
    if p.returncode != 0 or not p.stdout.startswith(b"RIFF"):
        raise RuntimeError(f"espeak-ng exited {p.returncode}: {p.stderr.decode(errors='replace')[-300:]}")
    return p.stdout


def to_16k_mono(wav: bytes) -> bytes:
    """A WAV of 16-bit samples as pocketsphinx's model wants it: 16 kHz, one channel."""
    try:
        with wave.open(io.BytesIO(wav)) as w:
            rate, channels, width = w.getframerate(), w.getnchannels(), w.getsampwidth()
            frames = w.readframes(w.getnframes())
    except (wave.Error, EOFError) as e:
        raise Refused(f"not a WAV file this stand-in reads ({e or type(e).__name__}); send 16-bit PCM WAV") from None
    if width != 2:
        raise Refused(f"{8 * width}-bit samples: send 16-bit PCM WAV")
    if channels == 2:
        frames = audioop.tomono(frames, 2, 0.5, 0.5)
    elif channels != 1:
        raise Refused(f"{channels} channels: send mono or stereo")
    if rate != RATE:
        frames, _ = audioop.ratecv(frames, 2, 1, rate, RATE, None)
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(frames)
    return out.getvalue()


def transcribe(wav: bytes) -> str:
    with tempfile.NamedTemporaryFile(suffix=".wav") as f:
        f.write(to_16k_mono(wav))
        f.flush()
        p = subprocess.run(
            ["pocketsphinx_continuous", "-infile", f.name, "-logfn", "/dev/null"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    if p.returncode != 0:
        raise RuntimeError(f"pocketsphinx_continuous exited {p.returncode}: {p.stderr[-300:]}")
    return " ".join(line.strip() for line in p.stdout.splitlines() if line.strip())


def form_fields(content_type: str, body: bytes) -> dict[str, bytes]:
    """A multipart/form-data body's fields (name -> bytes), by the standard library's MIME parser."""
    if not content_type.startswith("multipart/form-data"):
        raise Refused("send the audio as multipart/form-data with a `file` field")
    msg = BytesParser(policy=email_policy).parsebytes(f"Content-Type: {content_type}\r\n\r\n".encode() + body)
    out = {}
    for part in msg.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if name:
            out[name] = part.get_payload(decode=True) or b""
    return out


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # one line per request on stderr (the supervisor's service log)
        super().log_message(fmt, *args)

    def answer(self, code: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def error(self, code: int, message: str) -> None:
        doc = {"error": {"message": message, "type": "invalid_request_error", "code": code}}
        self.answer(code, json.dumps(doc).encode())

    def do_GET(self) -> None:
        if self.path != "/health":
            self.error(404, f"no route {self.path}")
        elif os.path.exists(UNHEALTHY):
            self.answer(503, b'{"status": "unhealthy (the testbed asked)"}')
        else:
            self.answer(200, b'{"status": "ok"}')

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            if self.path == "/v1/audio/speech":
                self.speech(body)
            elif self.path == "/v1/audio/transcriptions":
                self.transcription(body)
            else:
                self.error(404, f"no route {self.path}; this service answers {', '.join(ROUTES)}")
        except Refused as e:
            self.error(400, str(e))
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            self.error(500, str(e))

    def speech(self, body: bytes) -> None:
        try:
            doc = json.loads(body)
        except ValueError:
            raise Refused("the body is not JSON") from None
        text = doc.get("input") if isinstance(doc, dict) else None
        if not isinstance(text, str) or not text.strip():
            raise Refused("`input` (the text to speak) is missing")
        if doc.get("response_format", "wav") != "wav":
            raise Refused(f"response_format {doc.get('response_format')!r}: this stand-in answers wav only")
        self.answer(200, speak(text), "audio/wav")

    def transcription(self, body: bytes) -> None:
        fields = form_fields(self.headers.get("Content-Type", ""), body)
        if "file" not in fields:
            raise Refused("the form has no `file` field")
        text = transcribe(fields["file"])
        if fields.get("response_format", b"json").decode() == "text":
            self.answer(200, text.encode(), "text/plain; charset=utf-8")
        else:
            self.answer(200, json.dumps({"text": text}).encode())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="0.0.0.0")
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args()
    try:
        os.unlink(UNHEALTHY)  # a start is healthy again: the testbed's fault lasts until a restart
    except FileNotFoundError:
        pass
    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
