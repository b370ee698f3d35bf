"""The image stage's send step end to end on this machine: the real sender and receiver snippets
over loopback, a fake `docker` CLI (save prints a file, load keeps stdin, or fails as docker load
does on a missing layer file) and a fake Engine API for the image IDs."""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from types import SimpleNamespace

import pytest

from sparkcluster.errors import StageError
from sparkcluster.facts import HostFacts, parsers
from sparkcluster.movement import transfer
from sparkcluster.movement.layers import ImageLayers
from sparkcluster.up.stages import image as image_stage
from sparkcluster.up.stages.image import HeadImage

HEAD, WORKER = "spark-head", "spark-worker"
IMAGE = "sparkcluster/vllm-ray:test"
CLASSIC = parsers.DockerInfo("20.10.24+dfsg1", "/var/lib/docker", ("runc",), "runc", (("Backing Filesystem", "extfs"),))
CONTAINERD = parsers.DockerInfo(
    "29.0.0", "/var/lib/docker", ("runc",), "runc", (("driver-type", "io.containerd.snapshotter.v1"),)
)

# docker load's failure when the archive lacks a layer the daemon does not hold (seen on 20.10.24);
# `run` runs the layer-store reader on $FAKE_DIR/root, mounted where the command mounts the docker root
FAKE_DOCKER = r"""#!/bin/sh
case "$1" in
  save) exec cat "$FAKE_DIR/image.tar" ;;
  run) if [ -e "$FAKE_DIR/run-fails" ]; then echo "docker: Error response from daemon: invalid mount config" >&2; exit 125; fi
       exec python3 "$FAKE_DIR/fake_run.py" "$@" ;;
  load) n=$(ls "$FAKE_DIR" | grep -c '^loaded'); cat > "$FAKE_DIR/partial.$n" || exit 1
        mv "$FAKE_DIR/partial.$n" "$FAKE_DIR/loaded.$n"  # a load killed on a cut stream loads nothing
        if [ -e "$FAKE_DIR/fail-load-once" ]; then rm "$FAKE_DIR/fail-load-once"
          echo "open /var/lib/docker/tmp/docker-import-1/aaaa/layer.tar: no such file or directory" >&2; exit 1; fi
        echo "Loaded image: x"; touch "$FAKE_DIR/loaded-ok" ;;
  *) exit 64 ;;
esac
"""


def _tar(entries) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as t:
        for name, data in entries:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


BASE_TAR, RAY_TAR = _tar([("base", b"b" * 300_000)]), _tar([("ray", b"r" * 100_000)])
BASE_ID, RAY_ID = ("sha256:" + hashlib.sha256(x).hexdigest() for x in (BASE_TAR, RAY_TAR))
CONFIG = json.dumps({"rootfs": {"type": "layers", "diff_ids": [BASE_ID, RAY_ID]}}).encode()
HEAD_ID = "sha256:" + hashlib.sha256(CONFIG).hexdigest()
SAVED = _tar([("aaaa/layer.tar", RAY_TAR), ("bbbb/layer.tar", BASE_TAR), ("cfg.json", b"{}"), ("manifest.json", b"[]")])


FAKE_RUN = r"""
import os, sys
# docker run ... --mount type=bind,source=ROOT,target=MOUNT,readonly ... --entrypoint python3 IMAGE ARGS:
# python3 ARGS, MOUNT read from $FAKE_DIR/root
a = sys.argv[2:]
mount = dict(kv.split("=", 1) for kv in a[a.index("--mount") + 1].split(",") if "=" in kv)["target"]
rest = a[a.index("--entrypoint") + 3 :]
root = os.environ["FAKE_DIR"] + "/root"
os.execvp("python3", ["python3"] + [root if x == mount else x for x in rest])
"""


