"""Issue 16: the image stage moves only the layers the worker lacks.

On the stand-in profile (testbed-standin): the cluster image REF is built on the head from BASE
(a small base on the head only), so the worker's holdings decide what moves:

- base present on the worker: only the layers the Ray build adds move (the plan says how many),
  read from the head's layer store, not by docker save (issue 40);
- base absent: every layer moves;
- base different (same tag, another ID on the worker): doctor warns (image.base-same), and the
  layers above the first difference move;
- the layer stream cut mid-way, and the docker save it falls back to cut too: the stage fails
  naming the transfer, no image is left on the worker, and the next `up` succeeds.

Every case ends with the cluster down, REF on both nodes with the head's ID, and the worker's
other images as they were.
"""

from __future__ import annotations

import json
import re
import threading
import time

import pytest

from tests.integration.test_traps import BASE, HEAD, REF, WORKER, images, stage_failed

# `make test` keeps the commonest case, the base present (issue 57), without the module's setting aside of
# the worker's other images (a save and a load of the engine image: a minute), which only the absent and
# different bases need; the others are `make test-long`'s (tests/README.md)
pytestmark = pytest.mark.testbed
PROFILE = "testbed-standin"


def layers_of(testbed, host: str, ref: str) -> list[str]:
    out = testbed.docker(host, f"image inspect --format '{{{{json .RootFS.Layers}}}}' {ref}").stdout
    return json.loads(out) or []


