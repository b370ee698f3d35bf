"""Issue 70 item 6 on the testbed: the image's receiver, run by the worker's own python3 and feeding the
worker's own dockerd, passes to `docker load` only frames made under the key it was handed. An empty tar
(no image in it) sent from the head's address under the head's key reaches docker load, which refuses it
itself; under another key (a host that learnt the port and spoofed the head's address, or a frame
of another stream) nothing reaches it, and no image is loaded. No sparkcluster command runs: the
receiver and the sender are the commands the image stage sends (movement/transfer), the keys written to
their stdin as movement/stream does."""

from __future__ import annotations

import secrets
import time

import pytest

from sparkcluster.movement import transfer
from tests.testbed.testbed import HEAD, SPECS, WORKER

pytestmark = pytest.mark.testbed
WORK = "/tmp/sparkcluster-stream-auth"


def _receive(testbed, key: str) -> int:
    """The image's receiver on the worker, in the background, its key on stdin; its port."""
    w, h = SPECS[WORKER], SPECS[HEAD]
    recv = transfer.receive_command(w.control_ip, h.control_ip)
    testbed.sh(
        WORKER,
        f"rm -rf {WORK} && mkdir -p {WORK}; "
        f"( printf '%s\\n' {key} | {recv} 2> {WORK}/err; echo $? > {WORK}/rc ) > /dev/null 2>&1 < /dev/null &",
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        port = testbed.sh(WORKER, f"sed -n 's/^@@port //p' {WORK}/err", check=False).stdout.strip()
        if port:
            return int(port)
        time.sleep(0.1)
    raise AssertionError(testbed.sh(WORKER, f"cat {WORK}/err", check=False).stdout)


def _ended(testbed) -> tuple[int, str]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        rc = testbed.sh(WORKER, f"cat {WORK}/rc 2>/dev/null", check=False).stdout.strip()
        if rc:
            return int(rc), testbed.sh(WORKER, f"cat {WORK}/err", check=False).stdout
        time.sleep(0.1)
    raise AssertionError("the receiver did not end")


@pytest.mark.parametrize("same_key", [True, False], ids=["the heads key", "another key"])
def test_only_frames_under_the_streams_key_reach_docker_load(testbed, same_key):
    w, h = SPECS[WORKER], SPECS[HEAD]
    key = secrets.token_hex(32)
    images = testbed.docker(WORKER, "images -qa --no-trunc").stdout.split()
    port = _receive(testbed, key)
    send = transfer.piped_to_sender("tar -cf - -T /dev/null", w.control_ip, port, h.control_ip)
    sent = key if same_key else secrets.token_hex(32)
    testbed.sh(HEAD, send, check=False, input=f"{sent}\n", timeout=60)
    rc, err = _ended(testbed)
    try:
        if same_key:  # docker load got the archive, and refused it itself (no image in it)
            assert rc not in (0, transfer.REFUSED, transfer.STREAM_CUT), err
        else:
            assert rc == transfer.REFUSED and "refused" in err and "nothing loaded" in err, err
        assert testbed.docker(WORKER, "images -qa --no-trunc").stdout.split() == images
    finally:
        testbed.sh(WORKER, f"rm -rf {WORK}", check=False)
