"""Model weights: which snapshot a profile needs, what each node holds, and the command lines that
resolve, check, download and replicate it. Pure functions; the weights stage runs them.

The cache is huggingface_hub's own layout under HF_HOME/hub (blobs named by their hash, snapshot
links, refs), so vLLM and `hf` find what we put there. A node's copy counts as complete only when
every file of the snapshot is there with the size the hub lists and a hash that matched its name
once; a small stamp file remembers the size and mtime of what was verified, so the next `up`
trusts unchanged files without hashing 80 GB again, and hashes again any file that changed.
"""

from __future__ import annotations

import base64
import json
import re
import shlex
from dataclasses import dataclass
from pathlib import PurePosixPath

from sparkcluster import programs
from sparkcluster.errors import InputError
from sparkcluster.movement import transfer
from sparkcluster.redact import set_fix

PUBLIC_HUB = "https://huggingface.co"
DOWNLOAD_CONTAINER = "sparkcluster-weights-download"
_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_REV = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_BLOB = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")


class HubUnavailable(InputError):
    """The hub did not answer (or failed): staged weights can still be served."""


@dataclass(frozen=True)
class File:
    path: str
    size: int
    blob: str  # the cache's name for it: sha256 for LFS files, git blob sha1 otherwise
    lfs: bool


@dataclass(frozen=True)
class Manifest:
    repo: str
    revision: str  # as the profile asked (a branch, a tag or a commit)
    commit: str
    files: tuple[File, ...]

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    def sizes(self) -> dict[str, int]:
        return {f.blob: f.size for f in self.files}

    def request(self, hash_unverified: bool = True, rehash: bool = False) -> str:
        """The JSON the node program's `check` reads on stdin."""
        return json.dumps(
            {
                "folder": repo_folder(self.repo),
                "commit": self.commit,
                "ref": None if self.revision == self.commit else self.revision,
                "hash": hash_unverified,
                "rehash": rehash,
                "files": [{"path": f.path, "size": f.size, "blob": f.blob} for f in self.files],
            }
        )


def is_hub_model(model: str) -> bool:
    """A profile's model is a hub repo id (org/name), not a path inside the container."""
    return bool(_REPO.fullmatch(model)) and not model.startswith(("/", "."))


def check_repo(repo: str) -> str:
    if not _REPO.fullmatch(repo) or ".." in repo:
        raise InputError(f"'{repo}' is not a hub model id (expected ORG/NAME)", 'set model = "ORG/NAME" in the profile')
    return repo


def check_revision(rev: str) -> str:
    if not _REV.fullmatch(rev) or ".." in rev or "//" in rev:
        raise InputError(f"'{rev}' is not a revision (a branch, tag or commit)", "set revision in the profile")
    return rev


def repo_folder(repo: str) -> str:
    return "models--" + check_repo(repo).replace("/", "--")


def hub_dir(hf_cache: str) -> str:
    return str(PurePosixPath(hf_cache) / "hub")


def safe_path(p: str) -> str:
    """A file path from the hub, accepted only if it stays inside the snapshot folder."""
    pp = PurePosixPath(p)
    if (
        not p
        or pp.is_absolute()
        or any(part in ("", ".", "..") for part in p.split("/"))
        or any(ord(c) < 32 or c == "\x7f" for c in p)
    ):
        raise ValueError(f"unsafe file path from the hub: {p!r}")
    return p


def parse_resolve(out: str, repo: str, revision: str, endpoint: str) -> Manifest:
    """The resolver's answer as a manifest, or the one-line error that says what to do."""
    try:
        got = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise InputError(f"the hub's answer for {repo} could not be read", f"check hf_endpoint ({endpoint})") from None
    if "error" in got:
        raise resolve_error(got, repo, revision, endpoint)
    commit = got.get("sha") or ""
    if not _COMMIT.fullmatch(commit):
        raise InputError(f"the hub gave no commit for {repo}@{revision}", f"check hf_endpoint ({endpoint})")
    files = []
    for f in got.get("files") or []:
        blob, size = f.get("blob") or "", f.get("size")
        if not _BLOB.fullmatch(blob) or not isinstance(size, int) or size < 0:
            raise InputError(
                f"the hub listed {f.get('path')!r} of {repo} without a size or hash", f"check hf_endpoint ({endpoint})"
            )
        try:
            files.append(File(safe_path(f["path"]), size, blob, bool(f.get("lfs"))))
        except ValueError as e:
            raise InputError(f"{repo}: {e}", "use another revision or repository") from None
    return Manifest(repo, revision, commit, tuple(files))


