"""Issue 55 item 3 on the testbed: the commands of README's guide and the guides that tests/unit/test_docs.py
leaves parsed only (they need a Spark) run here, as an owner types them, against the testbed's two hosts.

The owner's machine is the test's own: HOME in a temporary folder with `~/.ssh/config` holding `Host
spark-a` and `Host spark-b` (aliases of the testbed's head and worker, the testbed's key and account),
`~/.ssh/known_hosts` with their host keys under those names, the testbed's inventory at
`~/.config/sparkcluster/cluster.toml` whose nodes log in as `spark-a` / `spark-b`, and the secrets in
`~/.config/sparkcluster/.env` (0600, written by the gateway guide's own recipe line for the client keys).
No `--inventory`, no `SPARKCLUSTER_ENV_FILE`: the defaults the guides describe.

Every line test_docs does not run is classified in `HOW` (a guide's new line fails
`test_every_guide_line_is_classified_here` until it is): run as written, run with a stated substitution,
or not run here with the reason. Two substitutions recur: the testbed's node names stand for the
guides' (`--node spark-a` is `--node spark-head`: the inventory keeps the testbed's names so the
session's serving cluster, whose worker container is named after its node, is the one found); and a
`bench` line gets one short level (`--concurrency 4 --num-prompts 4 --output-len 16` for whichever of
those it does not name), so each costs seconds on the testbed's CPU engine rather than a six-level sweep.

Cheap by design: the module runs in the serving tail (tests/conftest.py SERVING_TAIL) just after
test_node_health, so it finds the `testbed` profile serving and brings nothing up, and leaves it serving
for test_supervisor_final. The guides' `down` lines, and with nothing serving `doctor`, `doctor --fabric`
(refused while a server runs) and `init`, run after that module's closing `down` (test_guide_bare.py):
on a cluster already down, the `down` lines say so and exit 0 (what `down` takes away is test_up's and
test_supervisor_final's to check).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.helpers import API_KEY, BASE, HF_TOKEN
from tests.testbed import PROFILES as TESTBED_PROFILES
from tests.testbed import profiles_env
from tests.unit import test_docs

pytestmark = pytest.mark.testbed
ROOT = Path(__file__).resolve().parents[2]
ALIASES = {"spark-head": "spark-a", "spark-worker": "spark-b"}  # testbed host -> the guides' alias
NODES = {alias: host for host, alias in ALIASES.items()}  # --node spark-a -> the testbed's node name
SHORT = {"--concurrency": "4", "--num-prompts": "4", "--output-len": "16"}
GATEWAY_KEYS = "sk-guide-a,sk-guide-b"


def _nodes(argv: list[str]) -> list[str]:
    return [NODES.get(a, a) if i and argv[i - 1] == "--node" else a for i, a in enumerate(argv)]


def _short(argv: list[str]) -> list[str]:
    out = list(argv)
    for opt, v in SHORT.items():
        if opt not in out and not (opt == "--concurrency" and "-c" in out):
            out += [opt, v]
    return out


# line as written -> (how, the argv run, or the reason it is not run here)
AS_WRITTEN = "as written"
SUBSTITUTED = "substituted"
NOT_HERE = "not run here"
NODE_NAMES = "the testbed's node names for the guides' (spark-a is spark-head, spark-b spark-worker)"
ONE_LEVEL = "one short level (--concurrency 4 --num-prompts 4 --output-len 16 where the line names none)"
HOW: dict[str, tuple[str, str]] = {
    "sparkcluster doctor": (AS_WRITTEN, ""),
    "sparkcluster doctor --fabric": (AS_WRITTEN, ""),
    "sparkcluster status": (AS_WRITTEN, ""),
    "sparkcluster status --all": (AS_WRITTEN, ""),
    "sparkcluster events --follow": (AS_WRITTEN, "Ctrl-C after 3 s, as the guide says"),
    "sparkcluster logs --node spark-a --follow": (SUBSTITUTED, NODE_NAMES + "; Ctrl-C after 3 s"),
    "sparkcluster init --head spark-a --worker spark-b": (AS_WRITTEN, "SPARKCLUSTER_INVENTORY names a new file"),
    "sparkcluster init --head spark-a": (AS_WRITTEN, "SPARKCLUSTER_INVENTORY names a new file"),
    "sparkcluster weights status": (AS_WRITTEN, ""),
    "sparkcluster bench": (SUBSTITUTED, ONE_LEVEL),
    # each a bench run of its own (seconds of the CPU engine each): test_bench runs them on the same cluster
    "sparkcluster bench --json": (NOT_HERE, "test_bench runs it: its second run, read as JSON"),
    "sparkcluster bench --concurrency 1,4 --num-prompts 8": (
        NOT_HERE,
        "test_bench runs a sweep of concurrency levels with a number of prompts",
    ),
    "sparkcluster bench --keep-baseline": (SUBSTITUTED, ONE_LEVEL),
    "sparkcluster bench --compare baseline": (SUBSTITUTED, ONE_LEVEL),
    "sparkcluster bench --compare published": (SUBSTITUTED, ONE_LEVEL),
    "sparkcluster bench --compare ~/theirs.perf.toml": (
        SUBSTITUTED,
        ONE_LEVEL + "; ~/theirs.perf.toml is the testbed profile's record, copied there",
    ),
    "sparkcluster bench --compare published --output /tmp/compare-testbed": (
        SUBSTITUTED,
        ONE_LEVEL + "; --output in the test's folder",
    ),
    "sparkcluster bench --profile nemotron": (NOT_HERE, "the testbed serves `testbed`, not nemotron"),
    # issue 60's stacks guide (docs/guides/stacks.md): seed 004's shipped profiles, not served here;
    # test_colocated runs the same commands on the testbed's own pair of deployments
    "sparkcluster down --profile qwen36-35b-nvfp4-mtp": (NOT_HERE, "seed 004's profile is not served on the testbed"),
    "sparkcluster events --node spark-a --profile qwen36-35b-nvfp4-mtp": (
        NOT_HERE,
        "seed 004's profile is not served on the testbed",
    ),
    "sparkcluster status --all --json": (NOT_HERE, "test_colocated runs it on two deployments of one node"),
    # the same guide's services (issue 60 item 2): seed 004's images are not on the testbed;
    # test_colocated starts, routes and takes down the testbed's audio stand-in instead (test_gateway restarts
    # a service from its own image)
    "sparkcluster up --profile speaches-stt --node spark-a --beside": (
        NOT_HERE,
        "Speaches' image (ghcr.io) is not reachable from the testbed; test_gateway runs a service from its own image",
    ),
    "sparkcluster up --profile chatterbox-tts --node spark-b --beside --dry-run": (
        NOT_HERE,
        "the profile names Chatterbox-TTS-Server's image, which the testbed cannot pull; its dry run is a unit test's",
    ),
    "sparkcluster events --node spark-a --profile speaches-stt": (NOT_HERE, "the Speaches service is not run here"),
    "sparkcluster up --profile chatterbox-tts --node spark-b --beside": (NOT_HERE, "seed 004's service image"),
    "sparkcluster down --profile chatterbox-tts": (NOT_HERE, "seed 004's service is not run here"),
    "sparkcluster bench --compare 20261123T021425Z": (NOT_HERE, "a run folder of the guide's machine"),
    "sparkcluster bench --tokenizer /models/tok": (NOT_HERE, "a tokenizer path of the guide's machine"),
    # the gateway's named keys and usage (the gateway guide): the guide's key names and models
    "sparkcluster gateway keys add alice --models qwen36-35b --requests-per-minute 60 --tokens-per-day 2000000": (
        NOT_HERE,
        "test_gateway runs keys and usage on its pair's gateway, with keys of its own",
    ),
    "sparkcluster gateway keys add ci --max-concurrent 2 --expires 2026-12-31": (
        NOT_HERE,
        "test_gateway runs keys and usage on its pair's gateway, with keys of its own",
    ),
    "sparkcluster gateway keys add ops --admin": (
        NOT_HERE,
        "test_gateway runs keys and usage on its pair's gateway, with keys of its own",
    ),
    "sparkcluster gateway keys list": (
        NOT_HERE,
        "test_gateway runs keys and usage on its pair's gateway, with keys of its own",
    ),
    "sparkcluster gateway keys revoke ci": (
        NOT_HERE,
        "test_gateway runs keys and usage on its pair's gateway, with keys of its own",
    ),
    "sparkcluster gateway keys rotate alice --grace 1d": (
        NOT_HERE,
        "test_gateway runs keys and usage on its pair's gateway, with keys of its own",
    ),
    "sparkcluster gateway usage --key alice --json": (
        NOT_HERE,
        "test_gateway runs keys and usage on its pair's gateway, with keys of its own",
    ),
    "sparkcluster gateway usage --since 7d --csv > usage.csv": (
        NOT_HERE,
        "test_gateway runs keys and usage on its pair's gateway, with keys of its own",
    ),
    "sparkcluster gateway down --purge-usage": (
        NOT_HERE,
        "test_gateway runs keys and usage on its pair's gateway, with keys of its own",
    ),
    # importing recipes (its guide): placeholder files and URLs; tests/unit/test_importer imports the
    # field's recipes and exports one back, offline
    "sparkcluster profile import ./recipe.yaml": (NOT_HERE, "a placeholder file (tests/unit/test_importer)"),
    "sparkcluster profile import https://raw.githubusercontent.com/OWNER/REPO/COMMIT/recipes/model.yaml --name my-model": (
        NOT_HERE,
        "a placeholder URL: nothing off the testbed is reached",
    ),
    "sparkcluster profile export qwen38-27b-nvfp4-tp2-128gb --format sparkrun -o qwen38-27b-nvfp4-tp2-128gb.yaml": (
        NOT_HERE,
        "writes a file in the guide's folder (tests/unit/test_importer exports and imports it back)",
    ),
    "sparkcluster monitor up": (SUBSTITUTED, "--dry-run: test_monitor starts the real stack"),
    "sparkcluster monitor status": (AS_WRITTEN, ""),
    "sparkcluster gateway up --dry-run": (AS_WRITTEN, ""),
    "sparkcluster gateway up": (AS_WRITTEN, ""),
    "sparkcluster gateway status": (AS_WRITTEN, ""),
    "sparkcluster gateway events": (AS_WRITTEN, ""),
    "sparkcluster gateway export --litellm --output litellm.yaml": (AS_WRITTEN, "in the test's folder"),
    "sparkcluster gateway down": (AS_WRITTEN, ""),
    "sparkcluster status --all --json --on-change 'notify-send \"$SPARKCLUSTER_DEPLOYMENT: $SPARKCLUSTER_STATE\"'": (
        SUBSTITUTED,
        "echo for notify-send (no desktop here)",
    ),
    "sparkcluster rollback --history": (AS_WRITTEN, ""),
    "sparkcluster down --node spark-b": (SUBSTITUTED, NODE_NAMES),
    "sparkcluster down": (AS_WRITTEN, ""),
    "sparkcluster weights pull --profile nemotron": (NOT_HERE, "nemotron's weights are not on the testbed's hub"),
    "sparkcluster weights rm ORG/NAME [--commit SHA]": (NOT_HERE, "a placeholder repository"),
    "sparkcluster down --purge-gcs": (NOT_HERE, "purges what the next session's up reuses"),
    "sparkcluster down --purge-caches": (NOT_HERE, "purges the compile caches the next session's up reuses"),
    "sparkcluster init --head spark-a --worker spark-b --worker spark-c --worker spark-d": (
        NOT_HERE,
        "the testbed's pair has no spark-c, spark-d (the 4-host testbed is tests/testbed's --hosts 4)",
    ),
    "sparkcluster up --profile big-model": (NOT_HERE, "a placeholder profile"),
    "sparkcluster up --profile testbed --node spark-c --node spark-d": (NOT_HERE, "no spark-c, spark-d in the pair"),
    "sparkcluster upgrade --profile P --image nvcr.io/nvidia/vllm:26.06-py3 --dry-run": (
        NOT_HERE,
        "a placeholder profile (test_upgrade runs upgrade on the testbed)",
    ),
    "sparkcluster upgrade --profile P --image nvcr.io/nvidia/vllm:26.06-py3 [--vllm-version 0.22.0]": (
        NOT_HERE,
        "a placeholder profile",
    ),
    "sparkcluster upgrade --profile P --revision <commit|tag>": (NOT_HERE, "a placeholder profile"),
    "sparkcluster rollback --profile P [--dry-run]": (NOT_HERE, "a placeholder profile"),
}
# the order they run in: on what serves first, the bench lines (a baseline kept before it is compared),
# the gateway up to its down, the deployment's down lines, then what the guides run before `up`
ORDER = [
    "sparkcluster status",
    "sparkcluster status --all",
    "sparkcluster status --all --json --on-change 'notify-send \"$SPARKCLUSTER_DEPLOYMENT: $SPARKCLUSTER_STATE\"'",
    "sparkcluster weights status",
    "sparkcluster monitor up",
    "sparkcluster monitor status",
    "sparkcluster rollback --history",
    "sparkcluster events --follow",
    "sparkcluster logs --node spark-a --follow",
    "sparkcluster bench",
    "sparkcluster bench --keep-baseline",
    "sparkcluster bench --compare baseline",
    "sparkcluster bench --compare published",
    "sparkcluster bench --compare ~/theirs.perf.toml",
    "sparkcluster bench --compare published --output /tmp/compare-testbed",
    "sparkcluster gateway up --dry-run",
    "sparkcluster gateway up",
    "sparkcluster gateway status",
    "sparkcluster gateway events",
    "sparkcluster gateway export --litellm --output litellm.yaml",
    "sparkcluster gateway down",
]
# then, after test_supervisor_final's `down` (tests/integration/test_guide_bare.py, SERVING_TAIL): the
# deployment's down lines and what the guides run before `up`, with nothing serving (`doctor --fabric`
# is refused while a server runs); so the supervisor's final states use this module's cluster
BARE = [
    "sparkcluster down --node spark-b",
    "sparkcluster down",
    "sparkcluster doctor",
    "sparkcluster doctor --fabric",
    "sparkcluster init --head spark-a --worker spark-b",
    "sparkcluster init --head spark-a",
]
# a line whose exit status says a state rather than success (its guide says so): the statuses it may
# end with, and the words it must then print. `monitor status` exits 1 while monitoring is not running
# (test_monitor may have left it stopped), naming the command that starts it.
OUTCOMES = {"sparkcluster monitor status": ({0, 1}, "sparkcluster monitor up")}
FOLLOWED = {"sparkcluster events --follow", "sparkcluster logs --node spark-a --follow"}


def _key(written: str) -> str:
    """A guide's line without its trailing comment (test_docs keeps a comment after one space)."""
    return written.split(" # ")[0].strip()