def layer_store(root, image_id: str, config: bytes, tars: list[bytes]) -> None:
    """A classic overlay2 store holding `tars` (bottom up) as the engine keeps them: per chain ID a
    cache-id and a tar-split.json.gz (each header and padding as a segment, each file by name and
    size), the files under overlay2/<cache-id>/diff, and the config under imagedb (the records'
    shape as in tests/captured/docker-root-20.10)."""
    (root / "image/overlay2/imagedb/content/sha256").mkdir(parents=True)
    (root / "image/overlay2/imagedb/content/sha256" / image_id.removeprefix("sha256:")).write_bytes(config)
    chain = None
    for i, data in enumerate(tars):
        d = hashlib.sha256(data).hexdigest()
        chain = d if chain is None else hashlib.sha256(f"sha256:{chain} sha256:{d}".encode()).hexdigest()
        ldir = root / "image/overlay2/layerdb/sha256" / chain
        ldir.mkdir(parents=True)
        (ldir / "cache-id").write_text(f"cache{i}")
        recs, at = [], 0
        with tarfile.open(fileobj=io.BytesIO(data)) as t:
            for m in t:
                recs.append({"type": 2, "payload": base64.b64encode(data[at : m.offset_data]).decode()})
                recs.append({"type": 1, "name": m.name, "size": m.size, "payload": None})
                f = root / "overlay2" / f"cache{i}" / "diff" / m.name
                f.parent.mkdir(parents=True, exist_ok=True)
                f.write_bytes(data[m.offset_data : m.offset_data + m.size])
                at = m.offset_data + m.size
        recs.append({"type": 2, "payload": base64.b64encode(data[at:]).decode()})
        with gzip.open(ldir / "tar-split.json.gz", "wt") as g:
            g.write("".join(json.dumps(r) + "\n" for r in recs))


class Res(SimpleNamespace):
    def tail(self, lines: int = 10) -> str:
        return "\n".join((self.stderr + "\n" + self.stdout).strip().splitlines()[-lines:])


class Proc:
    def __init__(self, argv, env):
        self.command = argv[-1]
        self.p = subprocess.Popen(
            argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.err: list[str] = []

    def write(self, text):  # the port, to a sender started before its receiver (stream.run's port_on_stdin)
        self.p.stdin.write(text)
        self.p.stdin.flush()

    def close(self):
        self.p.stdin.close()

    def stderr_lines(self):
        for line in self.p.stderr:
            self.err.append(line.rstrip("\n"))
            yield self.err[-1]

    def wait(self):
        out, rest = self.p.communicate(timeout=30)
        self.err += rest.splitlines()
        return Res(
            ok=self.p.returncode == 0,
            exit_code=self.p.returncode,
            stdout=out,
            stderr="\n".join(self.err),
            command=self.command,
        )


class Host:
    def __init__(self, name, env, ids):
        self.name, self.env, self.ids, self.started, self.removed = name, env, ids, [], []
        self.api = SimpleNamespace(
            inspect_image=self._inspect, history=lambda ref: [], remove_image=self.removed.append
        )

    def _inspect(self, ref):
        i = self.ids()
        if i is None:
            import docker.errors

            raise docker.errors.NotFound("no such image")
        return {"Id": i}

    def docker(self):
        return SimpleNamespace(api=self.api)

    def start(self, argv, timeout=0):
        self.started.append(argv[-1])
        return Proc(argv, self.env)

    def run(self, cmd, timeout=0, warn=False):
        if transfer.HANG_UP in cmd[-1]:  # the hang-up that ends a receiver nobody connected to
            p = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=30)
            return Res(ok=p.returncode == 0, exit_code=p.returncode, stdout=p.stdout, stderr=p.stderr, command=cmd)
        return Res(ok=False, exit_code=1, stdout="", stderr="", command=cmd)


