"""The container contract's one-node cases, run by test_colocated on its first `up` of `testbed-single`
on the head (its engine start is theirs too): that `up` serves the base image as pulled, builds
nothing, reads the start-up's banner, and its engine runs on the image's own driver; again after
Docker restarts the container. The stand-in and what it copies of NGC's start: test_container_contract.py.

Cost: one restart of the head's container by Docker (the supervisor in it starts a new engine); the
`up` is test_colocated's."""

from __future__ import annotations

import json

from sparkcluster.node.contract import JOURNAL_PATH, RECORD_PATH
from tests.integration.helpers import HEAD, HEAD_C, wait_for

IMAGE = "nvcr.io/nvidia/vllm:26.05.post1-py3"


def environ(testbed, pid: str) -> dict[str, str]:
    out = testbed.sh(HEAD, f"docker exec {HEAD_C} cat /proc/{pid}/environ", check=False).stdout
    return dict(x.split("=", 1) for x in out.split("\0") if "=" in x)


def server_pid(testbed) -> str | None:
    out = testbed.sh(HEAD, f"docker exec {HEAD_C} cat {RECORD_PATH}", check=False).stdout
    try:
        return str(json.loads(out)["pid"])
    except (ValueError, KeyError):
        return None


def served_through_its_start_up(testbed, up) -> None:
    """A one-node `up` of testbed-single on the head (`up`, its finished process) as it serves."""
    err = up.stderr
    # nothing built, nothing sent: the base image, which the head holds, as it is
    assert "✓ image 0.0s  in place on every node" in err or "in place on every node" in err, err
    assert "built on" not in err and "docker build" not in err
    inspect = testbed.sh(HEAD, f"docker inspect {HEAD_C}").stdout
    c = json.loads(inspect)[0]
    assert c["Config"]["Image"] == IMAGE and c["Config"]["Labels"]["org.sparkcluster.executor"] == "uni"
    # the image's entrypoint kept, the agent its command
    assert c["Path"] in ("/sbin/docker-init", "/opt/nvidia/nvidia_entrypoint.sh"), c["Path"]
    assert c["Config"]["Entrypoint"] == ["/opt/nvidia/nvidia_entrypoint.sh"], c["Config"]["Entrypoint"]
    # the start-up's banner read before serving
    assert "start-up: forward" in err, err
    # the engine inherited the start-up's environment and loaded the image's own libcuda
    pid = server_pid(testbed)
    assert pid, testbed.sh(HEAD, f"docker exec {HEAD_C} ls /run/sparkcluster", check=False).stdout
    env = environ(testbed, pid)
    assert env.get("_CUDA_COMPAT_STATUS") == "CUDA Driver OK", env
    assert env["LD_LIBRARY_PATH"].startswith("/usr/local/cuda/compat/lib.real:"), env["LD_LIBRARY_PATH"]


def restarted_by_docker(testbed) -> None:
    """That deployment's head container restarted by Docker: the engine again through the start-up."""
    before = server_pid(testbed)
    testbed.sh(HEAD, f"docker restart {HEAD_C}", timeout=120)
    # the supervisor in the restarted container starts a new engine (its record names the new process)
    pid = wait_for(lambda: (p := server_pid(testbed)) and p != before and environ(testbed, p) and p, 120, 0.5)
    assert pid, testbed.sh(HEAD, f"docker logs --tail 30 {HEAD_C}", check=False).stdout
    assert environ(testbed, pid).get("_CUDA_COMPAT_STATUS") == "CUDA Driver OK"
    # and the agent said so in the journal, at each start
    journal = testbed.sh(HEAD, f"docker exec {HEAD_C} cat {JOURNAL_PATH}").stdout
    starts = [json.loads(x) for x in journal.splitlines() if '"agent started"' in x]
    assert len(starts) >= 2 and all(e.get("cuda_compat") == "CUDA Driver OK" for e in starts[-2:]), starts