def _argv(line: str, home: Path, folder: Path) -> list[str]:
    """The argv a line runs as, by HOW's rule (test_docs' notation: `[...]` optional, `<...>` a value)."""
    (argv,) = [a for _, written, a in test_docs.COMMANDS if _key(written) == line][:1]
    argv = _nodes(argv)
    if argv[0] == "bench":
        argv = _short(argv)
        argv = [str(home / "theirs.perf.toml") if a == "~/theirs.perf.toml" else a for a in argv]
        argv = [str(folder / "compare-testbed") if a == "/tmp/compare-testbed" else a for a in argv]
    if argv[:2] == ["monitor", "up"]:
        argv += ["--dry-run"]
    if "--on-change" in argv:
        i = argv.index("--on-change") + 1
        argv[i] = argv[i].replace("notify-send", "echo")
    return argv


@pytest.fixture(scope="module")
def owner(testbed, tmp_path_factory):
    """The owner's laptop of the module docstring, and the environment every line runs in."""
    home = tmp_path_factory.mktemp("owner-home")
    ssh = home / ".ssh"
    ssh.mkdir(mode=0o700)
    # the testbed's client files, under the guides' names
    config = testbed.ssh_config.read_text()
    known = testbed.known_hosts.read_text()
    for host, alias in ALIASES.items():
        config = config.replace(f"Host {host}\n", f"Host {alias}\n")
        known = known.replace(f"{host},", f"{alias},")
    config = config.replace(f"UserKnownHostsFile {testbed.known_hosts}", f"UserKnownHostsFile {ssh / 'known_hosts'}")
    (ssh / "config").write_text(config)
    (ssh / "known_hosts").write_text(known)
    cfg = home / ".config" / "sparkcluster"
    cfg.mkdir(parents=True)
    inv = testbed.inventory_text()
    inv = "\n".join(ln for ln in inv.splitlines() if not ln.startswith(("ssh_config =", "known_hosts =")))
    for host, alias in ALIASES.items():
        inv = inv.replace(f'ssh = "{host}"', f'ssh = "{alias}"')
    (cfg / "cluster.toml").write_text(inv + "\n")
    env_file = cfg / ".env"
    env_file.write_text(f"HF_TOKEN={HF_TOKEN}\nVLLM_API_KEY={API_KEY}\n")
    env_file.chmod(0o600)
    (home / "theirs.perf.toml").write_text((TESTBED_PROFILES / "testbed.perf.toml").read_text())
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_API_KEY", "HF_TOKEN", "SPARKCLUSTER_INVENTORY")}
    env.pop("SPARKCLUSTER_ENV_FILE", None)
    env.update(
        {
            "HOME": str(home),
            "XDG_STATE_HOME": str(home / ".local" / "state"),
            "XDG_CACHE_HOME": str(home / ".cache"),
            "SPARKCLUSTER_PROFILES": profiles_env(),
            "COLUMNS": "200",
        }
    )
    # the gateway guide's own recipe line for the client keys, run as written (the keys stood in)
    recipe = next(
        ln for ln in test_docs._shell_lines(ROOT / "docs" / "guides" / "gateway.md") if "GATEWAY_API_KEYS=" in ln
    )
    recipe = recipe.split("  #")[0].replace("sk-team-a,sk-team-b", GATEWAY_KEYS)
    subprocess.run(["bash", "-c", recipe], env=env, check=True, timeout=10)
    assert env_file.stat().st_mode & 0o777 == 0o600 and f"GATEWAY_API_KEYS={GATEWAY_KEYS}" in env_file.read_text()
    return home, env