@pytest.fixture
def world(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "docker").write_text(FAKE_DOCKER)
    (bindir / "docker").chmod(0o755)
    (bindir / "python3").symlink_to(sys.executable)
    (tmp_path / "image.tar").write_bytes(SAVED)
    (tmp_path / "fake_run.py").write_text(FAKE_RUN)
    layer_store(tmp_path / "root", HEAD_ID, CONFIG, [BASE_TAR, RAY_TAR])
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "FAKE_DIR": str(tmp_path)}
    head = Host(HEAD, env, lambda: HEAD_ID)
    worker = Host(WORKER, env, lambda: HEAD_ID if (tmp_path / "loaded-ok").exists() else None)

    def make(worker_chains, docker=CLASSIC):
        node = lambda n: SimpleNamespace(name=n, control_ip="127.0.0.1")  # noqa: E731
        facts = {
            HEAD: HostFacts(
                HEAD,
                docker=CLASSIC,
                image_id=HEAD_ID,
                image_layers=ImageLayers(HEAD_ID, (BASE_ID, RAY_ID), (300_000, 100_000)),
            ),
            WORKER: HostFacts(WORKER, docker=docker, layer_chains=worker_chains),
        }
        inv = SimpleNamespace(head=node(HEAD), node=node)
        progress = SimpleNamespace(bytes=lambda *a: None)
        return SimpleNamespace(
            cluster=SimpleNamespace(head=head, hosts={HEAD: head, WORKER: worker}),
            facts=facts,
            inv=inv,
            plan=SimpleNamespace(image=IMAGE),
            progress=progress,
            find=lambda kind: HeadImage({"Id": HEAD_ID, "Size": 400_000, "RootFS": {"Layers": [BASE_ID, RAY_ID]}}),
        )

    return tmp_path, make, head


def loaded(tmp_path) -> list[list[str]]:
    out = []
    for p in sorted(tmp_path.glob("loaded.*")):
        with tarfile.open(fileobj=io.BytesIO(p.read_bytes())) as t:
            out.append(t.getnames())
    return out


STORE_ARCHIVE = [HEAD_ID[7:] + ".json", RAY_ID[7:] + "/layer.tar", "manifest.json"]


def test_base_held_reads_only_the_ray_layer_from_the_heads_layer_store(world):
    tmp, make, head = world
    note = image_stage.send(make([[BASE_ID]]), WORKER)
    assert loaded(tmp) == [STORE_ARCHIVE]
    assert "1 of 2 layers (0.1 MB); it holds the bottom 1" in note and note.startswith("sent to spark-worker: ")
    assert "; read from the head's layer store: the first byte left after " in note
    words = head.started[0].split()
    # the reader sends the archive itself, started before the receiver (the port on its stdin)
    assert head.started[0].startswith("docker run -i --rm --network host --log-driver none ")
    assert "-" + BASE_ID[7:] in words and "=" + RAY_ID[7:] in words


def test_a_store_it_cannot_read_falls_back_to_docker_save_leaving_out_the_same_layers(world):
    tmp, make, head = world
    shutil.rmtree(tmp / "root" / "image" / "overlay2" / "layerdb")  # another driver, or a store moved
    note = image_stage.send(make([[BASE_ID]]), WORKER)
    assert loaded(tmp)[-1] == ["aaaa/layer.tar", "cfg.json", "manifest.json"]
    assert "-" + BASE_ID[7:] in head.started[-1].split() and "+" + RAY_ID[7:] in head.started[-1].split()
    assert "; by docker save: the first byte left after " in note
    # the stand-in archive's tars sit under directories without a json: both are hashed on the way
    assert "; 2 layer tars (0.4 MB) hashed on the head" in note


def test_a_reader_that_fails_mid_layer_falls_back_and_the_worker_gets_the_image(world):
    tmp, make, _ = world
    ray_file = next((tmp / "root" / "overlay2").glob("cache1/diff/*"))
    ray_file.write_bytes(b"R" + ray_file.read_bytes()[1:])  # the store no longer rebuilds the registered layer
    note = image_stage.send(make([[BASE_ID]]), WORKER)
    assert (tmp / "loaded-ok").exists() and loaded(tmp)[-1] == ["aaaa/layer.tar", "cfg.json", "manifest.json"]
    assert "by docker save" in note


