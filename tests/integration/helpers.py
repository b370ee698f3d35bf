"""Constants and read-only looks at a testbed host, shared by the integration tests."""

from __future__ import annotations

API_KEY = "sk-testbed-4f9c1e2a7b"
HF_TOKEN = "hf_testbedTOKEN1234567890"


def ours(testbed, host: str) -> list[str]:
    """Names of sparkcluster's containers on a host, read with the host's own docker CLI."""
    out = testbed.sh(host, "docker ps -a --filter label=org.sparkcluster.cluster --format '{{.Names}}'").stdout
    return [x for x in out.split() if x]


def listeners(testbed, host: str, port: int) -> str:
    return testbed.sh(host, f"ss -Htln '( sport = :{port} )'").stdout.strip()
