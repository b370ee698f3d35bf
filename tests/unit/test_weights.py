"""The weights logic: resolve against the testbed hub, the node program on a local cache, command
lines against hostile input, and a loopback replication through the image transfer's programs."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shlex
import subprocess
import time
from pathlib import Path

import pytest
from conftest import STREAM_KEY

from sparkcluster.errors import InputError
from sparkcluster.movement import hfcache, transfer
from sparkcluster.programs.weights_receive import RECEIVED
from tests.testbed.hub import GATED, GRANTED_TOKEN, REFUSED_TOKEN, TINY, serve_in_thread

KEY = f"{STREAM_KEY}\n"  # a stream's key, the first line of each end's stdin (movement/stream)


def keyed(p: subprocess.Popen, close: bool = True) -> subprocess.Popen:
    """The stream key written to a started end's stdin (a pipe), which is then closed."""
    p.stdin.write(KEY)
    p.stdin.flush()
    if close:
        p.stdin.close()
    return p


def sh(cmd: str, stdin: str = "", timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", cmd], input=stdin, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tiny")
    (d / "config.json").write_text('{"model_type": "llama"}\n')
    (d / "model.safetensors").write_bytes(os.urandom(2 * 2**20 + 5))
    (d / "sub").mkdir()
    (d / "sub" / "extra.txt").write_text("x\n")
    return d


@pytest.fixture(scope="module")
def hub(model, tmp_path_factory):
    running = serve_in_thread(model, tmp_path_factory.mktemp("state"), synthetic_mb=0)
    yield running.hub, running.endpoint
    running.server.shutdown()
    running.server.server_close()


def resolve(ep: str, repo: str, rev: str = "main", token: str = "") -> hfcache.Manifest:
    r = sh(hfcache.resolve_command(ep, repo, rev), token)
    assert r.returncode == 0, r.stderr
    return hfcache.parse_resolve(r.stdout, repo, rev, ep)


def test_resolve_gives_commit_sizes_and_hashes(hub, model):
    h, ep = hub
    m = resolve(ep, TINY)
    assert m.commit == h.repos[TINY].sha
    by = {f.path: f for f in m.files}
    big = (model / "model.safetensors").read_bytes()
    assert by["model.safetensors"].blob == hashlib.sha256(big).hexdigest() and by["model.safetensors"].lfs
    assert by["sub/extra.txt"].size == 2 and not by["sub/extra.txt"].lfs
    assert m.size == sum(p.stat().st_size for p in model.rglob("*") if p.is_file())
    assert resolve(ep, TINY, m.commit).commit == m.commit


@pytest.mark.parametrize(
    "repo,rev,token,words",
    [
        ("nobody/none", "main", "", "does not exist"),
        (TINY, "v9", "", "revision 'v9' does not exist"),
        (GATED, "main", "", "no HF token"),
        (GATED, "main", REFUSED_TOKEN, "has no access"),
    ],
)
def test_resolve_errors_are_one_line_with_a_fix(hub, repo, rev, token, words):
    _, ep = hub
    with pytest.raises(InputError) as e:
        resolve(ep, repo, rev, token)
    assert words in e.value.message and e.value.fix
    if repo == GATED:
        assert f"{ep}/{GATED}" in e.value.fix  # where the licence is accepted


def test_gated_with_a_granted_token(hub):
    _, ep = hub
    assert resolve(ep, GATED, token=GRANTED_TOKEN).files


def test_unreachable_hub():
    with pytest.raises(InputError, match="cannot reach the hub"):
        resolve("http://127.0.0.1:9", TINY)


def _place(cache: Path, m: hfcache.Manifest, model: Path, skip: str = "") -> None:
    """Put the files where a download puts them (blobs named by hash), then `check` links them."""
    blobs = Path(hfcache.blobs_dir(str(cache), m.repo))
    blobs.mkdir(parents=True, exist_ok=True)
    for f in m.files:
        if f.path != skip:
            (blobs / f.blob).write_bytes((model / f.path).read_bytes())


