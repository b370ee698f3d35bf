"""The testbed hub against the real huggingface_hub client, on loopback."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tests.testbed.hub import GATED, GRANTED_TOKEN, REFUSED_TOKEN, RETRAINED, SYNTHETIC, TINY, serve_in_thread

pytest.importorskip("huggingface_hub")


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tiny")
    (d / "config.json").write_text('{"model_type": "llama"}\n')
    (d / "tokenizer.json").write_text('{"version": "1.0"}\n')
    (d / "model.safetensors").write_bytes(_safetensors({"lm_head.weight": [6144, 256], "norm.weight": [17]}))
    return d


def _safetensors(shapes: dict[str, list[int]]) -> bytes:
    """A safetensors file of random BF16 tensors (3 MB and a few bytes with the fixture's shapes)."""
    header, data = {}, b""
    for name, shape in shapes.items():
        n = 2 * shape[0] * (shape[1] if len(shape) > 1 else 1)
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [len(data), len(data) + n]}
        data += os.urandom(n)
    head = json.dumps(header).encode()
    return struct.pack("<Q", len(head)) + head + data


@pytest.fixture(scope="module")
def hub(model, tmp_path_factory):
    running = serve_in_thread(model, tmp_path_factory.mktemp("state"), synthetic_mb=12, retrained=True)
    yield running.hub, running.endpoint
    running.server.shutdown()
    running.server.server_close()


def _client(endpoint: str, home: Path, code: str, token: str | None = None) -> subprocess.CompletedProcess:
    # a child process: huggingface_hub reads HF_ENDPOINT/HF_HOME once, at import
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_ENDPOINT=endpoint, HF_HOME=str(home), HF_HUB_DISABLE_TELEMETRY="1")
    if token:
        env["HF_TOKEN"] = token
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_snapshot_download_gives_the_standard_cache_layout(hub, model, tmp_path):
    h, ep = hub
    before = h.knobs.bytes_served
    r = _client(ep, tmp_path, f"from huggingface_hub import snapshot_download as s; print(s({TINY!r}))")
    assert r.returncode == 0, r.stderr
    snap = Path(r.stdout.strip().splitlines()[-1])
    assert snap.parent.parent.name == "models--sparkcluster--testbed-tiny"
    for f in model.iterdir():
        assert (snap / f.name).read_bytes() == f.read_bytes()
    big = (snap / "model.safetensors").resolve()
    assert big.name == hashlib.sha256((model / "model.safetensors").read_bytes()).hexdigest()
    assert h.knobs.bytes_served - before == sum(f.stat().st_size for f in model.iterdir())
    assert (snap.parent.parent / "refs" / "main").read_text() == h.repos[TINY].sha


def test_model_info_lists_sizes_and_lfs_sha256(hub, model, tmp_path):
    _, ep = hub
    code = (
        f"from huggingface_hub import HfApi; i = HfApi().model_info({TINY!r}, files_metadata=True); "
        "print(i.sha); [print(s.rfilename, s.size, s.lfs.sha256 if s.lfs else '-') for s in i.siblings]"
    )
    r = _client(ep, tmp_path, code)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split("\n")
    files = {ln.split()[0]: ln.split()[1:] for ln in lines[1:] if ln}
    assert files["model.safetensors"][1] == hashlib.sha256((model / "model.safetensors").read_bytes()).hexdigest()
    assert files["config.json"][1] == "-"


@pytest.mark.parametrize(
    "token,kind", [(None, "GatedRepoError"), (REFUSED_TOKEN, "GatedRepoError"), (GRANTED_TOKEN, "ok")]
)
def test_gated_repo_needs_a_granted_token(hub, tmp_path, token, kind):
    _, ep = hub
    code = (
        "from huggingface_hub import hf_hub_download\nfrom huggingface_hub.errors import GatedRepoError\n"
        f"try:\n    hf_hub_download({GATED!r}, 'config.json'); print('ok')\n"
        "except GatedRepoError as e:\n    print('GatedRepoError', e.response.status_code)\n"
    )
    r = _client(ep, tmp_path, code, token)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0] == kind
    if token is None:
        assert r.stdout.split()[1] == "401"
    elif kind != "ok":
        assert r.stdout.split()[1] == "403"


def test_missing_repo_revision_and_file(hub, tmp_path):
    _, ep = hub
    code = (
        "from huggingface_hub import HfApi, hf_hub_download\nfrom huggingface_hub import errors\n"
        "for f in (lambda: HfApi().model_info('nobody/none'), lambda: HfApi().model_info("
        f"{TINY!r}, revision='v9'), lambda: hf_hub_download({TINY!r}, 'nope.bin')):\n"
        "    try:\n        f()\n    except Exception as e:\n        print(type(e).__name__)\n"
    )
    r = _client(ep, tmp_path, code)
    assert r.stdout.split() == ["RepositoryNotFoundError", "RevisionNotFoundError", "RemoteEntryNotFoundError"]