def test_a_reader_container_that_does_not_start_falls_back_at_once(world):
    # the reader starts before the receiver and never connects: the receiver is hung up on (a cut
    # stream), so the head is at fault and docker save sends the delta, without a minute's wait
    import time

    tmp, make, _ = world
    (tmp / "run-fails").touch()
    started = time.monotonic()
    note = image_stage.send(make([[BASE_ID]]), WORKER)
    assert time.monotonic() - started < 30
    assert (tmp / "loaded-ok").exists() and "by docker save" in note


def test_the_command_carries_the_diff_ids_in_order_so_v1_tars_are_named(world):
    tmp, make, head = world
    image_stage.send(make([[BASE_ID]]), WORKER)
    words = head.started[0].split()
    assert [w for w in words if w.startswith("=") and len(w) == 65] == ["=" + BASE_ID[7:], "=" + RAY_ID[7:]]


def test_head_time_without_a_byte_or_a_hash_says_nothing():
    got = SimpleNamespace(first_s=None, sent=0, secs=1.0, counts={})
    assert image_stage.head_time(got, 10**9) == ""
    got = SimpleNamespace(
        first_s=60.0, sent=274_000_000, secs=69.0, counts={"hashed": (0, 0), "dropped": (4, 9)}, source="save"
    )
    assert image_stage.head_time(got, 2_900_000_000) == (
        "; by docker save: the first byte left after 60.0s (it copies the whole 2.90 GB image on the head before "
        "it streams), the rest took 9.0s"
    )


def test_base_absent_sends_everything_unfiltered(world):
    tmp, make, head = world
    note = image_stage.send(make([]), WORKER)
    assert loaded(tmp) == [["aaaa/layer.tar", "bbbb/layer.tar", "cfg.json", "manifest.json"]]
    assert "2 of 2 layers" in note
    assert head.started[0].split()[-2] == "127.0.0.1"  # no diff IDs on the command line (then the bundle)


def test_containerd_store_gets_the_whole_image_and_the_note_says_so(world):
    tmp, make, _ = world
    note = image_stage.send(make([[BASE_ID]], CONTAINERD), WORKER)
    assert loaded(tmp) == [["aaaa/layer.tar", "bbbb/layer.tar", "cfg.json", "manifest.json"]]
    assert "containerd image store cannot skip" in note


def test_a_layer_lost_since_preflight_resends_the_whole_image(world):
    tmp, make, _ = world
    (tmp / "fail-load-once").touch()
    note = image_stage.send(make([[BASE_ID]]), WORKER)
    assert loaded(tmp) == [STORE_ARCHIVE, ["aaaa/layer.tar", "bbbb/layer.tar", "cfg.json", "manifest.json"]]
    assert "2 of 2 layers" in note


def test_an_id_mismatch_names_both_ids(world):
    tmp, make, _ = world
    r = make([[BASE_ID]])
    r.cluster.hosts[WORKER].ids = lambda: "sha256:" + "0" * 64
    with pytest.raises(StageError) as e:
        image_stage.send(r, WORKER)
    assert "sha256:" + "0" * 64 in str(e.value) and HEAD_ID in str(e.value)
    # the image loaded under the name is not the head's: removed, so nothing starts from it
    assert r.cluster.hosts[WORKER].removed == [r.plan.image] and "removed from" in str(e.value)
    assert r.cluster.hosts[HEAD].removed == []


def test_a_cut_stream_fails_on_the_head_and_loads_nothing(world):
    tmp, make, _ = world
    (tmp / "image.tar").write_bytes(SAVED[: 512 + len(RAY_TAR)])  # docker save died after the first layer
    shutil.rmtree(tmp / "root")  # and the layer store could not be read either
    with pytest.raises(StageError) as e:
        image_stage.send(make([[BASE_ID]]), WORKER)
    assert "stage 'image' failed on spark-head: send the image: transfer failed" in str(e.value)
    assert not (tmp / "loaded-ok").exists()