def check(cache: Path, m: hfcache.Manifest, hash_unverified: bool = True) -> dict:
    r = sh(hfcache.check_command(str(cache)), m.request(hash_unverified))
    assert r.returncode == 0, r.stderr
    return hfcache.parse_json(r.stdout)


def test_check_links_a_complete_snapshot_and_then_trusts_its_stamp(hub, model, tmp_path):
    _, ep = hub
    m = resolve(ep, TINY)
    _place(tmp_path, m, model)
    got = check(tmp_path, m)
    assert got["missing"] == [] and got["present_bytes"] == m.size and got["free"] > 0
    snap = tmp_path / "hub" / hfcache.repo_folder(TINY) / "snapshots" / m.commit
    assert (snap / "sub" / "extra.txt").read_text() == "x\n"
    assert (snap.parent.parent / "refs" / "main").read_text() == m.commit
    # unchanged files are trusted without hashing: fast enough for "< 1 s when present"
    assert check(tmp_path, m, hash_unverified=False)["missing"] == []
    st = sh(hfcache.status_command(str(tmp_path)))
    [s] = hfcache.parse_json(st.stdout)
    assert s["repo"] == TINY and s["commit"] == m.commit and s["verified"] and s["refs"] == ["main"]


def test_check_replaces_a_corrupted_file(hub, model, tmp_path):
    _, ep = hub
    m = resolve(ep, TINY)
    _place(tmp_path, m, model)
    check(tmp_path, m)
    big = next(f for f in m.files if f.lfs)
    p = Path(hfcache.blobs_dir(str(tmp_path), TINY)) / big.blob
    data = bytearray(p.read_bytes())
    data[1000] ^= 1  # one byte changed
    p.write_bytes(bytes(data))
    got = check(tmp_path, m)
    assert got["corrupt"] == [big.blob] and got["missing"] == [big.blob] and not p.exists()


def test_rehash_finds_a_change_that_kept_size_and_mtime(hub, model, tmp_path):
    _, ep = hub
    m = resolve(ep, TINY)
    _place(tmp_path, m, model)
    check(tmp_path, m)
    big = next(f for f in m.files if f.lfs)
    p = Path(hfcache.blobs_dir(str(tmp_path), TINY)) / big.blob
    st = p.stat()
    data = bytearray(p.read_bytes())
    data[3] ^= 1
    p.write_bytes(bytes(data))
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert check(tmp_path, m)["missing"] == []  # the stamp is trusted
    r = sh(hfcache.check_command(str(tmp_path)), m.request(rehash=True))
    assert hfcache.parse_json(r.stdout)["corrupt"] == [big.blob]


def test_check_says_what_is_missing(hub, model, tmp_path):
    _, ep = hub
    m = resolve(ep, TINY)
    _place(tmp_path, m, model, skip="model.safetensors")
    got = check(tmp_path, m)
    big = next(f for f in m.files if f.lfs)
    assert got["missing"] == [big.blob] and got["missing_bytes"] == big.size
    # no snapshot is linked while a file is missing: a partial snapshot is never served
    assert not (tmp_path / "hub" / hfcache.repo_folder(TINY) / "snapshots").exists()


