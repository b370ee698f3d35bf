"""Request traces on the testbed (gateway/tracing), with the real engine behind the gateway on the head:
the inventory's `[gateway] otlp_endpoint` names a receiver on the head (a few lines of Python in the
head's container, listening on loopback, appending each OTLP/HTTP export it gets to a file);
`gateway up` looks in the image for the OpenTelemetry SDK and says what it found, and the running
gateway agrees (`/gateway/status`'s `traces`). Where the image has it, a request's spans reach the
receiver (their names in the protobuf export) and its prompt never does; where it has not, the
gateway serves all the same.

One engine start (testbed-single); every wait is on a condition.
"""

from __future__ import annotations

import shlex

import httpx
import pytest

from tests.integration.helpers import HEAD, HEAD_C, inventory_variant, wait_for
from tests.integration.test_gateway import GW, GW_KEY, HEAD_MODEL, SINGLE

pytestmark = [pytest.mark.testbed, pytest.mark.long]
RECEIVER_PORT = 4318  # OTLP/HTTP's default port
RECEIVED = "/tmp/otlp-received.bin"
PROMPT = "a prompt that must stay out of every span 61c0"
RECEIVER = f"""
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        with open({RECEIVED!r}, "ab") as f:
            f.write(body)
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", {RECEIVER_PORT}), H).serve_forever()
"""


def received(testbed) -> bytes:
    return testbed.sh(HEAD, f"docker exec {HEAD_C} cat {RECEIVED} 2>/dev/null || true", text=False).stdout


def test_traces_reach_the_collector_where_the_image_has_the_sdk(testbed, sc, tmp_path):
    env = {"GATEWAY_API_KEYS": GW_KEY}
    inv = inventory_variant(
        testbed,
        tmp_path,
        lambda t: (
            t + f'\n[gateway]\notlp_endpoint = "http://127.0.0.1:{RECEIVER_PORT}"\notlp_protocol = "http/protobuf"\n'
        ),
    )
    sc("down", env=env)
    try:
        up = sc("up", "--profile", SINGLE, "--node", HEAD, env=env, timeout=900)
        assert up.returncode == 0, up.stdout + up.stderr
        argv = shlex.join(["docker", "exec", "-d", HEAD_C, "python3", "-c", RECEIVER])
        testbed.sh(HEAD, f"docker exec {HEAD_C} rm -f {RECEIVED}; {argv}")
        dry = sc("gateway", "up", "--dry-run", inventory=inv, env=env)
        assert dry.returncode == 0 and "gateway/spark-head/traces" in dry.stdout, dry.stdout + dry.stderr
        res = sc("gateway", "up", inventory=inv, env=env, timeout=300)
        assert res.returncode == 0, res.stdout + res.stderr
        has_sdk = "the image has the OpenTelemetry SDK" in res.stdout
        assert has_sdk or "traces OFF" in res.stdout, res.stdout
        said = httpx.get(f"{GW}/gateway/status", headers={"x-api-key": GW_KEY}, timeout=5).json()["traces"]
        assert said.startswith("on:" if has_sdk else "off:"), said

        body = {"model": HEAD_MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": PROMPT}]}
        for stream in (False, True):
            r = httpx.post(
                f"{GW}/v1/chat/completions",
                json={**body, "stream": stream},
                headers={"Authorization": f"Bearer {GW_KEY}"},
                timeout=120,
            )
            assert r.status_code == 200, r.text
        if not has_sdk:
            return
        # the SDK's batch processor exports within its schedule delay (5 s by default)
        got = wait_for(lambda: received(testbed).count(b"gateway.stream") >= 2 and received(testbed), timeout=30)
        for name in (b"POST /v1/chat/completions", b"gateway.receive", b"gateway.admission", b"gateway.upstream"):
            assert name in got
        assert HEAD_MODEL.encode() in got and PROMPT.encode() not in got
    finally:
        sc("gateway", "down", env=env)
        sc("down", env=env)  # the receiver goes with the head's container
