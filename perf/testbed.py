"""The one door from perf/ to the testbed (tests/testbed and its hub): every other perf module
reaches the testbed through this one, and none imports `tests`.

Why one door: the bench measures sparkcluster as a user runs it; the testbed is test scaffolding
(namespaces, a stand-in hub, host knobs). Kept in one small module, what the bench relies on is
named in one place, and a bench on real Sparks would replace this module, not the figures.
"""

from __future__ import annotations

import fcntl
import shlex
from contextlib import contextmanager
from pathlib import Path

from perf.figures import die, say
from tests.integration.helpers import API_KEY, HF_TOKEN, answers  # door: perf.session's endpoint
from tests.testbed import PROFILES, profiles_env, use_profiles
from tests.testbed.artifacts import BASE_IMAGE, TRAIN_SCRIPT
from tests.testbed.hub import HUB_IP, HUB_PORT, SCALE, SCALE_PORT, SYNTHETIC, knobs, start_hub, stats, stop_hub
from tests.testbed.testbed import HEAD, SPECS, Testbed, ssh_account

__all__ = [
    "API_KEY",
    "HF_TOKEN",
    "HOSTS",
    "HUB",
    "LOCK_PATH",
    "PROFILES",
    "SCALE",
    "SYNTHETIC",
    "TRAINING_SCRIPTS",
    "Testbed",
    "answers",
    "connect",
    "hf_cache",
    "hub_knobs",
    "hub_stats",
    "in_engine_image",
    "lan_ip",
    "lan_veth",
    "locked",
    "profiles_env",
    "scale_hub",
    "trained_model",
    "wiring",
]

# The testbed's profiles (tests/testbed/profiles) do not ship with sparkcluster: every perf module comes
# through this door, so from here on they are on $SPARKCLUSTER_PROFILES, in-process and for every CLI
# the bench starts, as an owner's own folder would be.
use_profiles()

LOCK_PATH = "/tmp/sparkcluster-testbed.lock"  # the testbed's cooperative lock (tests/README.md)
HOSTS: tuple[str, ...] = ("spark-head", "spark-worker")  # the pair `make bench` measures
HUB = f"http://{HUB_IP}:{HUB_PORT}"


@contextmanager
def locked():
    """Hold the testbed's cooperative lock (fcntl.flock) for the whole run, waiting if it is held."""
    with open(LOCK_PATH, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"waiting for the testbed lock ({LOCK_PATH}): another run is using the testbed")
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def connect() -> Testbed:
    """The testbed that is up and healthy, or exit 2 saying why."""
    tb = Testbed()
    st = tb._state()
    if not st or st.get("phase") != "up":
        die("the testbed is not up: run `make testbed-up` first (then `make bench`)")
    problems = tb.problems()
    if problems:
        die(
            "the testbed is up but unhealthy:\n  "
            + "\n  ".join(problems)
            + "\nfix it (or ask whoever is using it) before `make bench`"
        )
    return tb


def wiring(tb: Testbed) -> str:
    """How the testbed's hosts are cabled: "switch" or "ring" (SPARKCLUSTER_TESTBED_CABLING)."""
    return tb._state().get("wiring", "switch")


def lan_ip(host: str) -> str:
    """The host's LAN address (where the controller reaches the host; engines listen on its control address)."""
    return SPECS[host].lan_ip


def lan_veth(host: str) -> str:
    """The controller-side end of the host's LAN veth: every byte between the controller and it."""
    return SPECS[host].ctl_if


def hf_cache() -> str:
    """The SSH user's HF cache on the hosts, from the testbed's facts file."""
    return ssh_account()["hf_cache"]


def hub_stats(endpoint: str = HUB) -> dict:
    return stats(endpoint)


def hub_knobs(endpoint: str = HUB, **values) -> dict:
    return knobs(endpoint, **values)


@contextmanager
def scale_hub(size_mb: int):
    """A hub of its own on the controller's LAN address (port SCALE_PORT) serving the scale repo of
    `size_mb` MB (issue 40: random safetensors shards, made once in the testbed's cache, hashed once
    on the first start). Yields (its endpoint, the folder of the repo's files on the controller);
    stopped at the end."""
    from tests.testbed import artifacts

    state = artifacts.CACHE / "hub-scale"
    say(f"the scale hub: {size_mb} MB of random safetensors shards (made and hashed once, in {state})")
    h = start_hub(
        HUB_IP,
        SCALE_PORT,
        state_dir=state,
        synthetic_mb=0,
        scale_mb=size_mb,
        log_path=state.parent / "hub-scale.log",
        timeout=3600,
    )
    try:
        yield h.endpoint, state / "scale"
    finally:
        stop_hub(h.pid)


def trained_model(tb: Testbed) -> Path:
    """The testbed's trained tiny model's folder (built once per machine, issue 58), and its scripts'."""
    return tb.ensure_trained_model()


TRAINING_SCRIPTS = TRAIN_SCRIPT.parent  # where train_tiny_model.py and its corpus reader live


def in_engine_image(tb: Testbed, mounts: dict[Path, str], argv: str, timeout: int) -> str:
    """`argv` run in the testbed's engine image (the NGC name for the real vLLM CPU build: torch and
    transformers) on the head, no network, each host path in `mounts` read-only at its value; its
    stdout."""
    vols = " ".join(f"-v {shlex.quote(str(k))}:{shlex.quote(v)}:ro" for k, v in mounts.items())
    return tb.sh(HEAD, f"docker run --rm --network none {vols} {BASE_IMAGE} {argv}", timeout=timeout).stdout