def resolve_error(got: dict, repo: str, revision: str, endpoint: str) -> InputError:
    code, status = got.get("error"), got.get("status")
    page = f"{endpoint.rstrip('/')}/{repo}"
    if code == "GatedRepo" or status in (401, 403) and code != "RepoNotFound":
        if status == 401:
            return InputError(
                f"{repo} is gated and this run has no HF token",
                f"accept its licence at {page}, then {set_fix('HF_TOKEN', 'hf_...')}; then sparkcluster up",
            )
        return InputError(
            f"{repo} is gated and the HF token has no access to it "
            "(licence not accepted, or a token without read access)",
            f"accept the licence at {page} with the token's account, then sparkcluster up",
        )
    if code == "RevisionNotFound":
        return InputError(
            f"revision '{revision}' does not exist in {repo}",
            f"set revision to a branch, tag or commit listed at {page}/tree/main",
        )
    if code == "RepoNotFound" or status == 404:
        return InputError(
            f"model {repo} does not exist on {endpoint} (or it is private and the token cannot see it)",
            "check model in the profile (ORG/NAME as on the hub) and HF_TOKEN",
        )
    if code == "Unreachable":
        return HubUnavailable(
            f"the head cannot reach the hub at {endpoint}: {got.get('message')}",
            "check the head's network (or set hf_endpoint in the inventory to a mirror)",
        )
    if isinstance(status, int) and status >= 500:
        return HubUnavailable(
            f"the hub answered {status} for {repo}@{revision}: {got.get('message')}",
            "try again later (or set hf_endpoint to a mirror)",
        )
    return InputError(
        f"the hub answered {status} for {repo}@{revision}: {got.get('message')}",
        "try again later (or set hf_endpoint to a mirror)",
    )


# ---- command lines (every value quoted; the token never appears: it goes on stdin) ----


# the programs the weights stage runs on the nodes (sparkcluster/programs): their input is JSON on
# stdin, their output one JSON object on stdout; their arguments are only paths and names validated here
RESOLVE = "sparkcluster.programs.hub_resolve"
FETCH = "sparkcluster.programs.hub_fetch"
NODE = "sparkcluster.programs.weights_cache"
EXTRACT = "sparkcluster.programs.weights_receive"
SEND = "sparkcluster.programs.weights_send"
DOWNLOAD = "sparkcluster.programs.weights_download"


def py(program: str, *args: str) -> str:
    """One of sparkcluster's programs with its arguments, as a shell command (programs.command)."""
    return programs.command(program, *args)


def resolve_command(endpoint: str, repo: str, revision: str) -> str:
    return py(RESOLVE, endpoint, check_repo(repo), check_revision(revision))


def fetch_command(endpoint: str, repo: str, commit: str, path: str) -> str:
    """One small file of a resolved commit from the hub, on stdout (the token on stdin)."""
    if not _COMMIT.fullmatch(commit):
        raise ValueError(f"not a commit: {commit!r}")
    return py(FETCH, endpoint, check_repo(repo), commit, safe_path(path))


def check_command(hf_cache: str) -> str:
    return "umask 022; " + py(NODE, "check", hub_dir(hf_cache))


def status_command(hf_cache: str) -> str:
    return py(NODE, "status", hub_dir(hf_cache))


def cached_command(hf_cache: str, repo: str, revision: str) -> str:
    return py(NODE, "cached", hub_dir(hf_cache), repo_folder(repo), check_revision(revision))


def parse_cached(out: str, repo: str, revision: str) -> Manifest | None:
    """The manifest a node kept when it last verified the snapshot complete, or None."""
    try:
        got = parse_json(out)
        files = tuple(File(safe_path(f["path"]), int(f["size"]), f["blob"], len(f["blob"]) == 64) for f in got["files"])
    except (ValueError, KeyError, TypeError, IndexError):
        return None
    if not _COMMIT.fullmatch(got.get("commit", "")) or not all(_BLOB.fullmatch(f.blob) for f in files):
        return None
    return Manifest(repo, revision, got["commit"], files)


def rm_command(hf_cache: str, repo: str, commit: str) -> str:
    if not _COMMIT.fullmatch(commit):
        raise InputError(f"'{commit}' is not a commit", "pass the 40-character commit that weights status shows")
    return py(NODE, "rm", hub_dir(hf_cache), repo_folder(repo), commit)


