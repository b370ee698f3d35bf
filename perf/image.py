"""Image distribution's figures: the worker lacking every layer (sparkcluster against
`docker save | ssh | docker load` over the same link, to the worker's dockerd `load` event), the base
on both hosts (bytes on the link against the bytes of the layers the worker lacks, and the image
stage's time against `docker load` alone of the same archive: issue 40 item 7), identical image
IDs (recorded by `up` from down, perf/up.py), and what crosses the controller.

It changes the worker's images and puts them back: `worker_rmi` removes the cluster image (with any
other tag of its ID, put back by `restore_aliases`), `worker_bare` sets aside every image sharing a
layer with it (`restore_worker` loads them back).
"""

from __future__ import annotations

import json
import shlex
import signal
import statistics
import time
from pathlib import Path

from perf.counters import LINK_NOISE
from perf.figures import Figure, info
from perf.figures import say as _say
from perf.session import PROFILE
from sparkcluster.labels import CLUSTER_LABEL

BASELINE_DIR = "/tmp/sparkcluster-bench-baseline"  # -<worker>, on each host (each host has a private /tmp)
BASELINE_PORT = 2222
DELTA_ARCHIVE = "/var/tmp/sparkcluster-bench-delta.tar"  # on the head, then on the worker (removed after)

# the bytes of each layer as docker save emits it (its tar), by diff ID: what "the layers the
# worker lacks" weigh on the wire before TCP/IP. Run on the head, reading docker save.
LAYER_TAR_SIZES = r"""
import hashlib, json, sys, tarfile
out = {}
with tarfile.open(fileobj=sys.stdin.buffer, mode="r|") as t:
    for m in t:
        if m.isfile() and (m.name.endswith("/layer.tar") or "/blobs/sha256/" in "/" + m.name):
            h, f = hashlib.sha256(), t.extractfile(m)
            while True:
                b = f.read(1 << 20)
                if not b:
                    break
                h.update(b)
            out["sha256:" + h.hexdigest()] = m.size
print(json.dumps(out))
"""


class Baseline:
    """A throwaway second sshd on the worker, bound to its control address only, that accepts one
    throwaway key kept on the head; removed (process, keys, config) at exit."""

    def __init__(self, tb, head_ip: str, worker_ip: str, worker: str = "spark-worker"):
        self.tb, self.head_ip, self.worker_ip, self.worker = tb, head_ip, worker_ip, worker
        self.d = f"{BASELINE_DIR}-{worker}"  # one per worker: several may be up at once (perf/weights_scale)

    def __enter__(self) -> Baseline:
        d, tb, W, H = self.d, self.tb, self.worker, "spark-head"
        self.__exit__()
        pub = tb.sh(
            H,
            f"mkdir -p -m 700 {d} && ssh-keygen -q -t ed25519 -N '' -C sparkcluster-bench -f {d}/id && cat {d}/id.pub",
        ).stdout
        tb.sh(W, f"mkdir -p -m 700 {d} && ssh-keygen -q -t ed25519 -N '' -f {d}/host_key")
        tb.sh(W, f"cat > {d}/authorized_keys && chmod 600 {d}/authorized_keys", input=pub)
        tb.sh(
            W,
            f"cat > {d}/sshd_config",
            input=f"""# sparkcluster bench: save-ssh-load baseline only
ListenAddress {self.worker_ip}:{BASELINE_PORT}
HostKey {d}/host_key
PidFile {d}/sshd.pid
AuthorizedKeysFile {d}/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UsePAM no
StrictModes no
X11Forwarding no
PrintMotd no
""",
        )
        tb.sh(
            W,
            f"/usr/sbin/sshd -t -f {d}/sshd_config && /usr/sbin/sshd -f {d}/sshd_config -E {d}/sshd.log && "
            f"for i in $(seq 100); do ss -Hltn 'sport = :{BASELINE_PORT}' | grep -q . && break; sleep 0.05; done",
        )
        kt, key = tb.sh(W, f"cat {d}/host_key.pub").stdout.split()[:2]
        tb.sh(H, f"cat > {d}/known_hosts", input=f"[{self.worker_ip}]:{BASELINE_PORT} {kt} {key}\n")
        self.ssh = (
            f"ssh -i {d}/id -o BatchMode=yes -o IdentitiesOnly=yes -o UserKnownHostsFile={d}/known_hosts "
            f"-o GlobalKnownHostsFile=/dev/null -o StrictHostKeyChecking=yes -b {self.head_ip} "
            f"-p {BASELINE_PORT} root@{self.worker_ip}"
        )
        tb.sh(H, f"{self.ssh} true", timeout=30)
        return self

    def command(self, image: str) -> str:
        return f"set -o pipefail; docker save {image} | {self.ssh} docker load -q"

    def __exit__(self, *exc) -> None:
        d = self.d
        self.tb.sh(self.worker, f"[ -f {d}/sshd.pid ] && kill $(cat {d}/sshd.pid); rm -rf {d}", check=False)
        self.tb.sh("spark-head", f"rm -rf {d}", check=False)


