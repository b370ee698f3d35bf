"""The compile cache seen from inside the container (config/compile_cache decides its key and
folder): whether a start of the engine loaded what an earlier start compiled, how long compiling
took, and whose the files are.

Hit or miss is read from the engine's own lines (vLLM 0.32, cited per pattern below) where they
exist. The CPU build compiles with plain inductor (DYNAMO_TRACE_ONCE, `vllm/platforms/cpu.py`):
with vLLM's AOT compile on (its default with torch >= 2.10) it says only that it saved the model's
artifact (a compile) or that the artifact there did not load (a compile again); with AOT off (the
testbed-compile profile, where the artifact can never load) it says neither, so there the folder
tells: files added by this start mean it compiled (a miss), a folder that had files and gained none
means inductor loaded its kernels (a hit). Every start's reading goes to the journal as one
"compile cache" entry, which `events` shows.

The engine runs as root in the container, so what it writes into the mounted folder is root's on
the host; `CacheOwner` hands every file to the SSH user's uid:gid (from the agent's config), so the
user can list, evict and purge the caches without sudo (deployment/compile_caches). Standard library only.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import time
from dataclasses import dataclass

from .journal import Journal

# vllm/compilation/backends.py:296: the compiled graph(s) loaded from vLLM's cache
HIT = re.compile(r"Directly load the compiled graph\(s\) for compile range .* from the cache, took ([0-9.]+) s")
# vllm/compilation/decorators.py:320: the whole model's AOT artifact loaded
AOT_HIT = re.compile(r"Directly load AOT compilation from path")
# vllm/compilation/backends.py:399: a graph compiled now
MISS = re.compile(r"Compiling a graph for compile range .* takes ([0-9.]+) s")
# vllm/compilation/monitor.py:20 and decorators.py:708: the total, once per rank
TOTAL = re.compile(r"torch\.compile (?:and initial profiling/warmup run together )?took ([0-9.]+) s in total")
# vllm/compilation/decorators.py:743 (save_aot_compiled_function): the AOT artifact written, which
# vLLM does only after compiling the whole model this start (decorators.py:700; a loaded one is not
# saved again, :726-728); the CPU build's only compile line
AOT_SAVED = re.compile(r"saved AOT compiled function to (\S+)")
# decorators.py:750: the artifact a later start would load was not written, so every start compiles
# again however warm the folder looks
SAVE_FAILED = re.compile(r"unable to save AOT compiled function to (\S+): (.*)$")
# decorators.py:331-337: an artifact was there and did not load, so this start compiles the model
# again. vLLM 0.32's CPU build says it at every restart: its loader calls `finalize_loading` (:315),
# which only vLLM's own backend's artifact has, and the CPU platform compiles with plain inductor
# (DYNAMO_TRACE_ONCE, vllm/platforms/cpu.py:364-367), whose artifact torch reloads as a function
# ("'function' object has no attribute 'finalize_loading'"); testbed-compile turns AOT off for it
LOAD_FAILED = re.compile(r"Compiling model again due to a load failure from (\S+), reason:(.*)$")
NO_REASON = "(no reason given)"  # vLLM's "reason: %s" with an empty exception text
# vllm/v1/engine/core.py:396: the engine's init, with the compile time when there was one
INIT = re.compile(r"init engine \(profile, create kv cache, warmup model\) took [0-9.]+ s \(compilation: ([0-9.]+) s")
# vllm/v1/worker/cpu_model_runner.py:87,91: the CPU build compiles during this warm-up
CPU_WARMUP, CPU_WARMED = "Warming up model for the compilation...", "Warming up done."
# vllm/logger.py: "%(levelname)s %(asctime)s", asctime as %m-%d %H:%M:%S
STAMP = re.compile(r"\b(?:DEBUG|INFO|WARNING|ERROR) (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d) ")
# written by `up` as the user (deployment/compile_caches), and the agent's lock and seed record
OWN_FILES = (".last-start", "key.json", ".in-use", ".seeded")
NOT_COMPILED = "modelinfos"  # vLLM's model-class inspection cache in VLLM_CACHE_ROOT (count_files)


@dataclass(frozen=True)
class Reading:
    result: str  # "hit", "miss" or "none" (nothing compiled, nothing loaded)
    compile_s: float | None  # the seconds the engine spent compiling (or loading) this start
    evidence: str  # "engine log" or "cache folder"
    unsaved: str = ""  # vLLM said it could not save its AOT artifact (why): the next start compiles again
    unloaded: str = ""  # vLLM said the artifact there did not load (why): this start compiled again


def _clock(line: str) -> float | None:
    m = STAMP.search(line)
    if not m:
        return None
    _mon, day, h, mi, s = (int(x) for x in m.groups())
    return day * 86400 + h * 3600 + mi * 60 + s


def read_lines(lines: list[str], files_before: int = 0, files_added: int = 0) -> Reading:
    """What one start's engine lines (and its folder before and after) say about the cache."""
    hits = misses = 0
    totals: list[float] = []
    warm_from = warm_to = None
    unsaved = unloaded = ""
    for line in lines:
        failed = SAVE_FAILED.search(line)
        if failed:
            unsaved = failed.group(2).strip()[:300]
        not_loaded = LOAD_FAILED.search(line)
        if not_loaded:
            unloaded = not_loaded.group(2).strip()[:300] or NO_REASON
        if HIT.search(line) or AOT_HIT.search(line):
            hits += 1
        if MISS.search(line) or AOT_SAVED.search(line) or not_loaded:
            misses += 1
        m = TOTAL.search(line) or INIT.search(line)
        if m:
            totals.append(float(m.group(1)))
        if CPU_WARMUP in line and warm_from is None:
            warm_from = _clock(line)
        elif CPU_WARMED in line:
            warm_to = _clock(line)
    seconds = max(totals) if totals else None  # the ranks compile at once: the slowest is the cost
    if seconds is None and warm_from is not None and warm_to is not None:
        seconds = float(max(0, warm_to - warm_from))
    if misses:
        return Reading("miss", seconds, "engine log", unsaved, unloaded)
    if hits:
        return Reading("hit", seconds, "engine log", unsaved, unloaded)
    if files_added:
        return Reading("miss", seconds, "cache folder", unsaved, unloaded)
    if files_before:
        return Reading("hit", seconds, "cache folder", unsaved, unloaded)
    return Reading("none", seconds, "cache folder", unsaved, unloaded)