@pytest.fixture(scope="module")
def serving(testbed, owner):
    """The session's `testbed` deployment (the serving tail's), brought up through the aliases only
    where no earlier module left it serving."""
    _, env = owner
    r = _sc(["up", "--profile", "testbed"], env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr


def _sc(argv: list[str], env: dict, timeout: float = 300, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sparkcluster", *argv], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def test_every_guide_line_is_classified_here():
    """Each line test_docs leaves parsed only is run here, substituted, or named with why not."""
    left = {_key(line) for _, line, argv in test_docs.COMMANDS if test_docs._plan(argv) is None}
    assert left <= set(HOW), sorted(left - set(HOW))
    assert set(HOW) <= left | set(ORDER) | set(BARE), sorted(set(HOW) - left)
    assert {ln for ln, (how, _) in HOW.items() if how != NOT_HERE} == set(ORDER) | set(BARE)


def test_the_aliases_reach_the_testbeds_hosts(owner):
    """OpenSSH itself, through the owner's config (-F: OpenSSH reads the passwd entry's home, not $HOME)."""
    home, env = owner
    for alias in ALIASES.values():
        r = subprocess.run(
            ["ssh", "-F", str(home / ".ssh" / "config"), "-o", "BatchMode=yes", alias, "true"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert r.returncode == 0, r.stderr


@pytest.mark.usefixtures("serving")
def test_readmes_request_with_curl_answers(owner):
    """README's curl, run by bash as written but for the address (the tests' door to the head's engine,
    for the local end of the SSH forward README shows) and the model (the testbed profile's served name, for nemotron's)."""
    _, env = owner
    block = (ROOT / "README.md").read_text().split("```sh\ncurl ", 1)[1].split("```", 1)[0]
    command = "curl " + block.replace("http://127.0.0.1:8000", BASE).replace("nvidia/nemotron-3-super", "testbed-tiny")
    r = subprocess.run(
        ["bash", "-c", command], env={**env, "VLLM_API_KEY": API_KEY}, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["choices"][0]["message"]


@pytest.mark.usefixtures("serving")
@pytest.mark.parametrize("line", ORDER)
def test_the_guides_line_runs_on_the_testbed(owner, tmp_path, line):
    run_line(owner, tmp_path, line)


def run_line(owner, tmp_path: Path, line: str) -> None:
    """One guide line as HOW says, in the owner's environment (test_guide_bare.py runs BARE's)."""
    home, env = owner
    how, why = HOW[line]
    argv = _argv(line, home, tmp_path)
    if line.startswith("sparkcluster init"):
        env = {**env, "SPARKCLUSTER_INVENTORY": str(tmp_path / "draft.toml")}
    said = f"{line} ({how}{': ' + why if why else ''}; ran: sparkcluster {shlex.join(argv)})"
    if line in FOLLOWED:
        p = subprocess.Popen(
            [sys.executable, "-m", "sparkcluster", *argv],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        time.sleep(3)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
        assert p.returncode in (0, 130), f"{said} exited {p.returncode}\n{out}\n{err}"
        return
    r = _sc(argv, env, cwd=tmp_path)
    allowed, words = OUTCOMES.get(line, ({0}, ""))
    assert r.returncode in allowed, f"{said} exited {r.returncode}\n{r.stdout}\n{r.stderr}"
    if r.returncode:
        assert words in r.stdout + r.stderr, f"{said}\n{r.stdout}\n{r.stderr}"
    if line.startswith("sparkcluster init"):
        assert (tmp_path / "draft.toml").is_file()
    if line.startswith("sparkcluster gateway export"):
        assert (tmp_path / "litellm.yaml").is_file()