def _stop_after_image(line: str, p) -> None:
    if line.startswith("✓ image"):
        p.send_signal(signal.SIGINT)  # only the image stage is measured: Ctrl-C, `up` rolls back


def _up_image_stage(s):
    """`up` until its image stage is done, then Ctrl-C. The containers stage may have a create in
    flight at that moment, which the rollback does not know of yet (the interrupted fan-out's thread
    still waits on it) and leaves behind: every container of the cluster is removed after, as `down`
    would, so that the next `docker rmi` of the measurement finds the image unused (the cluster is
    down throughout these figures)."""
    r = s.sc("up", "--profile", PROFILE, check=False, on_line=_stop_after_image)
    label = shlex.quote(f"{CLUSTER_LABEL}=testbed")
    for h in ("spark-head", "spark-worker"):
        s.tb.sh(h, f'ids=$(docker ps -aq --filter label={label}); [ -z "$ids" ] || docker rm -f $ids', check=False)
    return r


class Images:
    """The image figures of one run, on its session `s` (testbed, CLI, counters, raw records)."""

    def __init__(self, s):
        self.s, self.tb, self.image = s, s.tb, s.image
        self.aliases: set[str] = set()  # the worker's other tags of the cluster image, put back at the end
        self._tar_sizes: dict[str, int] | None = None

    def size(self) -> int:
        return int(self.tb.docker("spark-head", f"image inspect --format '{{{{.Size}}}}' {self.image}").stdout)

    def loaded_at(self, since: float) -> float | None:
        """When the worker's dockerd finished loading the image: its `load` image event."""
        out = self.tb.docker(
            "spark-worker",
            f"events --since {int(since) - 1} --until {int(time.time()) + 2} "
            "--filter type=image --filter event=load --format '{{.TimeNano}}'",
            check=False,
        ).stdout.split()
        times = [int(x) / 1e9 for x in out if x.isdigit() and int(x) / 1e9 >= since]
        return min(times) if times else None

    def worker_rmi(self) -> None:
        """The cluster image off the worker: its tag, and any other tag of the same image ID (the
        testbed's own cache tag), or `docker rmi` only untags and every layer stays; those tags
        are put back by `restore_aliases`."""
        iid = self.tb.image_id("spark-worker", self.image)
        if not iid:  # the worker may lack it already (set aside with every image sharing its layers)
            return
        tags = json.loads(
            self.tb.docker("spark-worker", f"image inspect --format '{{{{json .RepoTags}}}}' {iid}").stdout
        )
        others = [t for t in tags or [] if t != self.image]
        self.aliases.update(others)
        self.tb.docker("spark-worker", " ".join(["rmi", self.image, *others]))

    def restore_aliases(self) -> None:
        for tag in sorted(self.aliases):
            if self.tb.image_id("spark-worker", self.image) and not self.tb.image_id("spark-worker", tag):
                self.tb.docker("spark-worker", f"tag {self.image} {tag}")

    def same_on_both(self) -> bool:
        return self.tb.image_id("spark-worker", self.image) == self.tb.image_id("spark-head", self.image)

    def worker_layers(self) -> list[list[str]]:
        out = self.tb.sh(
            "spark-worker",
            'ids=$(docker image ls -q --no-trunc | sort -u); [ -z "$ids" ] || '
            "docker image inspect --format '{{json .RootFS.Layers}}' $ids",
        ).stdout
        return [json.loads(x) or [] for x in out.split()]

    def lacking_bytes(self) -> tuple[int, int, int]:
        """(tar bytes of the cluster image's layers the worker lacks, layers lacking, layers): the
        worker's holdings as sparkcluster sees them (the longest bottom-up prefix of any image)."""
        from sparkcluster.movement import layers

        mine = self._head_layers()
        if self._tar_sizes is None:
            self._tar_sizes = json.loads(
                self.tb.sh(
                    "spark-head",
                    f"set -o pipefail; docker save {self.image} | python3 -c {shlex.quote(LAYER_TAR_SIZES)}",
                    timeout=600,
                ).stdout
            )
        held = layers.held_prefix(mine, self.worker_layers())
        return sum(self._tar_sizes[d] for d in mine[held:]), len(mine) - held, len(mine)

    def _worker_tags(self) -> list[str]:
        out = self.tb.docker("spark-worker", "images --format '{{.Repository}}:{{.Tag}}'").stdout.split()
        return [t for t in out if "<none>" not in t]

    def _layers_on(self, host: str, ref: str) -> list[str]:
        out = self.tb.docker(host, f"image inspect --format '{{{{json .RootFS.Layers}}}}' {shlex.quote(ref)}").stdout
        return json.loads(out) or []

    def _head_layers(self) -> list[str]:
        return self._layers_on("spark-head", self.image)

    def worker_bare(self, aside: Path) -> None:
        """The worker lacks every layer of the cluster image: the images sharing any are set aside
        (docker save to the controller, then removed); `restore_worker` loads them back."""
        if self.tb.image_id("spark-worker", self.image):
            self.worker_rmi()
        # the cluster image is gone from the worker first, so its layers are named from the head
        mine = set(self._head_layers())
        tags = [t for t in self._worker_tags() if set(self._layers_on("spark-worker", t)) & mine]
        self.tb.set_images_aside("spark-worker", tags, aside)
        lacking, n_lack, n_all = self.lacking_bytes()
        if n_lack != n_all:
            raise SystemExit(f"bench: the worker still holds {n_all - n_lack} of the image's layers")
        _say(f"  worker set bare: {', '.join(tags) or 'nothing to set aside'}")

    def restore_worker(self, aside: Path) -> None:
        self.tb.restore_images("spark-worker", aside)

    def delta(self, i: int) -> str:
        """The base on both hosts (as after docker pull on each Spark): only the Ray layers move.
        Returns the progress line."""
        s = self.s
        self.worker_rmi()
        lacking, n_lack, n_all = self.lacking_bytes()
        if not n_lack:
            raise SystemExit("bench: the worker still holds every layer of the cluster image after its rmi")
        with s.sampler:
            r = _up_image_stage(s)
        t_img, t_img_ok = r.at("▸ image"), r.at("✓ image")
        if t_img_ok is None:
            raise SystemExit(f"bench: up did not finish its image stage\n{r.stderr}")
        link, _ = s.sampler.delta(t_img, t_img_ok)
        if not self.same_on_both():
            raise SystemExit("bench: the worker's image ID differs from the head's after the transfer")
        s.rec("delta_link_bytes", link)
        s.rec("delta_lacking_bytes", lacking)
        s.rec("delta_ratio", link / max(lacking, 1))
        s.rec("delta_stage_s", t_img_ok - t_img)
        s.details["delta_layers"] = {"lacking": n_lack, "of": n_all}
        load_s = self.delta_load()
        s.rec("delta_load_s", load_s)
        s.rec("delta_vs_load", (t_img_ok - t_img) / max(load_s, 1e-3))
        return (
            f"  delta #{i}: {n_lack} of {n_all} layers lacking, {lacking:,} B of layer tars; {link:,} B on the link "
            f"({link / max(lacking, 1):.3f}), image stage {t_img_ok - t_img:.2f}s; the same archive through "
            f"docker load alone {load_s:.2f}s ({(t_img_ok - t_img) / max(load_s, 1e-3):.2f}x)"
        )

    def delta_load(self) -> float:
        """`docker load` alone of the bytes the image stage sends for a delta, timed on the worker:
        the worker is set back to lacking the same layers (`worker_rmi`), the archive is written
        once on the head the way the stage writes it (its layer-store reader; docker save through
        its sender when the store cannot be read, as the stage falls back), copied to the worker's
        disk (untimed, page-cached), then loaded. The load puts the image back, with the head's ID."""
        from sparkcluster.movement import layers, layerstore, transfer

        tb, f = self.tb, DELTA_ARCHIVE
        self.worker_rmi()
        d = layers.delta(layers.ImageLayers("", tuple(self._head_layers())), self.worker_layers())
        iid = tb.image_id("spark-head", self.image)
        root = tb.docker("spark-head", "info --format '{{.DockerRootDir}}'").stdout.strip()
        try:
            read = layerstore.read_command(self.image, iid, root, d.order, d.skip)
            if tb.sh("spark-head", f"set -o pipefail; {read} > {f}", check=False, timeout=600).returncode != 0:
                send = transfer.send_command(self.image, "127.0.0.1", 1, "127.0.0.1", d.skip, d.keep, d.order)
                assert send.count(" 127.0.0.1 1 127.0.0.1") == 1
                send = send.replace(" 127.0.0.1 1 127.0.0.1", ' 127.0.0.1 "$port" 127.0.0.1')
                recv = transfer.receive_command("127.0.0.1", "127.0.0.1", "stdout")
                # the stream's key (programs/framing) on each end's stdin, as movement/stream hands it
                tb.sh(
                    "spark-head",
                    "key=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \\n'); "
                    f"printf '%s\\n' \"$key\" | {recv} > {f} 2> {f}.err & r=$!; "
                    f"for i in $(seq 600); do port=$(sed -n 's/^@@port //p' {f}.err); [ -n \"$port\" ] && break; "
                    f"sleep 0.05; done; printf '%s\\n' \"$key\" | {{ {send} ; }} && wait $r",
                    timeout=600,
                )
            data = tb.sh("spark-head", f"cat {f}", text=False, timeout=600).stdout
            tb.sh("spark-worker", f"cat > {f}", input=data, text=False, timeout=600)
            out = tb.sh(
                "spark-worker",
                f"t0=$(date +%s.%N); docker load -q -i {f} >/dev/null; t1=$(date +%s.%N); echo $t0 $t1",
                timeout=600,
            ).stdout.split()
        finally:
            tb.sh("spark-head", f"rm -f {f} {f}.err", check=False)
            tb.sh("spark-worker", f"rm -f {f}", check=False)
        if not self.same_on_both():
            raise SystemExit("bench: docker load of the delta archive did not give the worker the head's image")
        return float(out[1]) - float(out[0])

    def transfer(self, i: int, baseline: Baseline) -> None:
        """The image goes head -> worker, the worker lacking every layer: sparkcluster's image
        stage, then the baseline (order alternates), each to the worker's `load` event."""
        s = self.s

        def ours() -> None:
            self.worker_rmi()
            with s.sampler:
                r = _up_image_stage(s)
            t_img, t_img_ok = r.at("▸ image"), r.at("✓ image")
            if t_img_ok is None:
                raise SystemExit(f"bench: up did not finish its image stage\n{r.stderr}")
            win = s.sampler.window(t_img, t_img_ok)
            link, lan = s.sampler.delta(t_img, t_img_ok)
            if win is None:
                raise SystemExit("bench: no transfer seen on the control link during the image stage")
            loaded = self.loaded_at(t_img)
            if loaded is None:
                raise SystemExit("bench: no `load` event from the worker's dockerd")
            s.rec("xfer_sc_s", loaded - t_img)
            s.rec("xfer_sc_link_s", win[1] - win[0])
            s.rec("xfer_sc_link_bytes", link)
            s.rec("xfer_sc_lan_bytes", lan)
            s.rec("xfer_sc_stage_s", t_img_ok - t_img)
            _say(
                f"  transfer #{i} sparkcluster: {loaded - t_img:.2f}s to loaded, {win[1] - win[0]:.2f}s on the link "
                f"({link:,} B), image stage {t_img_ok - t_img:.2f}s, controller LAN {lan:,} B"
            )

        def theirs() -> None:
            self.worker_rmi()
            with s.sampler:
                t0 = time.time()
                self.tb.sh("spark-head", baseline.command(self.image), timeout=600)
                t1 = time.time()
            win = s.sampler.window(t0, t1)
            if win is None:
                raise SystemExit("bench: no transfer seen on the control link for the baseline")
            loaded = self.loaded_at(t0)
            if loaded is None:
                raise SystemExit("bench: no `load` event from the worker's dockerd")
            s.rec("xfer_base_s", loaded - t0)
            s.rec("xfer_base_link_s", win[1] - win[0])
            s.rec("xfer_base_wall", t1 - t0)
            _say(
                f"  transfer #{i} save-ssh-load: {loaded - t0:.2f}s to loaded, {win[1] - win[0]:.2f}s on the link, "
                f"{t1 - t0:.2f}s wall"
            )

        for step in (ours, theirs) if i % 2 == 0 else (theirs, ours):
            step()
        if not self.same_on_both():
            raise SystemExit("bench: the worker's image ID differs from the head's after the transfer")
        s.rec("xfer_ratio", s.raw["xfer_base_s"][-1] / s.raw["xfer_sc_s"][-1])