def test_replication_over_loopback_sends_only_the_missing_files(hub, model, tmp_path):
    _, ep = hub
    m = resolve(ep, TINY)
    head, worker = tmp_path / "head", tmp_path / "worker"
    _place(head, m, model)
    check(head, m)
    _place(worker, m, model, skip="model.safetensors")
    need = check(worker, m)["missing"]
    recv = keyed(
        subprocess.Popen(
            ["bash", "-c", hfcache.receive_command(str(worker), TINY, "127.0.0.1", "127.0.0.1")],
            stdin=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    )
    port = int(recv.stderr.readline().split()[1])
    snd = sh(hfcache.send_command(str(head), TINY, need, "127.0.0.1", port, "127.0.0.1"), stdin=KEY)
    assert snd.returncode == 0, snd.stderr
    assert recv.wait(timeout=30) == 0
    got = check(worker, m)
    assert got["missing"] == [] and got["adopted"] == 1
    snap = worker / "hub" / hfcache.repo_folder(TINY) / "snapshots" / m.commit
    assert (snap / "model.safetensors").read_bytes() == (model / "model.safetensors").read_bytes()


def test_a_damaged_delivery_is_not_adopted(hub, model, tmp_path):
    _, ep = hub
    m = resolve(ep, TINY)
    big = next(f for f in m.files if f.lfs)
    _place(tmp_path, m, model, skip="model.safetensors")
    inc = Path(hfcache.incoming_dir(str(tmp_path), TINY))
    inc.mkdir(parents=True)
    (inc / big.blob).write_bytes((model / "model.safetensors").read_bytes()[:-1])  # cut short
    got = check(tmp_path, m)
    assert got["missing"] == [big.blob] and got["adopted"] == 0 and not inc.exists()


def test_rm_removes_the_snapshot_and_its_blobs(hub, model, tmp_path):
    _, ep = hub
    m = resolve(ep, TINY)
    _place(tmp_path, m, model)
    check(tmp_path, m)
    r = sh(hfcache.rm_command(str(tmp_path), TINY, m.commit))
    assert r.returncode == 0, r.stderr
    assert hfcache.parse_json(r.stdout)["freed"] == m.size
    assert not (tmp_path / "hub" / hfcache.repo_folder(TINY)).exists()


@pytest.mark.parametrize("bad", ["../etc", "a/b/c", "a b/c", "a/$(id)", "a/b;rm", "-x/y", "a/.."])
def test_hostile_repo_ids_are_refused(bad):
    with pytest.raises(InputError):
        hfcache.repo_folder(bad)


@pytest.mark.parametrize("bad", ["../x", "a/../b", "$(id)", "a b", "-rf", "x\n"])
def test_hostile_revisions_are_refused(bad):
    with pytest.raises(InputError):
        hfcache.check_revision(bad)


@pytest.mark.parametrize("bad", ["/etc/passwd", "../x", "a/../../x", "a//b", "a\nb", ""])
def test_hostile_file_paths_are_refused(bad):
    with pytest.raises(ValueError):
        hfcache.safe_path(bad)


def test_hostile_values_stay_quoted_in_commands():
    cmd = hfcache.download_command(
        "img:1", "/c ache/$(id)", "http://h;rm -rf /", hfcache.Manifest(TINY, "main", "a" * 40, ())
    )
    assert "HF_ENDPOINT=http://h;rm -rf /" in shlex.split(cmd.split("; ", 1)[1])
    with pytest.raises(ValueError):
        hfcache.send_command("/c", TINY, ["$(id)"], "1.2.3.4", 1, "1.2.3.5")
    with pytest.raises(InputError):
        hfcache.rm_command("/c", TINY, "main; rm -rf /")


@pytest.mark.parametrize(
    "path,blob,size",
    [
        ("../../etc/cron.d/x", "a" * 64, 1),
        ("ok.json", "$(id)", 1),
        ("ok.json", "a" * 40, -1),
        ("ok.json", "a" * 40, None),
    ],
)
def test_a_hostile_listing_from_the_hub_is_refused(path, blob, size):
    out = json.dumps({"sha": "c" * 40, "files": [{"path": path, "size": size, "blob": blob, "lfs": False}]})
    with pytest.raises(InputError):
        hfcache.parse_resolve(out, TINY, "main", "http://hub")


def test_a_5xx_or_unreachable_hub_is_hub_unavailable():
    for got in ({"error": "", "status": 503, "message": "down"}, {"error": "Unreachable", "status": 0, "message": "x"}):
        assert isinstance(hfcache.resolve_error(got, TINY, "main", "http://hub"), hfcache.HubUnavailable)
    assert not isinstance(
        hfcache.resolve_error({"error": "RepoNotFound", "status": 404}, TINY, "main", "http://hub"),
        hfcache.HubUnavailable,
    )


def _shards(tmp_path: Path, n: int = 3, size: int = 3 * 2**20 + 7) -> tuple[hfcache.Manifest, Path]:
    """A repository of `n` incompressible shards, on a head's cache as a download leaves it."""
    head = tmp_path / "head"
    blobs = Path(hfcache.blobs_dir(str(head), TINY))
    blobs.mkdir(parents=True)
    files = []
    for i in range(n):
        data = os.urandom(size)
        blob = hashlib.sha256(data).hexdigest()
        (blobs / blob).write_bytes(data)
        files.append(hfcache.File(f"model-{i + 1:05d}-of-{n:05d}.safetensors", size, blob, True))
    return hfcache.Manifest(TINY, "main", "c" * 40, tuple(files)), head


def _receive(worker: Path) -> tuple[subprocess.Popen, int]:
    recv = keyed(
        subprocess.Popen(
            ["bash", "-c", hfcache.receive_command(str(worker), TINY, "127.0.0.1", "127.0.0.1")],
            stdin=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    )
    return recv, int(recv.stderr.readline().split()[1])


def _sent(stderr: str) -> int:
    return max(int(line.split()[1]) for line in stderr.splitlines() if line.startswith("@@sent "))


def test_a_replication_cut_mid_way_keeps_the_complete_files_and_resends_only_the_rest(tmp_path):
    """Issue 40: the sender killed mid-way (paced by a cap so the cut lands between its first byte
    and its last); the worker's check adopts the files that arrived whole, drops the partial ones,
    and the next replication sends only what is still missing."""
    m, head = _shards(tmp_path, n=6, size=2**20 + 7)
    worker = tmp_path / "worker"
    need = check(worker, m)["missing"]
    assert len(need) == 6
    recv, port = _receive(worker)
    snd = keyed(
        subprocess.Popen(
            ["bash", "-c", hfcache.send_command(str(head), TINY, need, "127.0.0.1", port, "127.0.0.1", rate=4e6)],
            stdin=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
    )
    for line in snd.stderr:
        if line.startswith("@@sent ") and int(line.split()[1]) >= 2.5e6:
            os.killpg(snd.pid, 9)
            break
    snd.wait()
    assert recv.wait(timeout=30) == transfer.STREAM_CUT
    got = check(worker, m)
    assert 1 <= got["adopted"] < 6 and got["corrupt"] == []
    assert got["adopted"] + len(got["missing"]) == 6
    # the next run: only what is still missing goes, and then the snapshot is complete
    recv, port = _receive(worker)
    snd = sh(hfcache.send_command(str(head), TINY, got["missing"], "127.0.0.1", port, "127.0.0.1"), stdin=KEY)
    assert snd.returncode == 0 and recv.wait(timeout=30) == 0, snd.stderr
    assert _sent(snd.stderr) < got["missing_bytes"] + 100 * len(got["missing"]) + 100  # the files and their heads
    done = check(worker, m)
    assert done["missing"] == [] and done["adopted"] == len(got["missing"]) and done["present_bytes"] == m.size


def test_files_larger_than_a_chunk_arrive_whole_with_more_of_them_than_are_in_flight(tmp_path):
    """weights_send alternates the chunks of FILES files; each arrives byte for byte, hashed as it was
    written (the receiver's record), whatever its size against the chunk: none, one byte, a chunk's
    and more, an unaligned tail."""
    from sparkcluster.programs import weights_send

    sizes = [0, 1, weights_send.CHUNK, 2 * weights_send.CHUNK + 4097, 4096, 3 * 2**20 + 7, 11]
    head = tmp_path / "head"
    blobs = Path(hfcache.blobs_dir(str(head), TINY))
    blobs.mkdir(parents=True)
    data = {}
    for k, n in enumerate(sizes):
        d = os.urandom(n)
        name = hashlib.sha256(d).hexdigest() if k % 2 else hashlib.sha1(b"blob %d\0" % n + d).hexdigest()
        (blobs / name).write_bytes(d)
        data[name] = d
    worker = tmp_path / "worker"
    recv, port = _receive(worker)
    snd = sh(hfcache.send_command(str(head), TINY, list(data), "127.0.0.1", port, "127.0.0.1"), stdin=KEY)
    assert snd.returncode == 0 and recv.wait(timeout=60) == 0, snd.stderr + recv.stderr.read()
    inc = Path(hfcache.incoming_dir(str(worker), TINY))
    assert {p.name: p.read_bytes() for p in inc.iterdir() if p.name != RECEIVED} == data
    rec = [json.loads(x) for x in (inc / RECEIVED).read_text().splitlines()]
    assert sorted(r[0] for r in rec) == sorted(data) and all(r[0] == r[3] for r in rec)


def test_a_capped_replication_keeps_to_its_rate(tmp_path):
    """`replication_max_mb_s` (issue 40): the sender paces itself, so the stream never runs faster
    than the cap (a lower bound on its duration: a busy machine only makes it longer)."""
    m, head = _shards(tmp_path, n=2, size=2**20)
    worker = tmp_path / "worker"
    need = check(worker, m)["missing"]
    recv, port = _receive(worker)
    rate = 4e6
    cmd = hfcache.send_command(str(head), TINY, need, "127.0.0.1", port, "127.0.0.1", rate=rate)
    assert shlex.split(cmd)[-2] == "rate=4000000"  # the sender's last argument, before its bundle
    t0 = time.monotonic()
    snd = sh(cmd, stdin=KEY)
    took = time.monotonic() - t0
    assert snd.returncode == 0 and recv.wait(timeout=30) == 0, snd.stderr
    assert took >= _sent(snd.stderr) / rate
    assert check(worker, m)["missing"] == []


@pytest.mark.parametrize("bad", [0, -1.0])
def test_a_cap_is_a_positive_rate(bad):
    with pytest.raises(ValueError):
        transfer.rate_arg(bad)
    assert transfer.rate_arg(None) == []


def _incoming(cache: Path, files: dict[str, bytes]) -> Path:
    """What EXTRACT leaves from weights_send's stream of `files` (name -> bytes; a name may climb out
    of the sender's folder): the files in the incoming folder and its record of what it hashed."""
    src = cache / "src" / "a" / "b"
    src.mkdir(parents=True)
    for name, data in files.items():
        (src / name).write_bytes(data)
    recv, port = _receive(cache)
    names = base64.b64encode(b"".join(n.encode() + b"\0" for n in files)).decode()
    r = sh(
        f"cd {shlex.quote(str(src))} && "
        + transfer.keyed(f"echo {names} | base64 -d")
        + " | "
        + hfcache.py(hfcache.SEND, "127.0.0.1", str(port), "127.0.0.1"),
        stdin=KEY,
    )
    assert r.returncode == 0 and recv.wait(timeout=30) == 0, r.stderr
    return Path(hfcache.incoming_dir(str(cache), TINY))


def test_a_file_hashed_while_received_is_adopted_without_reading_it_again(tmp_path):
    """EXTRACT hashes each file as it writes it (issue 40: the read-back was 30 % of a replication);
    `check` trusts that record while the file keeps its size and mtime, and hashes it otherwise."""
    data = {n: os.urandom(4096 + n) for n in range(3)}
    blobs = {hashlib.sha256(d).hexdigest(): d for d in data.values()}
    m = hfcache.Manifest(
        TINY, "main", "c" * 40, tuple(hfcache.File(f"f{i}", len(d), b, True) for i, (b, d) in enumerate(blobs.items()))
    )
    inc = _incoming(tmp_path, blobs)
    rec = [json.loads(x) for x in (inc / RECEIVED).read_text().splitlines()]
    assert sorted(r[0] for r in rec) == sorted(blobs) and all(r[0] == r[3] for r in rec)
    # the proof that it is not read again: a byte changed behind the record's back, size and mtime kept
    first, second, third = sorted(blobs)
    p = inc / first
    st = p.stat()
    p.write_bytes(bytes([blobs[first][0] ^ 0xFF]) + blobs[first][1:])  # a byte that differs, whatever it was
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    # a file changed after it was received (its mtime moved): hashed again, and dropped
    st = (inc / second).stat()
    (inc / second).write_bytes(bytes([blobs[second][0] ^ 0xFF]) + blobs[second][1:])
    os.utime(inc / second, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # past a coarse clock's tick
    got = check(tmp_path, m)
    assert got["adopted"] == 2 and got["missing"] == [second] and not inc.exists()


def test_the_extractor_writes_only_blobs_inside_the_incoming_folder(tmp_path):
    good = os.urandom(100)
    name = hashlib.sha256(good).hexdigest()
    inc = _incoming(tmp_path, {"../../escaped": b"x", "config.json": b"{}", name: good})
    assert sorted(p.name for p in inc.iterdir()) == sorted([name, RECEIVED])
    assert [p.relative_to(tmp_path) for p in tmp_path.rglob("escaped")] == [Path("src/escaped")]  # the source


def test_the_sender_alternates_the_chunks_of_its_files_in_flight(tmp_path):
    """weights_send's stream (its records read here off the framing): at most FILES files open at
    once and that many while enough are left, each file's bytes in order and whole, then "E"."""
    import socket
    import struct

    from sparkcluster.programs import framing, weights_send

    folder = tmp_path / "blobs"
    folder.mkdir()
    data = {}
    for i in range(weights_send.FILES + 2):
        d = os.urandom(2 * weights_send.CHUNK + i)
        data[hashlib.sha256(d).hexdigest()] = d
        (folder / hashlib.sha256(d).hexdigest()).write_bytes(d)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    names = base64.b64encode(b"".join(n.encode() + b"\0" for n in data)).decode()
    snd = keyed(
        subprocess.Popen(
            [
                "bash",
                "-c",
                f"cd {shlex.quote(str(folder))} && "
                + transfer.keyed(f"echo {names} | base64 -d")
                + " | "
                + hfcache.py(hfcache.SEND, "127.0.0.1", str(srv.getsockname()[1]), "127.0.0.1"),
            ],
            stdin=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    )
    c, _ = srv.accept()
    f = c.makefile("rb")
    seal = framing.Seal(bytes.fromhex(STREAM_KEY))
    got, opened, widest, ended = {}, {}, 0, False
    while True:
        n = struct.unpack(">I", f.read(4))[0]
        frame = f.read(n)
        assert f.read(framing.TAG) == seal.tag(n, frame)  # each frame tagged, in sequence
        if not n:
            break
        kind, i, k = weights_send.HEAD.unpack(frame[: weights_send.HEAD.size])
        rest = frame[weights_send.HEAD.size :]
        assert len(rest) == k
        if kind == b"F":
            opened[i] = rest[8:].decode()
            got[opened[i]] = b""
            widest = max(widest, len(opened))
        elif kind == b"D":
            got[opened[i]] += rest
            if len(got[opened[i]]) == len(data[opened[i]]):
                del opened[i]
        else:
            ended = kind == b"E"
    f.close()
    c.close()  # the sender's end waits for the receiver to close
    assert snd.wait(timeout=30) == 0, snd.stderr.read()
    assert ended and not opened and widest == weights_send.FILES
    assert got == data


def test_a_relay_forwards_chunks_from_its_buffers_while_it_writes_its_own_copy(tmp_path):
    """Two receivers along a chain with files of several chunks: the relay sends each chunk on from
    the buffer it received it in (weights_receive.Forward), and both copies arrive whole, hashed."""
    m, head = _shards(tmp_path, n=3, size=9 * 2**20 + 5)
    tail_cache, relay_cache = tmp_path / "w2", tmp_path / "w1"
    tail, tport = _receive(tail_cache)
    relay = keyed(
        subprocess.Popen(
            [
                "bash",
                "-c",
                hfcache.receive_command(
                    str(relay_cache), TINY, "127.0.0.1", "127.0.0.1", transfer.next_hop("127.0.0.1", tport, "127.0.0.1")
                ),
            ],
            stdin=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    )
    rport = int(relay.stderr.readline().split()[1])
    need = [f.blob for f in m.files]
    snd = sh(hfcache.send_command(str(head), TINY, need, "127.0.0.1", rport, "127.0.0.1"), stdin=KEY)
    assert snd.returncode == 0, snd.stderr
    assert relay.wait(timeout=60) == 0 and tail.wait(timeout=60) == 0
    for cache in (relay_cache, tail_cache):
        done = check(cache, m)
        assert done["missing"] == [] and done["adopted"] == 3 and done["corrupt"] == []


@pytest.mark.parametrize("direct", [True, False])
def test_a_filesystem_without_direct_io_gets_the_files_through_the_page_cache(tmp_path, monkeypatch, direct):
    """weights_receive opens each file with O_DIRECT and writes its aligned chunks so; a filesystem
    that refuses O_DIRECT (EINVAL, as tmpfs before Linux 6.6) gets the same bytes through the page
    cache, and either way the unaligned tail, the record and the digest are the same."""
    import errno

    from sparkcluster.programs import weights_receive

    real = os.open

    def refusing(path, flags, *a):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(path, flags, *a)

    if not direct:
        monkeypatch.setattr(os, "open", refusing)
    data = os.urandom(2 * weights_receive.CHUNK + 3 * weights_receive.BUFFERED + 5)
    name = hashlib.sha256(data).hexdigest()
    inc = tmp_path / "inc"
    inc.mkdir()
    out = weights_receive.Out(str(inc), True)
    out.begin(7, name, len(data))
    f = out.open[7]
    for off in range(0, len(data), weights_receive.CHUNK):
        piece = data[off : off + weights_receive.CHUNK]
        c = out.chunk(len(piece))
        c.mv[:] = piece
        out.put(7, c)
    out.close()
    assert not direct or not f.direct  # the tail left direct I/O, where it was taken
    assert (inc / name).read_bytes() == data and out.err == ""
    rec = [json.loads(x) for x in (inc / RECEIVED).read_text().splitlines()]
    assert [(r[0], r[1], r[3]) for r in rec] == [(name, len(data), name)]


def test_a_relay_that_cannot_write_still_passes_the_whole_stream_on(tmp_path):
    """A relay whose own write fails (here its first file's part is a folder) says so, relays the
    rest unwritten and exits 1; the node after it gets every file."""
    m, head = _shards(tmp_path, n=3, size=5 * 2**20 + 1)
    tail_cache, relay_cache = tmp_path / "w2", tmp_path / "w1"
    need = [f.blob for f in m.files]
    (Path(hfcache.incoming_dir(str(relay_cache), TINY)) / (need[0] + ".part")).mkdir(parents=True)
    tail, tport = _receive(tail_cache)
    relay = keyed(
        subprocess.Popen(
            [
                "bash",
                "-c",
                hfcache.receive_command(
                    str(relay_cache), TINY, "127.0.0.1", "127.0.0.1", transfer.next_hop("127.0.0.1", tport, "127.0.0.1")
                ),
            ],
            stdin=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    )
    rport = int(relay.stderr.readline().split()[1])
    snd = sh(hfcache.send_command(str(head), TINY, need, "127.0.0.1", rport, "127.0.0.1"), stdin=KEY)
    assert snd.returncode == 0, snd.stderr
    assert relay.wait(timeout=60) == 1 and tail.wait(timeout=60) == 0
    assert "relayed, not written" in relay.stderr.read()
    done = check(tail_cache, m)
    assert done["missing"] == [] and done["adopted"] == 3
