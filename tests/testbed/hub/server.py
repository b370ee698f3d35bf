"""A minimal Hugging Face hub for the testbed: the endpoints huggingface_hub 2.x calls for
`model_info`, `list_repo_tree`, `snapshot_download` and `hf_hub_download`, served from local folders.

Why not an existing mirror: `olah` (PyPI) serves local repositories only as git checkouts, has no
gated repos, no fault knobs and no byte counter, and pulls in FastAPI, uvicorn, peewee and GitPython.
This is stdlib only (ThreadingHTTPServer) and serves each repo straight from a directory.

Protocol facts this relies on (huggingface_hub 2.x): `GET /api/models/{repo}[/revision/{rev}]`
gives `sha` and `siblings` (with `?blobs=true`: size, blobId, lfs{sha256,size,pointerSize});
`GET /api/models/{repo}/tree/{rev}?recursive=true` lists files (one page: no `Link` header);
`HEAD|GET /{repo}/resolve/{rev}/{path}` answers with `X-Repo-Commit`, a quoted `ETag` (the sha256
for LFS files, the git blob sha1 otherwise; the client names the cache blob after it), and honours
`Range` so partial downloads resume. Errors carry `X-Error-Code` (RepoNotFound, RevisionNotFound,
EntryNotFound, GatedRepo: 401 without a token, 403 with a token not granted).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

# huggingface_hub decides LFS by .gitattributes on the real hub; large binary formats are LFS there
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf", ".h5", ".msgpack")
LFS_MIN_SIZE = 10 * 2**20
CHUNK = 1 << 20


@dataclass
class RepoFile:
    path: str
    size: int
    git_sha1: str
    sha256: str
    source: Path

    @property
    def lfs(self) -> bool:
        return self.path.endswith(LFS_SUFFIXES) or self.size >= LFS_MIN_SIZE

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.git_sha1


@dataclass
class Repo:
    repo_id: str
    root: Path
    gated: bool = False
    memo_dir: Path | None = None  # where file hashes are remembered between starts
    files: dict[str, RepoFile] = field(default_factory=dict)
    sha: str = ""
    # other revisions of the same repository by branch name (each served from its own folder, with its
    # own commit), as a hub repo's branches are: `main` is this one
    branches: dict[str, Repo] = field(default_factory=dict)

    def at(self, rev: str) -> Repo:
        """The revision `rev` names (main, a branch or a commit), or RevisionNotFound."""
        rev = unquote(rev)
        if rev in ("main", self.sha):
            return self
        for name, b in self.branches.items():
            if rev in (name, b.sha):
                return b
        raise HubError(404, "RevisionNotFound", f"Invalid rev id: {rev}")

    def load(self) -> Repo:
        for p in sorted(self.root.rglob("*")):
            if p.is_file() and not p.name.startswith("."):
                rel = p.relative_to(self.root).as_posix()
                self.files[rel] = _describe(p, rel, self.memo_dir)
        # the commit is a digest of the tree: same files, same commit, on every start
        h = hashlib.sha1(self.repo_id.encode())
        for f in self.files.values():
            h.update(f"{f.path}\0{f.etag}\0".encode())
        self.sha = self.sha or h.hexdigest()  # a fixed commit may be given (the testbed pins one)
        return self


def _describe(p: Path, rel: str, memo_dir: Path | None) -> RepoFile:
    """Hashes of one file, remembered in memo_dir (a few hundred MB are hashed once, not per start;
    never next to the file: the served folders belong to others)."""
    st = p.stat()
    key = f"{p.resolve()}:{st.st_size}:{st.st_mtime_ns}"
    memo = memo_dir / (hashlib.sha1(key.encode()).hexdigest() + ".json") if memo_dir else None
    if memo is not None and memo.exists():
        got = json.loads(memo.read_text())
        if got.get("key") == key:
            return RepoFile(rel, st.st_size, got["sha1"], got["sha256"], p)
    s1, s256 = hashlib.sha1(b"blob %d\0" % st.st_size), hashlib.sha256()
    with p.open("rb") as fh:
        while b := fh.read(CHUNK):
            s1.update(b)
            s256.update(b)
    if memo is not None:
        memo_dir.mkdir(parents=True, exist_ok=True)
        memo.write_text(json.dumps({"key": key, "sha1": s1.hexdigest(), "sha256": s256.hexdigest()}))
    return RepoFile(rel, st.st_size, s1.hexdigest(), s256.hexdigest(), p)


@dataclass
class Knobs:
    """Faults and counters; tests set them in-process or with POST /_hub/knobs."""

    fail_after: int | None = None  # cut the connection after this many body bytes of a file...
    fail_times: int = 0  # ...this many times (then serve normally)
    fail_status: int | None = None  # answer every resolve with this status (e.g. 500) while set
    rate_bps: int | None = None  # throttle each download to this many bytes per second
    bytes_served: int = 0  # file body bytes sent, every request together
    requests: list[str] = field(default_factory=list)


class Hub:
    def __init__(self, repos: list[Repo], tokens: set[str], datasets: list[Repo] = ()):
        self.repos = {r.repo_id: r for r in repos}
        # dataset repositories: their own namespace on the hub (/api/datasets/..., /datasets/.../resolve)
        self.datasets = {r.repo_id: r for r in datasets}
        self.tokens = set(tokens)  # tokens granted access to the gated repos
        self.knobs = Knobs()
        self.lock = threading.Lock()

    def count(self, n: int) -> None:
        with self.lock:
            self.knobs.bytes_served += n

    def take_failure(self) -> int | None:
        with self.lock:
            if self.knobs.fail_after is not None and self.knobs.fail_times > 0:
                self.knobs.fail_times -= 1
                return self.knobs.fail_after
            return None

    def stats(self) -> dict:
        k = self.knobs
        return {
            "bytes_served": k.bytes_served,
            "requests": len(k.requests),
            "fail_times": k.fail_times,
            "repos": {
                r.repo_id: {"sha": r.sha, "size": sum(f.size for f in r.files.values())} for r in self.repos.values()
            },
            "datasets": {r.repo_id: {"sha": r.sha} for r in self.datasets.values()},
        }

    def set_knobs(self, values: dict) -> None:
        with self.lock:
            for k, v in values.items():
                if k in ("fail_after", "fail_times", "fail_status", "rate_bps", "bytes_served"):
                    setattr(self.knobs, k, v)
            if values.get("reset"):
                self.knobs = Knobs()


class HubError(Exception):
    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


_API = re.compile(
    r"^/api/(?P<type>models|datasets)/(?P<repo>[^/]+/[^/]+)(?:/(?P<kind>revision|tree)/(?P<rev>[^/]+)(?P<path>/.*)?)?$"
)
_RESOLVE = re.compile(r"^/(?:(?P<type>datasets)/)?(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")


class Handler(BaseHTTPRequestHandler):
    server_version = "testbed-hub/1"
    protocol_version = "HTTP/1.1"
    hub: Hub  # set on the subclass made by make_server

    def log_message(self, fmt: str, *args) -> None:  # keep test output quiet; requests are recorded
        pass

    # ---- plumbing ----
    def _send(
        self, status: int, body: bytes = b"", headers: dict[str, str] | None = None, ctype: str = "application/json"
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, e: HubError) -> None:
        body = json.dumps({"error": e.message}).encode()
        self._send(e.status, body, {"X-Error-Code": e.code, "X-Error-Message": e.message})

    def _repo(self, repo_id: str, kind: str | None = None) -> Repo:
        repo = (self.hub.datasets if kind == "datasets" else self.hub.repos).get(repo_id)
        if repo is None:
            raise HubError(404, "RepoNotFound", f"Repository {repo_id} not found")
        if repo.gated:
            auth = self.headers.get("Authorization", "")
            token = auth[7:] if auth.startswith("Bearer ") else ""
            url = f"http://{self.headers.get('Host', 'hub')}/{repo_id}"
            if not token:
                raise HubError(
                    401,
                    "GatedRepo",
                    f"Access to model {repo_id} is restricted. You must have access "
                    f"to it and be authenticated to access it. Visit {url} to ask for access.",
                )
            if token not in self.hub.tokens:
                raise HubError(
                    403,
                    "GatedRepo",
                    f"Access to model {repo_id} is restricted and you are not in the "
                    f"authorized list. Visit {url} to ask for access.",
                )
        return repo

    # ---- verbs ----
    def do_HEAD(self) -> None:
        self.do_GET()

    def do_POST(self) -> None:
        if self.path == "/_hub/knobs":
            n = int(self.headers.get("Content-Length") or 0)
            self.hub.set_knobs(json.loads(self.rfile.read(n) or b"{}"))
            return self._send(200, json.dumps(self.hub.stats()).encode())
        self._send(404, b"{}")

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        with self.hub.lock:
            self.hub.knobs.requests.append(f"{self.command} {url.path}")
        try:
            if url.path == "/_hub/stats":
                return self._send(200, json.dumps(self.hub.stats()).encode())
            if m := _API.match(url.path):
                return self._api(m, parse_qs(url.query))
            if m := _RESOLVE.match(url.path):
                return self._resolve(m)
            raise HubError(404, "", "not found")
        except HubError as e:
            self._error(e)

    def _api(self, m: re.Match, query: dict) -> None:
        repo = self._repo(m["repo"], m["type"])
        if m["kind"]:
            repo = repo.at(m["rev"])
        if m["kind"] == "tree":
            prefix = unquote(m["path"] or "/").lstrip("/")
            entries = [_tree_entry(f) for p, f in repo.files.items() if p.startswith(prefix)]
            return self._send(200, json.dumps(entries).encode())
        blobs = query.get("blobs", ["false"])[0].lower() == "true"
        siblings = [
            (
                {
                    "rfilename": f.path,
                    "size": f.size,
                    "blobId": f.git_sha1,
                    **({"lfs": {"sha256": f.sha256, "size": f.size, "pointerSize": 134}} if f.lfs else {}),
                }
                if blobs
                else {"rfilename": f.path}
            )
            for f in repo.files.values()
        ]
        info = {
            "_id": repo.sha[:24],
            "id": repo.repo_id,
            "modelId": repo.repo_id,
            "sha": repo.sha,
            "private": False,
            "gated": "manual" if repo.gated else False,
            "disabled": False,
            "tags": [],
            "siblings": siblings,
            "lastModified": "2026-01-01T00:00:00.000Z",
        }
        self._send(200, json.dumps(info).encode())

    def _resolve(self, m: re.Match) -> None:
        repo = self._repo(m["repo"], m["type"]).at(m["rev"])
        f = repo.files.get(unquote(m["path"]))
        if f is None:
            raise HubError(404, "EntryNotFound", f"{unquote(m['path'])} does not exist at {repo.sha}")
        if self.hub.knobs.fail_status:
            raise HubError(self.hub.knobs.fail_status, "", "the hub is failing (knob)")
        start, end = 0, f.size - 1
        rng = self.headers.get("Range", "")
        if mr := re.match(r"^bytes=(\d+)-(\d*)$", rng):
            start = int(mr[1])
            end = min(int(mr[2]), f.size - 1) if mr[2] else f.size - 1
            if start >= f.size:
                return self._send(416, b"", {"Content-Range": f"bytes */{f.size}"})
        length = end - start + 1
        self.send_response(206 if rng and mr else 200)
        hdrs = {
            "Content-Type": "application/octet-stream",
            "Content-Length": str(length),
            "Accept-Ranges": "bytes",
            "X-Repo-Commit": repo.sha,
            "ETag": f'"{f.etag}"',
        }
        if f.lfs:
            hdrs.update({"X-Linked-Etag": f'"{f.sha256}"', "X-Linked-Size": str(f.size)})
        if rng and mr:
            hdrs["Content-Range"] = f"bytes {start}-{end}/{f.size}"
        for k, v in hdrs.items():
            self.send_header(k, v)
        self.end_headers()
        if self.command == "HEAD":
            return
        self._body(f, start, length)

    def _body(self, f: RepoFile, start: int, length: int) -> None:
        cut = self.hub.take_failure()
        rate = self.hub.knobs.rate_bps
        sent, t0 = 0, time.monotonic()
        with f.source.open("rb") as fh:
            fh.seek(start)
            while sent < length:
                n = min(CHUNK if not rate else max(rate // 10, 1), length - sent)
                if cut is not None and sent + n > cut:
                    n = max(cut - sent, 0)
                b = fh.read(n)
                if b:
                    self.wfile.write(b)
                    sent += len(b)
                    self.hub.count(len(b))
                if cut is not None and sent >= cut:
                    # a hub failing mid-file: the client sees a short body and must resume or fail
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                if rate:
                    ahead = sent / rate - (time.monotonic() - t0)
                    if ahead > 0:
                        time.sleep(ahead)


def _tree_entry(f: RepoFile) -> dict:
    e = {"type": "file", "oid": f.git_sha1, "size": f.size, "path": f.path}
    if f.lfs:
        e["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": 134}
    return e


def make_server(hub: Hub, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    handler = type("BoundHandler", (Handler,), {"hub": hub})
    srv = ThreadingHTTPServer((host, port), handler)
    srv.daemon_threads = True
    return srv


def synthetic_repo(dest: Path, total_mb: int = 300, shards: int = 3) -> Path:
    """A model-shaped repo of `total_mb` MB: config files and safetensors-named shards, written as
    sparse files with a distinct header per shard (so each has its own sha256) and made once."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.json").write_text(json.dumps({"model_type": "synthetic", "shards": shards}) + "\n")
    size = total_mb * 2**20 // shards
    for i in range(shards):
        p = dest / f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        if p.exists() and p.stat().st_size == size:
            continue
        with p.open("wb") as fh:
            header = hashlib.sha256(f"synthetic shard {i}".encode()).digest() * 128
            fh.write(header)
            fh.truncate(size)
            # a marker near the end too, so a file cut anywhere differs from the whole
            fh.seek(size - len(header))
            fh.write(header)
    return dest