def figures(R: dict, size: int) -> list[Figure]:
    """The image rows of the table; `size`: the cluster image's size in bytes."""
    return delta_figures(R) + transfer_figures(R, size)


def transfer_figures(R: dict, size: int) -> list[Figure]:
    """The rows of the whole image's transfer (and identical IDs)."""
    F = [
        Figure(
            "image_controller_bytes",
            "image transfer: bytes on the controller's LAN veths",
            "bytes",
            f"0 image bytes (< {size // 1000:,} = 0.1% of the image)",
            [float(x) for x in R["xfer_sc_lan_bytes"]],
            max(R["xfer_sc_lan_bytes"]) < size / 1000,
            note=f"image {size:,} B; these bytes are the SSH session's own traffic (an upper bound)",
        ),
        info(
            "image_link_bytes",
            "image transfer: bytes on the head-worker control link",
            "bytes",
            [float(x) for x in R["xfer_sc_link_bytes"]],
        ),
    ]
    F += [
        Figure(
            "image_throughput",
            "image transfer, worker lacks all: sparkcluster / save-ssh-load throughput",
            "ratio",
            ">= 0.90",
            R["xfer_ratio"],
            statistics.median(R["xfer_ratio"]) >= 0.90,
        ),
        info(
            "image_sc_mbps",
            "image transfer: sparkcluster, stage start to loaded",
            "MB/s",
            [size / s / 1e6 for s in R["xfer_sc_s"]],
        ),
        info(
            "image_base_mbps",
            "image transfer: save-ssh-load, start to loaded",
            "MB/s",
            [size / s / 1e6 for s in R["xfer_base_s"]],
        ),
        info(
            "image_sc_link_mbps",
            "  ... sparkcluster, bytes on the wire only",
            "MB/s",
            [size / s / 1e6 for s in R["xfer_sc_link_s"]],
        ),
        info(
            "image_base_link_mbps",
            "  ... save-ssh-load, bytes on the wire only",
            "MB/s",
            [size / s / 1e6 for s in R["xfer_base_link_s"]],
        ),
    ]
    if "image_same_s" not in R:  # measured by the delta family: a run of `--only transfer` has none
        return F
    F += [
        Figure(
            "image_same_s",
            "identical image IDs: image stage time",
            "s",
            "< 1",
            R["image_same_s"],
            max(R["image_same_s"]) < 1,
        ),
        Figure(
            "image_same_bytes",
            "identical image IDs: bytes on the control link",
            "bytes",
            f"0 (< {LINK_NOISE // 1024} KiB: no image moved)",
            [float(x) for x in R["image_same_link_bytes"]],
            max(R["image_same_link_bytes"]) < LINK_NOISE,
        ),
    ]
    return F