def download_command(
    image: str,
    hf_cache: str,
    endpoint: str | None,
    m: Manifest,
    only: tuple[str, ...] | None = None,
    user: str | None = None,
) -> str:
    """A throwaway container of the cluster image (it has huggingface_hub) fetches the snapshot into
    the head's cache. The token, if any, is the 0600 file HF_HOME/token. A download an earlier run
    left behind (Ctrl-C kills the client, not the container) is removed first; the new one resumes
    from its .incomplete files. It runs as `user` (the SSH user's uid:gid), so every file it writes
    in that user's cache is the user's own (its own `hf` can update them), with a HOME it may write."""
    # no tqdm bars: their carriage returns would pile up in the SSH channel; the program reports bytes
    env = ["-e", f"HF_HOME={hf_cache}", "-e", "HF_HUB_DISABLE_TELEMETRY=1", "-e", "HF_HUB_DISABLE_PROGRESS_BARS=1"]
    if endpoint:
        env += ["-e", f"HF_ENDPOINT={endpoint}"]
    if user:
        env = ["--user", user, "-e", "HOME=/tmp", *env]
    argv = [
        "docker",
        "run",
        "--rm",
        "--name",
        DOWNLOAD_CONTAINER,
        "--network",
        "host",
        *env,
        "-v",
        f"{hf_cache}:{hf_cache}",
        "--entrypoint",
        "python3",
        image,
        *programs.argv(DOWNLOAD, m.repo, m.commit, repo_folder(m.repo), *(safe_path(p) for p in only or ()))[1:],
    ]
    return f"docker rm -f {DOWNLOAD_CONTAINER} >/dev/null 2>&1; " + shlex.join(argv)


def snapshot_file(hf_cache: str, repo: str, commit: str, path: str) -> str:
    """Where huggingface_hub's layout puts a file of a snapshot."""
    if not _COMMIT.fullmatch(commit):
        raise ValueError(f"not a commit: {commit!r}")
    return str(PurePosixPath(hub_dir(hf_cache)) / repo_folder(repo) / "snapshots" / commit / safe_path(path))


def link_command(target: str, path: str) -> str:
    """A link at `path` to a verified file of a snapshot (the cache is mounted at the same path in
    the containers, so it resolves there too); fails when the target is not there."""
    return f"ln -sfn {shlex.quote(target)} {shlex.quote(path)} && test -s {shlex.quote(path)}"


def stop_download_command() -> str:
    """Ends the download container: Ctrl-C or a failure ends our SSH channel, not the container."""
    return f"docker rm -f {DOWNLOAD_CONTAINER} >/dev/null 2>&1; true"


def incoming_dir(hf_cache: str, repo: str) -> str:
    return str(PurePosixPath(hub_dir(hf_cache)) / repo_folder(repo) / ".sparkcluster-incoming")


def blobs_dir(hf_cache: str, repo: str) -> str:
    return str(PurePosixPath(hub_dir(hf_cache)) / repo_folder(repo) / "blobs")


def receive_command(hf_cache: str, repo: str, bind_ip: str, peer_ip: str, forward: str | None = None) -> str:
    """On the worker: EXTRACT (programs/weights_receive), the image transfer's one-shot receiver (one
    connection, from the sender's address only) that writes each file into the incoming folder
    itself and hashes it on the way; `check` adopts what matches its name. `forward`
    (transfer.next_hop): relay the stream to the next worker of a chain as it arrives."""
    inc = incoming_dir(hf_cache, repo)
    return f"umask 022; mkdir -p {shlex.quote(inc)} && " + py(
        EXTRACT, bind_ip, peer_ip, inc, *([forward] if forward else [])
    )


def send_command(
    hf_cache: str, repo: str, blobs: list[str], dst_ip: str, port: int, src_ip: str, rate: float | None = None
) -> str:
    """On the head: SEND (programs/weights_send) streams the named blobs, FILES of them at a time,
    each read by the kernel (sendfile). The names travel as base64 of a NUL-separated list on its
    stdin, after the stream key (transfer.keyed), so no name reaches the shell as text. `rate`: a
    cap in bytes a second (the inventory's `replication_max_mb_s`), None for none."""
    for b in blobs:
        if not _BLOB.fullmatch(b):
            raise ValueError(f"not a blob name: {b!r}")
    names = base64.b64encode(b"".join(b.encode() + b"\0" for b in blobs)).decode()
    return (
        f"set -o pipefail; cd {shlex.quote(blobs_dir(hf_cache, repo))} && "
        + transfer.keyed(f"echo {names} | base64 -d")
        + " | "
        + py(SEND, dst_ip, str(int(port)), src_ip, *transfer.rate_arg(rate))
    )


def parse_json(out: str) -> dict | list:
    return json.loads(out.strip().splitlines()[-1])


def gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def describe_download(
    image: str, m: Manifest | None, endpoint: str, hf_cache: str, repo: str | None = None, user: str | None = None
) -> str:
    """What the download step prints (the program's text is left out; the token is a file)."""
    what = f"{m.repo}@{m.commit}" if m else f"{repo} at the resolved commit"
    as_user = f"--user {user} " if user else ""
    return (
        f"docker run --rm --name {DOWNLOAD_CONTAINER} --network host {as_user}-e HF_HOME={hf_cache} "
        f"-e HF_ENDPOINT={endpoint} -v {hf_cache}:{hf_cache} {image}: huggingface_hub snapshot_download {what} "
        "(resumes .incomplete files; "
        "token from HF_HOME/token, mode 0600)"
    )