def count_files(folder: str) -> int:
    """The compiled artifacts under `folder`: not our own files, nor vLLM's model-class inspection
    cache (`VLLM_CACHE_ROOT/modelinfos/<module>-<class>.json`, vllm/model_executor/models/registry.py,
    written on any first start, eager too), which would read an engine that compiled nothing as a miss."""
    n = 0
    for d, _dirs, files in os.walk(folder):
        if NOT_COMPILED in os.path.relpath(d, folder).split(os.sep):
            continue
        n += sum(1 for f in files if f not in OWN_FILES)
    return n


def log_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def log_lines(path: str, offset: int) -> list[str]:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace").splitlines()
    except OSError:
        return []


class StartReading:
    """One start of the engine, from just before it to its first serving look (the supervisor's)."""

    def __init__(self, cfg: dict | None, log_path: str):
        self.folder = (cfg or {}).get("dir")
        self.log_path = log_path
        self.offset = log_size(log_path)
        self.started = time.monotonic()
        self.files_before = count_files(self.folder) if self.folder else 0
        if self.folder:  # a start, for the cap's "oldest first" (deployment/compile_caches), restarts included
            try:
                os.utime(os.path.join(self.folder, OWN_FILES[0]))
            except OSError:
                pass

    def done(self, journal: Journal) -> Reading | None:
        """Journal the reading once the engine serves; None where the container has no cache."""
        if not self.folder:
            return None
        added = max(0, count_files(self.folder) - self.files_before)
        got = read_lines(log_lines(self.log_path, self.offset), self.files_before, added)
        journal.write(
            "compile cache",
            result=got.result,
            compile_s=got.compile_s,
            evidence=got.evidence,
            key=os.path.basename(self.folder.rstrip("/")),
            files_before=self.files_before,
            files_added=added,
            start_s=round(time.monotonic() - self.started, 1),
            **({"unsaved": got.unsaved} if got.unsaved else {}),
            **({"unloaded": got.unloaded} if got.unloaded else {}),
        )
        return got