def large_repo(dest: Path, config: Path, total_bytes: int, shards: int = 16) -> Path:
    """A repository too large for a 64 GB Spark's memory, listed without anyone downloading it
    (issue 52): `config` (a model's config.json) and safetensors-named shards of `total_bytes` in
    all, sparse files (no bytes on disk) with a distinct header each. The hub hashes them once (the
    memo keeps the hashes); a download would fetch gigabytes of zeros, which no test asks for."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.json").write_bytes(config.read_bytes())
    size = total_bytes // shards
    for i in range(shards):
        p = dest / f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        if p.exists() and p.stat().st_size == size:
            continue
        with p.open("wb") as fh:
            fh.write(hashlib.sha256(f"large shard {i}".encode()).digest())
            fh.truncate(size)
    return dest


def scale_repo(dest: Path, total_mb: int, shard_mb: int = 512) -> Path:
    """A repo shaped like a real model's of `total_mb` MB (issue 40: weights at scale): shards of at
    most `shard_mb` MB, each a valid safetensors file (an 8-byte header length, the JSON header, then
    one U8 tensor) whose data is random, so no link, disk or stream compresses it; their index
    (`model.safetensors.index.json`) and a config. Made once: shards of the right size are kept."""
    import os
    import struct

    dest.mkdir(parents=True, exist_ok=True)
    shards = max(1, -(-total_mb // shard_mb))
    size = total_mb * 2**20 // shards
    (dest / "config.json").write_text(json.dumps({"model_type": "synthetic", "shards": shards}) + "\n")
    index = {"metadata": {"total_size": 0}, "weight_map": {}}
    names = {f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)}
    for old in dest.glob("*.safetensors"):  # another size's shards: never served beside these
        if old.name not in names:
            old.unlink()
    for i in range(shards):
        p = dest / f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        name = f"layers.{i}.weight"
        head = json.dumps(
            {"__metadata__": {"format": "pt"}, name: {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]}}
        )
        n = size - 8 - len(head) - 64  # the tensor fills the rest of the shard
        head = json.dumps(
            {"__metadata__": {"format": "pt"}, name: {"dtype": "U8", "shape": [n], "data_offsets": [0, n]}}
        )
        head += " " * (size - 8 - n - len(head))  # safetensors pads its header with spaces
        index["weight_map"][name] = p.name
        index["metadata"]["total_size"] += n
        if p.exists() and p.stat().st_size == size:
            continue
        with open(p.with_suffix(".part"), "wb") as fh:
            fh.write(struct.pack("<Q", len(head)) + head.encode())
            left = n
            while left:
                b = os.urandom(min(left, 16 << 20))
                fh.write(b)
                left -= len(b)
        os.replace(p.with_suffix(".part"), p)
    (dest / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return dest


def retrained_copy(model_dir: Path, dest: Path) -> Path:
    """Another revision of the tiny model whose greedy answers differ from the original's: the same
    files, with the rows of its output projection (`lm_head.weight`) in reverse order, so that the
    token that wins each step is another one (issue 38: the canary must flag a changed revision). Pure
    byte work on the safetensors file (an 8-byte header length, the JSON header, then the tensors);
    made once per model: the same input gives the same bytes."""
    import shutil
    import struct

    dest.mkdir(parents=True, exist_ok=True)
    for src in sorted(model_dir.iterdir()):
        if src.is_file() and src.name != "model.safetensors":
            shutil.copy2(src, dest / src.name)
    blob = (model_dir / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + n])
    t = header["lm_head.weight"]
    rows, (a, b) = t["shape"][0], t["data_offsets"]
    base = 8 + n
    data = blob[base + a : base + b]
    row = len(data) // rows
    flipped = b"".join(data[i * row : (i + 1) * row] for i in reversed(range(rows)))
    out = dest / "model.safetensors"
    new = blob[: base + a] + flipped + blob[base + b :]
    if not out.exists() or out.read_bytes() != new:
        out.write_bytes(new)
    return dest


def serve_forever_in_thread(srv: ThreadingHTTPServer) -> threading.Thread:
    t = threading.Thread(target=srv.serve_forever, name="testbed-hub", daemon=True)
    t.start()
    return t
