"""`make demo`: the main job on the testbed.

Brings up the two simulated Sparks (or reuses them), runs `sparkcluster up --profile testbed`
exactly as a user would (the real vLLM engine, CPU build, serving the testbed's tiny Llama with
tensor parallel 2 over Ray; its weights fetched once from the testbed's hub and replicated head to
worker), sends one chat completion through the endpoint with the openai client, prints the answer
and `sparkcluster status`. The cluster is left serving; `sparkcluster --inventory .testbed/cluster.toml down`
and `make testbed-down` take it all away.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import openai

from tests.integration.helpers import reached
from tests.testbed import use_profiles
from tests.testbed.testbed import Testbed, preflight

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    reason = preflight()
    if reason:
        print(f"demo: this machine cannot host the testbed: {reason}", file=sys.stderr)
        return 2
    tb = Testbed()
    if not tb._state() or tb.problems():
        print("demo: building the two-Spark testbed (first time: a few minutes)", flush=True)
        tb.up()
    env_file = tb.dir / "demo.env"
    if not env_file.exists():
        env_file.write_text(f"VLLM_API_KEY=sk-demo-{secrets.token_hex(12)}\n")
    env_file.chmod(0o600)
    use_profiles()  # the testbed's profiles do not ship: they are on $SPARKCLUSTER_PROFILES, like an owner's own
    env = {**os.environ, "SPARKCLUSTER_ENV_FILE": str(env_file)}
    cmd = [sys.executable, "-m", "sparkcluster", "--inventory", str(tb.inventory), "up", "--profile", "testbed"]
    print(
        "demo: $ SPARKCLUSTER_PROFILES=tests/testbed/profiles "
        "sparkcluster --inventory .testbed/cluster.toml up --profile testbed",
        flush=True,
    )
    res = subprocess.run(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    print(res.stdout, end="")
    if res.returncode != 0:
        return res.returncode
    endpoint = next(line.split()[1] for line in res.stdout.splitlines() if line.startswith("endpoint:"))
    # it listens on the head's control address, which this machine has no route to: `up` printed the
    # SSH forward an owner keeps open; the demo goes through the tests' door into the head instead
    endpoint = reached(endpoint)
    key = env_file.read_text().split("=", 1)[1].strip()
    client = openai.OpenAI(base_url=endpoint, api_key=key, timeout=60)
    question = "Say hello from two DGX Sparks."
    answer = client.chat.completions.create(
        model="testbed-tiny", max_tokens=16, temperature=0, messages=[{"role": "user", "content": question}]
    )
    print(f"demo: asked {question!r}")
    # the tiny model's weights are random: its words mean nothing, but every token was computed by
    # the real vLLM engine across both ranks (rank 0 on spark-head, rank 1 on spark-worker)
    print(
        f"demo: answer ({answer.usage.completion_tokens} tokens from the real vLLM engine, tensor parallel 2; "
        f"random weights, so gibberish): {answer.choices[0].message.content!r}"
    )
    st = subprocess.run(
        [sys.executable, "-m", "sparkcluster", "--inventory", str(tb.inventory), "status"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    print(st.stdout, end="")
    print("demo: tear down with: sparkcluster --inventory .testbed/cluster.toml down && make testbed-down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