def delta_figures(R: dict) -> list[Figure]:
    """The rows of a delta's transfer (the worker holding the base), where measured."""
    F: list[Figure] = []
    if R.get("delta_ratio"):
        F += [
            Figure(
                "image_delta_ratio",
                "image transfer, base on both: link bytes / bytes of the layers the worker lacks",
                "ratio",
                "<= 1.05",
                R["delta_ratio"],
                statistics.median(R["delta_ratio"]) <= 1.05,
                note="denominator: those layers' tars as docker save emits them; the link counts "
                "TCP/IP and ACKs both ways",
            ),
            info("image_delta_bytes", "  ... bytes on the link", "bytes", [float(x) for x in R["delta_link_bytes"]]),
            info(
                "image_delta_lacking",
                "  ... bytes of the layers the worker lacks",
                "bytes",
                [float(x) for x in R["delta_lacking_bytes"]],
            ),
            info("image_delta_stage_s", "  ... image stage time", "s", R["delta_stage_s"]),
        ]
    if R.get("delta_vs_load"):
        F += [
            Figure(
                "image_delta_vs_load",
                "image transfer, base on both: image stage / docker load of the same bytes alone",
                "ratio",
                "<= 1.50",
                R["delta_vs_load"],
                statistics.median(R["delta_vs_load"]) <= 1.5,
                note="denominator: docker load -i, timed on the worker, of the archive the stage sends "
                "(made by its own sender, page-cached on the worker's disk); issue 40 item 7",
            ),
            info("image_delta_load_s", "  ... docker load of those bytes alone", "s", R["delta_load_s"]),
        ]
    return F