def hold(cfg: dict | None):
    """A shared lock on the key's in-use file, held while this process lives (the kernel drops it
    when the container stops): eviction on the host takes the key only where it can lock it alone
    (deployment/compile_caches). The open file is returned and must be kept; None without a cache."""
    folder = (cfg or {}).get("dir")
    if not folder:
        return None
    try:
        f = open(os.path.join(folder, OWN_FILES[2]), "a")  # noqa: SIM115 - held for the agent's life
        os.chmod(f.name, 0o644)
        fcntl.flock(f, fcntl.LOCK_SH)
        return f
    except OSError:
        return None


def seed(cfg: dict | None, journal: Journal | None) -> dict[str, int]:
    """A key's first start seeded from the caches the image ships: each of the image's default cache
    folders (config/compile_cache SEEDS: container path -> path in the key's folder) copied into the
    key's folder, once, where the folder holds no compiled file yet. Returns the files copied per
    source; the journal gets one "compile cache seeded" entry."""
    cfg = cfg or {}
    folder, seeds = cfg.get("dir"), cfg.get("seed") or {}
    if not folder or not seeds or os.path.exists(os.path.join(folder, OWN_FILES[3])) or count_files(folder):
        return {}
    copied: dict[str, int] = {}
    errors: list[str] = []
    for src, dest in sorted(seeds.items()):
        if not os.path.isdir(src) or os.path.realpath(src).startswith(os.path.realpath(folder)):
            continue  # the image has nothing there (or the key's own folder is mounted there)
        n = sum(len(files) for _d, _dirs, files in os.walk(src))
        if not n:
            continue
        try:
            shutil.copytree(src, os.path.join(folder, dest), symlinks=True, dirs_exist_ok=True)
            copied[src] = n
        except (OSError, shutil.Error) as e:
            errors.append(f"{src}: {str(e)[:200]}")
    try:
        with open(os.path.join(folder, OWN_FILES[3]), "w") as f:
            f.write(json.dumps({"copied": copied, "errors": errors}, sort_keys=True) + "\n")
    except OSError:
        pass
    if journal is not None:
        journal.write("compile cache seeded", key=os.path.basename(folder.rstrip("/")), copied=copied, errors=errors)
    return copied


class CacheOwner:
    """Hands the files the engine wrote into the cache folder to the SSH user (every node's agent,
    every LOOK_S and when the container stops): root's files there would be the user's to evict."""

    LOOK_S = 30.0

    def __init__(self, cfg: dict | None, journal: Journal):
        cfg = cfg or {}
        self.folder, self.journal, self.last, self.since = cfg.get("dir"), journal, 0.0, 0.0
        try:
            uid, gid = (int(x) for x in (cfg.get("owner") or "").split(":"))
            self.owner: tuple[int, int] | None = (uid, gid)
        except ValueError:
            self.owner = None

    def look(self, force: bool = False) -> int:
        """Files and folders handed over now. Only the folders changed since the last look have
        their files looked at (a file created there changes its folder's mtime; a file rewritten in
        place keeps its owner), so a cache of many thousands of files costs a walk of its folders."""
        if not self.folder or self.owner is None or (not force and time.monotonic() - self.last < self.LOOK_S):
            return 0
        self.last = time.monotonic()
        since, self.since = self.since, time.time() - 2.0  # 2 s of slack for a write during this walk
        uid, gid = self.owner
        changed = 0

        def mine(path: str) -> os.stat_result | None:
            nonlocal changed
            try:
                st = os.lstat(path)
                if (st.st_uid, st.st_gid) != (uid, gid):
                    os.lchown(path, uid, gid)
                    changed += 1
                return st
            except OSError:
                return None

        for d, _dirs, files in os.walk(self.folder):
            st = mine(d)
            if st is not None and st.st_mtime >= since:
                for f in files:
                    mine(os.path.join(d, f))
        return changed