def test_a_cut_download_resumes_with_range(hub, tmp_path):
    h, ep = hub
    h.set_knobs({"fail_after": 2**20, "fail_times": 1})
    r = _client(ep, tmp_path, f"from huggingface_hub import snapshot_download as s; print(s({SYNTHETIC!r}))")
    assert r.returncode == 0, r.stderr
    snap = Path(r.stdout.strip().splitlines()[-1])
    for f in h.repos[SYNTHETIC].files.values():
        assert hashlib.sha256((snap / f.path).read_bytes()).hexdigest() == f.sha256
    assert h.knobs.fail_times == 0
    assert any("resolve" in q for q in h.knobs.requests)


def test_start_hub_runs_a_process_with_knobs_and_stats(model, tmp_path):
    import socket

    from tests.testbed.hub import knobs, start_hub, stats, stop_hub

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    h = start_hub("127.0.0.1", port, model_dir=model, state_dir=tmp_path, synthetic_mb=0, timeout=60)
    try:
        st = stats(h.endpoint)
        assert st["repos"][TINY]["size"] == sum(f.stat().st_size for f in model.iterdir())
        assert knobs(h.endpoint, rate_bps=10**6)["bytes_served"] == 0
    finally:
        stop_hub(h.pid)


def test_knobs_fail_status_and_rate(hub, tmp_path):
    import time
    import urllib.error
    import urllib.request

    h, ep = hub
    url = f"{ep}/{TINY}/resolve/main/config.json"
    h.set_knobs({"fail_status": 500})
    try:
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(url, timeout=5)
        assert e.value.code == 500
    finally:
        h.set_knobs({"fail_status": None})
    h.set_knobs({"rate_bps": 2 * 2**20})
    try:
        t = time.monotonic()
        with urllib.request.urlopen(f"{ep}/{TINY}/resolve/main/model.safetensors", timeout=30) as r:
            n = len(r.read())
        assert time.monotonic() - t >= n / (2 * 2**20) * 0.8
    finally:
        h.set_knobs({"rate_bps": None})
    with urllib.request.urlopen(urllib.request.Request(url, headers={"Range": "bytes=5-"}), timeout=5) as r:
        assert r.status == 206 and r.headers["Content-Range"].startswith("bytes 5-")


def test_the_scale_repo_is_safetensors_shaped_incompressible_and_made_once(tmp_path):
    """Issue 40's weights at scale: valid safetensors shards of random data, an index naming them."""
    import json
    import struct
    import zlib

    from tests.testbed.hub.server import scale_repo

    d = scale_repo(tmp_path / "scale", 5, shard_mb=2)
    shards = sorted(d.glob("*.safetensors"))
    assert len(shards) == 3 and sum(p.stat().st_size for p in shards) == 3 * (5 * 2**20 // 3)
    index = json.loads((d / "model.safetensors.index.json").read_text())
    for p in shards:
        b = p.read_bytes()
        n = struct.unpack("<Q", b[:8])[0]
        [(name, t)] = [(k, v) for k, v in json.loads(b[8 : 8 + n]).items() if k != "__metadata__"]
        assert t["dtype"] == "U8" and t["data_offsets"] == [0, len(b) - 8 - n] and index["weight_map"][name] == p.name
        assert len(zlib.compress(b[8 + n :])) > 0.99 * (len(b) - 8 - n)
    before = [p.stat().st_mtime_ns for p in shards]
    scale_repo(tmp_path / "scale", 5, shard_mb=2)
    assert [p.stat().st_mtime_ns for p in shards] == before
    scale_repo(tmp_path / "scale", 4, shard_mb=2)  # another size: the other size's shards go
    assert sorted(p.name for p in d.glob("*.safetensors")) == [f"model-0000{i}-of-00002.safetensors" for i in (1, 2)]


def test_the_retrained_branch_is_another_revision_whose_output_rows_are_reversed(hub, model, tmp_path):
    """Issue 38's changed model revision: `snapshot_download(revision="retrained")` gets the branch's
    own commit and a model whose output projection has its rows in reverse order (every other byte as
    main's), while main is untouched."""
    h, ep = hub
    code = f"from huggingface_hub import snapshot_download as s; print(s({TINY!r}, revision={RETRAINED!r}))"
    r = _client(ep, tmp_path, code)
    assert r.returncode == 0, r.stderr
    snap = Path(r.stdout.strip().splitlines()[-1])
    branch = h.repos[TINY].branches[RETRAINED]
    assert branch.sha != h.repos[TINY].sha and snap.name == branch.sha
    assert (snap.parent.parent / "refs" / RETRAINED).read_text() == branch.sha
    main, got = (model / "model.safetensors").read_bytes(), (snap / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", main[:8])
    a, b = json.loads(main[8 : 8 + n])["lm_head.weight"]["data_offsets"]
    rows = [main[8 + n + a + i * 512 : 8 + n + a + (i + 1) * 512] for i in range(6144)]
    assert got[8 + n + a : 8 + n + b] == b"".join(reversed(rows))
    assert got[: 8 + n + a] == main[: 8 + n + a] and got[8 + n + b :] == main[8 + n + b :]
    assert (snap / "config.json").read_bytes() == (model / "config.json").read_bytes()
