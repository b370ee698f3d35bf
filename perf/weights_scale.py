"""Weights at an owner's scale (issue 40 item 1): `python -m perf.weights_scale` on the testbed that
is up, the pair or a four-host one (`make bench-nodes` brings those up). WEIGHTS_MB sets the
repository's size (default 2048: several shards on a two-core testbed; an owner's are 60-400 GB).

The repository: random safetensors shards (incompressible) on a hub of the bench's own on the
controller (perf/testbed.scale_hub), reached through a copy of the testbed's inventory whose
`hf_endpoint` names it; staged with `sparkcluster weights pull` (the same stage as `up`: download
once on the head, then one stream to the workers that lack files, along the chain when two or
more do, each file verified there). Per repetition (at most MAX_REPS; the page cache dropped
before every transfer, `/proc/sys/vm/drop_caches`, where permitted, else said in the details):
- hub -> head: every node emptied, one pull; the download's own seconds (its line) and the hub's
  bytes (fetched once: hub bytes / size = 1.0);
- head -> every worker (with three: along the chain): the workers emptied, one pull;
- head -> one worker: that worker emptied, one pull. A replication's time runs from its first byte
  on the first worker's links (control and data plane, sampled every 20 ms) to the CLI's line saying the files were
  received and verified there (verification included);
- the baselines over the same links: `tar | ssh | tar` of the same files (the blobs folder) from
  the head to a throwaway sshd on each worker's control address, into the same filesystem as the
  HF cache (three workers: three such pipelines at once, as an owner would script it); from the
  controller to the head through the testbed's sshd for the hub's leg;
- the physical limits, measured in the same run: each link's rate with one raw TCP stream (Python,
  random bytes, the receiver's first byte to end of stream; a single worker's link is the control
  link, a chain's hops are the addresses the pull's notes name) and each receiving disk's write rate
  (`dd` with direct I/O and a final fsync, in the HF cache's filesystem; without direct I/O where
  the filesystem refuses it, said in the details);
- a replication cut mid-way: one worker emptied, its stream's receiver killed (as a link that
  drops) once 60 % of the bytes are in (the sender alternates four files: with eight shards or
  more the first four are whole by then, with four none is); the next pull's bytes on the link
  / the bytes of the files not yet complete at the cut (budget <= 1.05: nothing complete is sent
  again).
Budgets (issue 40): replication throughput >= 1.5x `tar | ssh | tar` and >= 0.8 of min(link,
disk), three workers / one <= 1.2. The hub's leg is shown against the same, not judged: the hub is
the testbed's stand-in (a Python server), not sparkcluster.
What the testbed bounds: its hosts are namespaces of one machine, sharing its cores and its one
disk, so every "link" is a veth through the same kernel and every disk is the same disk; the chain's
workers write that one disk at once, which the three / one ratio pays for and a Spark's would not.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import threading
import time
from contextlib import ExitStack
from pathlib import Path

from perf import testbed
from perf.cli import CLI
from perf.counters import Sampler
from perf.figures import Figure, at_least_median, at_most_median, info, say
from perf.image import Baseline
from perf.session import standalone

SIZE_MB = int(os.environ.get("WEIGHTS_MB", "2048"))
PROFILE = "bench-weights-scale"
MAX_REPS = 3
HEAD = "spark-head"
REPL_RATIO, LIMIT_FRACTION, CHAIN_RATIO, RESUME_RATIO = 1.5, 0.8, 1.2, 1.05
RAW_MAX = 1 << 30  # bytes a raw TCP stream and a disk test write
# `weights pull`'s note for a worker reached along the chain: which addresses its hop used
# what `pgrep -f` sees of a chain's last receiver (sparkcluster/programs: the program's name and
# arguments, then its bundle): the weights' receiver with its incoming folder, no next hop after it
LEAF_RECEIVER = "^python3 -c .* sparkcluster[.]programs[.]weights_receive [^ ]+ [^ ]+ [^ ]+ [^ =]{40}"
CHAIN_NOTE = re.compile(r"^(\S+): received from (\S+) along the chain \((\S+) -> (\S+)\)", re.M)

# one connection accepted, everything read and dropped; prints bytes and seconds from the first byte
RAW_RECV = r"""
import socket, sys, time
s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen(1)
print("@@port %d" % s.getsockname()[1], file=sys.stderr, flush=True)
c, _ = s.accept(); buf = bytearray(1 << 22); n, t0 = 0, None
while True:
    k = c.recv_into(buf)
    if not k:
        break
    if t0 is None:
        t0 = time.monotonic()
    n += k