def receive_step(sc) -> str:
    res = sc("up", "--profile", PROFILE, "--dry-run", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    steps = {s["id"]: s["description"] for s in json.loads(res.stdout)}
    return steps.get(f"image/{WORKER}/receive", "")


def sent_mb(stderr: str) -> float:
    m = re.search(r"✓ image .*sent to spark-worker: (\d+\.\d) MB in", stderr)
    assert m, stderr
    return float(m.group(1))


@pytest.fixture(scope="module")
def aside(testbed, sc, tmp_path_factory):
    """For the module: every tag on the worker holding one of REF's layers is set aside (docker
    save to the controller, then removed), so "absent" means absent. On the testbed that includes
    the engine image (its bottom layer is the rootfs the stand-in is built on too): one save and
    one load of it per module. Put back at the end."""
    if testbed.image_id(HEAD, REF) is None:
        res = sc("up", "--profile", PROFILE)
        assert res.returncode == 0, res.stdout + res.stderr
    sc("down")
    path = tmp_path_factory.mktemp("aside") / "worker-images.tar"
    mine = set(layers_of(testbed, HEAD, REF))
    tags = [
        t
        for t in testbed.docker(WORKER, "images --format '{{.Repository}}:{{.Tag}}'").stdout.split()
        if "<none>" not in t and t != REF and set(layers_of(testbed, WORKER, t)) & mine
    ]
    testbed.set_images_aside(WORKER, tags, path)
    try:
        yield tags
    finally:
        testbed.restore_images(WORKER, path)


@pytest.fixture
def worker_bare(testbed, sc, aside):
    """Cluster down; REF and BASE gone from the worker, which then holds none of REF's layers; at
    the end BASE is gone again and REF is on the worker with the head's ID."""
    sc("down")
    good = testbed.image_id(HEAD, REF)
    testbed.docker(WORKER, f"rmi -f {REF} {BASE}", check=False)
    assert all(not set(ch) & set(layers_of(testbed, HEAD, REF)) for ch in chains(testbed, WORKER)), (
        "the worker still holds a layer of REF"
    )
    before = images(testbed, WORKER)
    try:
        yield good, before
    finally:
        sc("down")
        testbed.docker(WORKER, f"rmi -f {BASE}", check=False)
        if testbed.image_id(WORKER, REF) != good:
            testbed.docker(WORKER, f"rmi -f {REF}", check=False)
            testbed.copy_image(REF, HEAD, WORKER)


@pytest.fixture
def worker_without_ref(testbed, sc):
    """Cluster down; REF and BASE gone from the worker, its other images kept (the base-present case:
    with BASE copied back, the layers an image such as the engine's shares with REF are BASE's own, so
    nothing need be set aside for what moves to be REF's upper layers alone); at the end as worker_bare."""
    if testbed.image_id(HEAD, REF) is None:
        res = sc("up", "--profile", PROFILE)
        assert res.returncode == 0, res.stdout + res.stderr
    sc("down")
    good = testbed.image_id(HEAD, REF)
    testbed.docker(WORKER, f"rmi -f {REF} {BASE}", check=False)
    try:
        yield good, images(testbed, WORKER)
    finally:
        sc("down")
        testbed.docker(WORKER, f"rmi -f {BASE}", check=False)
        if testbed.image_id(WORKER, REF) != good:
            testbed.docker(WORKER, f"rmi -f {REF}", check=False)
            testbed.copy_image(REF, HEAD, WORKER)


def chains(testbed, host: str) -> list[list[str]]:
    out = testbed.sh(
        host,
        'ids=$(docker image ls -q --no-trunc | sort -u); [ -z "$ids" ] || '
        "docker image inspect --format '{{json .RootFS.Layers}}' $ids",
    ).stdout
    return [json.loads(x) or [] for x in out.split()]


def test_base_present_moves_only_the_ray_layers(testbed, sc, worker_without_ref):
    good, _ = worker_without_ref
    testbed.copy_image(BASE, HEAD, WORKER)
    n_base, n_all = len(layers_of(testbed, HEAD, BASE)), len(layers_of(testbed, HEAD, REF))
    step = receive_step(sc)
    assert f"{n_all - n_base} of {n_all} layers" in step and f"holds the bottom {n_base}" in step, step
    res = sc("up", "--profile", PROFILE)
    assert res.returncode == 0, res.stdout + res.stderr
    assert testbed.image_id(WORKER, REF) == good
    # what moved is about the Ray layers, far less than the image
    ray_bytes = sum(
        int(x) for x in testbed.docker(HEAD, f"history -H=false --format '{{{{.Size}}}}' {REF}").stdout.split()
    ) - int(testbed.docker(HEAD, f"image inspect --format '{{{{.Size}}}}' {BASE}").stdout)
    assert sent_mb(res.stderr) * 1e6 <= ray_bytes * 1.2 + 1e6, res.stderr
    assert f"{n_all - n_base} of {n_all} layers" in res.stderr


@pytest.mark.long  # `make test-long`: `make test` keeps this module's other cases (tests/README.md, issue 57)
def test_base_present_the_head_reads_only_the_layers_that_move(testbed, sc, worker_bare):
    """Issue 40 items 5 and 7: with the base on the worker, the plan says the layers the worker
    lacks are read from the head's layer store, and the stage does so (a throwaway container of
    the image with the docker root read-only): the note says the bytes came from the layer store,
    when the first byte left, and names no layer tar the head had to hash; the worker ends with
    the head's image ID (docker load checked every layer it got against the config)."""
    good, _ = worker_bare
    testbed.copy_image(BASE, HEAD, WORKER)
    assert "read from the head's layer store" in receive_step(sc)
    res = sc("up", "--profile", PROFILE)
    assert res.returncode == 0, res.stdout + res.stderr
    assert testbed.image_id(WORKER, REF) == good
    line = next(x for x in res.stderr.splitlines() if "✓ image" in x)
    assert "hashed on the head" not in line and "by docker save" not in line, line
    assert re.search(r"; read from the head's layer store: the first byte left after \d+\.\ds, the rest took", line), (
        line
    )
    n_base, n_all = len(layers_of(testbed, HEAD, BASE)), len(layers_of(testbed, HEAD, REF))
    assert f"{n_all - n_base} of {n_all} layers" in line, line
    # the reader's container is gone (--rm), and it left no log (--log-driver none)
    assert not testbed.docker(HEAD, "ps -aq --filter volume=/sparkcluster-docker-root").stdout.strip()


@pytest.mark.long  # `make test-long`: `make test` keeps this module's other cases (tests/README.md, issue 57)
def test_base_absent_moves_every_layer(testbed, sc, worker_bare):
    good, _ = worker_bare
    n_all = len(layers_of(testbed, HEAD, REF))
    step = receive_step(sc)
    assert f"{n_all} of {n_all} layers" in step and "holds none" in step, step
    res = sc("up", "--profile", PROFILE)
    assert res.returncode == 0, res.stdout + res.stderr
    assert testbed.image_id(WORKER, REF) == good
    size = int(testbed.docker(HEAD, f"image inspect --format '{{{{.Size}}}}' {REF}").stdout)
    assert sent_mb(res.stderr) * 1e6 >= size * 0.95


@pytest.mark.long  # `make test-long`: `make test` keeps this module's other cases (tests/README.md, issue 57)
def test_base_different_warns_and_moves_the_layers_above_the_difference(testbed, sc, worker_bare):
    good, _ = worker_bare
    # the same tag on the worker, another image ID over the same layers (a re-push that changed the
    # config only): no container is run to make it
    testbed.copy_image(BASE, HEAD, WORKER)
    testbed.sh(
        WORKER,
        f"printf 'FROM {BASE}\\nLABEL org.sparkcluster.test=re-pushed\\n' | docker build -q --network none -t {BASE} -",
    )
    other = testbed.image_id(WORKER, BASE)
    assert other != testbed.image_id(HEAD, BASE)
    res = sc("doctor", "--profile", PROFILE, "--json", timeout=120)
    assert res.returncode in (0, 1), res.stdout + res.stderr
    rows = [c for c in json.loads(res.stdout)["checks"] if c["id"] == "image.base-same"]
    worker_row = next(r for r in rows if r["node"] == WORKER)
    assert worker_row["status"] == "warn" and other[:19] in worker_row["detail"], worker_row
    assert f"docker pull {BASE}" in worker_row["fix"]
    # the worker's base holds the head's base layers: those stay
    n_base, n_all = len(layers_of(testbed, HEAD, BASE)), len(layers_of(testbed, HEAD, REF))
    step = receive_step(sc)
    assert f"{n_all - n_base} of {n_all} layers" in step, step
    res = sc("up", "--profile", PROFILE)
    assert res.returncode == 0, res.stdout + res.stderr
    assert testbed.image_id(WORKER, REF) == good


@pytest.mark.long  # `make test-long`: `make test` keeps this module's other cases (tests/README.md, issue 57)
def test_base_different_at_the_bottom_moves_everything(testbed, sc, worker_bare):
    good, _ = worker_bare
    # a base that shares no layer with the head's: an unrelated image under the base's tag
    testbed.sh(WORKER, f"tar -cf - -C /etc hostname | docker import - {BASE}")
    n_all = len(layers_of(testbed, HEAD, REF))
    step = receive_step(sc)
    assert f"{n_all} of {n_all} layers" in step, step
    res = sc("up", "--profile", PROFILE)
    assert res.returncode == 0, res.stdout + res.stderr
    assert testbed.image_id(WORKER, REF) == good


@pytest.mark.long  # `make test-long`: `make test` keeps this module's other cases (tests/README.md, issue 57)
def test_cut_layer_stream_leaves_no_image_and_the_next_up_succeeds(testbed, sc, worker_bare):
    good, _ = worker_bare
    testbed.copy_image(BASE, HEAD, WORKER)
    before = images(testbed, WORKER)

    killed: list[str] = []
    stop = threading.Event()

    def cut() -> None:
        # each time a docker load on the worker starts unpacking what arrives (a new docker-import-*
        # directory), kill the sender on the head (the layer-store reader framing its archive itself
        # in its container, or python3 framing what docker save writes): the layer-store stream is
        # cut, then the docker save it falls back to
        seen: set[str] = set()
        deadline = time.monotonic() + 300
        while not stop.is_set() and time.monotonic() < deadline:
            dirs = set(
                testbed.sh(WORKER, "ls -d /var/lib/docker/tmp/docker-import-* 2>/dev/null", check=False).stdout.split()
            )
            if dirs - seen:
                seen |= dirs
                pid = testbed.sh(
                    HEAD,
                    "pgrep -f '^python3 -c .* sparkcluster[.]programs[.](image|layer)_sender ' | head -1",
                    check=False,
                ).stdout.strip()
                if pid.isdigit():
                    testbed.sh(HEAD, f"kill -KILL {pid}", check=False)
                    killed.append(pid)
            time.sleep(0.02)

    t = threading.Thread(target=cut, daemon=True)
    t.start()
    res = sc("up", "--profile", PROFILE)
    stop.set()
    t.join(timeout=10)
    assert len(killed) == 2, f"senders killed: {killed} (the layer store's, then docker save's)"
    err = (
        stage_failed(res, "image", HEAD) if "failed on spark-head" in res.stderr else stage_failed(res, "image", WORKER)
    )
    assert "send the image: transfer failed" in err, err
    assert testbed.image_id(WORKER, REF) is None
    assert images(testbed, WORKER) == before, "a partial image was left on the worker"
    res = sc("up", "--profile", PROFILE)
    assert res.returncode == 0, res.stdout + res.stderr
    assert testbed.image_id(WORKER, REF) == good