print("%d %.6f" % (n, time.monotonic() - (t0 or time.monotonic())), flush=True)
"""
RAW_SEND = r"""
import os, socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), source_address=(sys.argv[3], 0))
b, left = os.urandom(1 << 22), int(sys.argv[4])
while left:
    left -= s.send(b[: min(left, len(b))])
s.shutdown(socket.SHUT_WR); s.recv(1)
"""


def drop_caches() -> bool:
    """The machine's page cache dropped (every testbed host shares it); False where not permitted."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


class Scale:
    def __init__(self, s, endpoint: str, files: Path):
        self.s, self.tb, self.files, self.endpoint = s, s.tb, files, endpoint
        self.hosts = tuple(s.tb.hosts)
        self.workers = [h for h in self.hosts if h != HEAD]
        # beside the testbed's own: its paths (ssh_config, keys) are relative to the inventory's
        # folder (a copy in the session's tmp dir named an ssh_config that is not there); measure()
        # removes it
        inv = Path(s.tb.inventory).with_name(f".bench-weights-scale-{s.workdir.name}.toml")
        self.inventory = inv
        text = Path(s.tb.inventory).read_text()
        inv.write_text(re.sub(r"(?m)^hf_endpoint = .*$", f'hf_endpoint = "{endpoint}"', text))
        self.sc = CLI(s.tb, s.workdir, hosts=self.hosts, inventory=inv)
        profiles = s.workdir / "bench-profiles"
        profiles.mkdir(exist_ok=True)
        src = (testbed.PROFILES / "testbed.toml").read_text()
        (profiles / f"{PROFILE}.toml").write_text(re.sub(r"(?m)^model = .*$", f'model = "{testbed.SCALE}"', src))
        self.sc.env["SPARKCLUSTER_PROFILES"] = testbed.profiles_env(profiles)
        self.cache = testbed.hf_cache()
        self.repo_dir = f"{self.cache}/hub/models--{testbed.SCALE.replace('/', '--')}"
        self.size = testbed.hub_stats(endpoint)["repos"][testbed.SCALE]["size"]
        self.dropped: list[bool] = []
        self.hops: dict[tuple[str, str], tuple[str, str]] = {}  # (src, dst) -> (src IP, dst IP) of the chain
        self.ip = {n.name: str(n.control_ip) for n in s.inv.nodes}
        # the first worker's links, control and data plane: a chain's first hop may take a subnet
        # the head and it share rather than the control link (as `up` sends it)
        first = s.inv.node(self.workers[0])
        self.sampler = Sampler(s.tb.pid(first.name), [first.control_if, *first.netdevs], [testbed.lan_veth(first.name)])

    # -- helpers
    def empty(self, hosts) -> None:
        for h in hosts:
            self.tb.sh(h, f"rm -rf {shlex.quote(self.repo_dir)}")
        self.dropped.append(drop_caches())

    def pull(self, check: bool = True):
        return self.sc("weights", "pull", "--profile", PROFILE, timeout=7200, merged=True, check=check)

    def replication_s(self, r) -> float:
        """First byte on the first worker's links to the line saying the last worker's files were
        received and verified."""
        win = self.sampler.window(r.t0, r.t1)
        ends = [t for t, line in r.lines if "verified" in line and ("sent to" in line or "received from" in line)]
        if win is None or not ends:
            raise SystemExit(f"bench: no replication seen in this pull\n{r.stderr[-3000:]}")
        return max(ends) - win[0]

    # -- ours
    def hub_to_head(self) -> tuple[float, float]:
        """(seconds of the download as the stage states it, hub bytes / size)."""
        self.empty(self.hosts)
        before = testbed.hub_stats(self.endpoint)["bytes_served"]
        r = self.pull()
        m = re.search(r"downloaded ([\d.]+) GB in ([\d.]+)s", r.stderr)
        if not m:
            raise SystemExit(f"bench: the pull downloaded nothing\n{r.stderr[-3000:]}")
        return float(m.group(2)), (testbed.hub_stats(self.endpoint)["bytes_served"] - before) / self.size

    def to_workers(self, workers: list[str]) -> float:
        self.empty(workers)
        with self.sampler:
            r = self.pull()
        # a chain's hops as the pull chose them (a shared data-plane subnet, else the control IPs)
        for dst, src, sip, dip in CHAIN_NOTE.findall(r.stderr):
            self.hops[(src, dst)] = (sip, dip)
        return self.replication_s(r)

    # -- theirs
    def tar_ssh_tar(self, baselines: dict[str, Baseline]) -> float:
        """The blobs from the head to each worker of `baselines` at once, each its own tar | ssh | tar."""
        self.dropped.append(drop_caches())
        dest = f"{self.cache}/.sparkcluster-bench-tar"
        for w in baselines:
            self.tb.sh(w, f"rm -rf {dest} && mkdir -p {dest}")
        pipes = "".join(
            f"(tar -C {shlex.quote(self.repo_dir)}/blobs -cf - . | {b.ssh} tar -C {dest} -xf -) & pids+=($!); "
            for b in baselines.values()
        )
        t0 = time.monotonic()
        self.tb.sh(
            HEAD,
            f'set -o pipefail; pids=(); {pipes}rc=0; for p in "${{pids[@]}}"; do wait $p || rc=1; done; exit $rc',
            timeout=7200,
        )
        took = time.monotonic() - t0
        for w in baselines:
            self.tb.sh(w, f"rm -rf {dest}", check=False)
        return took

    def tar_ssh_tar_hub(self) -> float:
        """The repository's files from the controller to the head through the testbed's sshd."""
        self.dropped.append(drop_caches())
        dest = f"{self.cache}/.sparkcluster-bench-tar"
        ssh = shlex.join(self.tb.ssh_argv(HEAD))
        t0 = time.monotonic()
        subprocess.run(
            [
                "bash",
                "-c",
                f"set -o pipefail; tar -C {shlex.quote(str(self.files))} -cf - . | {ssh} "
                + shlex.quote(f"rm -rf {dest} && mkdir -p {dest} && tar -C {dest} -xf -"),
            ],
            check=True,
            timeout=7200,
        )
        took = time.monotonic() - t0
        self.tb.sh(HEAD, f"rm -rf {dest}", check=False)
        return took

    # -- the physical limits
    def link(self, src: str | None, src_ip: str, dst: str, dst_ip: str) -> float:
        """Bytes a second of one raw TCP stream from `src` (None: the controller) to `dst`."""
        n = min(self.size, RAW_MAX)
        recv = subprocess.Popen(
            self.tb.nsenter_argv(dst) + ["python3", "-c", RAW_RECV, dst_ip],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            port = int(recv.stderr.readline().split()[1])
            send = ["python3", "-c", RAW_SEND, dst_ip, str(port), src_ip, str(n)]
            subprocess.run((self.tb.nsenter_argv(src) if src else []) + send, check=True, timeout=600)
            got, secs = recv.communicate(timeout=60)[0].split()
        finally:
            if recv.poll() is None:
                recv.kill()
        return int(got) / float(secs)

    def disk(self, host: str) -> float:
        """Bytes a second written to `host`'s HF cache filesystem with direct I/O and a final fsync."""
        count = min(self.size, RAW_MAX) // (4 << 20)
        f = f"{self.cache}/.sparkcluster-bench-dd"
        direct = True
        self.dropped.append(drop_caches())
        t0 = time.monotonic()
        r = self.tb.sh(
            host, f"dd if=/dev/zero of={f} bs=4M count={count} oflag=direct conv=fsync", check=False, timeout=900
        )
        if r.returncode != 0:  # a filesystem without O_DIRECT (tmpfs, some overlays)
            direct = False
            t0 = time.monotonic()
            self.tb.sh(host, f"dd if=/dev/zero of={f} bs=4M count={count} conv=fsync", timeout=900)
        took = time.monotonic() - t0
        self.tb.sh(host, f"rm -f {f}", check=False)
        self.s.details.setdefault("disk_direct_io", {})[host] = direct
        return count * (4 << 20) / took

    # -- a cut replication
    def resume(self) -> tuple[int, int]:
        """(bytes on the link of the pull after a cut, bytes of the files not complete at the cut)."""
        w = self.workers[0]
        self.empty([w])
        inc = f"{self.repo_dir}/.sparkcluster-incoming"
        if len(list(self.files.glob("*.safetensors"))) < 2:
            raise SystemExit("bench: a cut mid-way needs two shards or more (WEIGHTS_MB above 512)")
        cut = threading.Event()

        def watch():
            # the sender alternates the chunks of four files (programs/weights_send): the cut comes
            # once 60 % of the bytes are in, where the first four shards are whole when there are
            # eight or more (WEIGHTS_MB 4096), and none is with four (the default 2048: then every
            # file is sent again, and the figure says only that nothing whole was)
            while not cut.is_set():
                out = self.tb.sh(w, f"stat -c %s {inc}/* 2>/dev/null || true", check=False).stdout
                if sum(int(x) for x in out.split()) >= 0.6 * self.size:
                    # the link drops: the stream's last receiver ends, its files cut where they were
                    # (the weights' receiver that relays to no next hop: its last argument is its
                    # incoming folder, then comes its bundle, base64 with no "=" until its end)
                    self.tb.sh(w, f"pkill -9 -f {shlex.quote(LEAF_RECEIVER)} || true", check=False)
                    cut.set()
                time.sleep(0.05)

        t = threading.Thread(target=watch, daemon=True)
        t.start()
        self.pull(check=False)
        cut.set()
        t.join()
        held = self.tb.sh(w, f"stat -c %s {self.repo_dir}/blobs/* 2>/dev/null || true", check=False).stdout.split()
        left = self.size - sum(int(x) for x in held)
        if left <= 0:
            raise SystemExit(f"bench: the cut left {left:,} of {self.size:,} bytes to send: not mid-way")
        with self.sampler:
            r = self.pull()
        link, _ = self.sampler.delta(r.t0, r.t1)
        return link, left


def measure(s) -> None:
    with testbed.scale_hub(SIZE_MB) as (endpoint, files):
        x = Scale(s, endpoint, files)
        say(f"weights at scale: {x.size / 1e9:.2f} GB, {len(x.workers)} worker(s), hub {endpoint}")
        s.details["weights_scale"] = {"bytes": x.size, "workers": x.workers}
        s.rec("ws_size", x.size)
        s.rec("ws_workers", x.workers)
        ip = x.ip
        try:
            with ExitStack() as stack:
                bases = {w: stack.enter_context(Baseline(s.tb, ip[HEAD], ip[w], w)) for w in x.workers}
                for i in range(min(s.reps, MAX_REPS)):
                    rep(s, x, bases, i)
            link, left = x.resume()
            s.rec("ws_resume", [link, left])
            say(f"  cut mid-way, then resumed: {link:,} B on the link for {left:,} B left")
        finally:
            for h in x.hosts:  # the scale repository off every node's HF cache: several GB each
                s.tb.sh(h, f"rm -rf {shlex.quote(x.repo_dir)}", check=False)
            x.inventory.unlink(missing_ok=True)
        s.details["page_cache_dropped"] = all(x.dropped)
        if not all(x.dropped):
            say("  the page cache could not be dropped between runs (/proc/sys/vm/drop_caches refused)")


def rep(s, x: Scale, bases: dict[str, Baseline], i: int) -> None:
    """One repetition: ours and theirs alternate in order; the limits measured once per repetition."""
    one, chain = x.workers[:1], x.workers
    steps = {
        "hub": lambda: s.rec("ws_hub", x.hub_to_head()),
        "one": lambda: s.rec("ws_one_s", x.to_workers(one)),
        "tar_one": lambda: s.rec("ws_tar_one_s", x.tar_ssh_tar({w: bases[w] for w in one})),
        "tar_hub": lambda: s.rec("ws_tar_hub_s", x.tar_ssh_tar_hub()),
    }
    if len(chain) > 1:
        steps["all"] = lambda: s.rec("ws_all_s", x.to_workers(chain))
        steps["tar_all"] = lambda: s.rec("ws_tar_all_s", x.tar_ssh_tar(bases))
    order = (
        ["hub", "one", "tar_one", "tar_hub", "all", "tar_all"]
        if i % 2 == 0
        else ["hub", "tar_one", "one", "tar_hub", "tar_all", "all"]
    )
    for k in order:
        if k in steps:
            steps[k]()
    w1 = one[0]
    s.rec(
        "ws_limits",
        {
            "hub_link": x.link(None, testbed.HUB_IP, HEAD, testbed.lan_ip(HEAD)),
            "head_disk": x.disk(HEAD),
            # a single worker's stream takes the control link; a chain's hops, what the pull chose
            f"link {HEAD}->{w1}": x.link(HEAD, x.ip[HEAD], w1, x.ip[w1]),
            **{f"chain {a}->{b}": x.link(a, sip, b, dip) for (a, b), (sip, dip) in x.hops.items()},
            **{f"disk {w}": x.disk(w) for w in chain},
        },
    )
    say(
        f"  #{i}: hub->head {x.size / s.last('ws_hub')[0] / 1e6:.0f} MB/s; "
        f"head->one {x.size / s.last('ws_one_s') / 1e6:.0f} MB/s "
        f"(tar|ssh|tar {x.size / s.last('ws_tar_one_s') / 1e6:.0f})"
        + (f"; head->{len(chain)} {x.size / s.last('ws_all_s') / 1e6:.0f} MB/s" if len(chain) > 1 else "")
        + "; limits "
        + ", ".join(f"{k} {v / 1e6:.0f} MB/s" for k, v in s.last("ws_limits").items())
    )


def figures(R: dict) -> list[Figure]:
    if not R.get("ws_one_s"):
        return []
    size, lim = R["ws_size"][0], R["ws_limits"]
    first = R["ws_workers"][0][0]  # the worker a single replication goes to (the chain's first)

    def mbps(secs):
        return [size / t / 1e6 for t in secs]

    def per(a, b, f):
        return [f(x, y) for x, y in zip(a, b)]

    one_limit = [min(L[f"link spark-head->{first}"], L[f"disk {first}"]) for L in lim]
    hub_s = [h[0] for h in R["ws_hub"]]
    once = [h[1] for h in R["ws_hub"]]
    F = [
        Figure(
            "ws_hub_once",
            "weights at scale, hub -> head: hub bytes / repository size (fetched once)",
            "ratio",
            "1.0",
            once,
            all(abs(x - 1) < 0.01 for x in once),
        ),
        info("ws_hub_mbps", "  ... hub -> head (the download, verified)", "MB/s", mbps(hub_s)),
        info(
            "ws_hub_vs_tar",
            "  ... / tar-ssh-tar from the controller (the hub is the testbed's stand-in: not judged)",
            "ratio",
            per(R["ws_tar_hub_s"], hub_s, lambda t, h: t / h),
        ),
        info(
            "ws_hub_vs_limit",
            "  ... / min(controller-head link, head disk)",
            "ratio",
            per(hub_s, lim, lambda h, L: size / h / min(L["hub_link"], L["head_disk"])),
        ),
        at_least_median(
            "ws_one_vs_tar",
            "weights, head -> one worker: throughput / tar-ssh-tar",
            REPL_RATIO,
            per(R["ws_tar_one_s"], R["ws_one_s"], lambda t, o: t / o),
        ),
        at_least_median(
            "ws_one_vs_limit",
            "weights, head -> one worker: throughput / min(link, disk)",
            LIMIT_FRACTION,
            per(R["ws_one_s"], one_limit, lambda o, L: size / o / L),
        ),
        info("ws_one_mbps", "  ... head -> one worker (received and verified)", "MB/s", mbps(R["ws_one_s"])),
        info("ws_tar_one_mbps", "  ... tar-ssh-tar, head -> one worker", "MB/s", mbps(R["ws_tar_one_s"])),
        info(
            "ws_link_one",
            "  ... link head -> worker, one raw TCP stream",
            "MB/s",
            [L[f"link spark-head->{first}"] / 1e6 for L in lim],
        ),
        info(
            "ws_disk_one",
            "  ... the worker's disk, direct I/O + fsync",
            "MB/s",
            [L[f"disk {first}"] / 1e6 for L in lim],
        ),
    ]
    if R.get("ws_all_s"):
        n = len(R["ws_workers"][0])
        all_limit = [min(v for k, v in L.items() if k.startswith(("chain ", "disk "))) for L in lim]
        F += [
            at_most_median(
                "ws_all_vs_one",
                f"weights, head -> {n} workers along the chain / head -> one (time)",
                CHAIN_RATIO,
                per(R["ws_all_s"], R["ws_one_s"], lambda a, o: a / o),
            ),
            at_least_median(
                "ws_all_vs_tar",
                f"weights, head -> {n} workers: throughput / {n} tar-ssh-tar at once",
                REPL_RATIO,
                per(R["ws_tar_all_s"], R["ws_all_s"], lambda t, a: t / a),
            ),
            at_least_median(
                "ws_all_vs_limit",
                f"weights, head -> {n} workers: throughput / min(every hop's link, every disk)",
                LIMIT_FRACTION,
                per(R["ws_all_s"], all_limit, lambda a, L: size / a / L),
            ),
            info("ws_all_mbps", f"  ... head -> {n} workers (each received and verified)", "MB/s", mbps(R["ws_all_s"])),
            info("ws_tar_all_mbps", f"  ... {n} tar-ssh-tar at once", "MB/s", mbps(R["ws_tar_all_s"])),
        ]
    if R.get("ws_resume"):
        resumed = [a / b for a, b in R["ws_resume"]]
        F.append(
            Figure(
                "ws_resume",
                "weights cut mid-way, the next pull: link bytes / bytes of the files not complete at the cut",
                "ratio",
                f"<= {RESUME_RATIO}",
                resumed,
                all(x <= RESUME_RATIO for x in resumed),
            )
        )
    return F


def main(argv: list[str] | None = None) -> int:
    return standalone(
        "weights_scale",
        "Weights at scale (issue 40 item 1): hub -> head, head -> one worker, head -> three along the chain, each "
        "against tar-ssh-tar and the link's and disk's limits. WEIGHTS_MB sets the size (default 2048).",
        measure,
        figures,
        argv,
    )


if __name__ == "__main__":
    raise SystemExit(main())
