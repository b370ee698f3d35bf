"""The compile caches and the image (issue 58 item 2): the key follows the image's ID, known once the
image is (pending in the plan while the head lacks it); a key's first start is seeded from the caches
the image ships, or `compile_cache = "image"` uses them in place; GB10's other JIT caches are kept
beside the rest; eviction and purge never take a key a running container uses."""

from __future__ import annotations

import fcntl
import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import make_inventory

from sparkcluster.config import compile_cache, profile
from sparkcluster.config.images import image_ref
from sparkcluster.container.spec import spec_for
from sparkcluster.deployment import compile_caches
from sparkcluster.facts import HostFacts
from sparkcluster.node import compile_reading
from sparkcluster.node.journal import Journal
from sparkcluster.up.plan import make_plan
from sparkcluster.up.stages import containers
from sparkcluster.up.stages.image import HeadImage

ID = "sha256:" + "1" * 64
BUILT = "sha256:" + "2" * 64


@pytest.fixture(scope="module")
def prof() -> profile.Profile:
    return profile.load_profile("testbed-compile")


def inv_with_homes():
    inv = make_inventory()
    for n in inv.nodes:
        inv.set_home(n.name, f"/home/{n.name}", "1000:1000")
    return inv


def bare_facts(inv, head_id: str | None = None) -> dict[str, HostFacts]:
    facts = {n.name: HostFacts(n.name) for n in inv.nodes}
    facts[inv.head.name].image_id = head_id
    return facts


# ---- the key waits for the image's ID -----------------------------------------------------------


def test_the_same_tag_on_another_image_is_another_key(prof):
    image = "nvcr.io/nvidia/vllm:latest"
    assert compile_cache.key(prof, image, ID) != compile_cache.key(prof, image, BUILT)
    assert compile_cache.factors(prof, image, ID)["image_id"] == ID  # in key.json for people
    assert compile_cache.key(prof, image, None) is None  # not known: no key, never a guess
    assert compile_cache.key(prof, image, "(the head's pulled image)") is None  # an offline plan's stand-in


def test_a_plan_whose_head_lacks_the_image_shows_the_key_pending(prof):
    inv = inv_with_homes()
    plan = make_plan(inv, prof, bare_facts(inv), serving=False, replace=False)
    assert plan.build is not None
    for spec in plan.containers:
        assert any(compile_cache.pending(h) for h in spec.binds)
        assert compile_cache.PENDING in spec.env["VLLM_CACHE_ROOT"]
    text = " ".join(plan.render().split())  # wrapped at ~100 columns
    assert "KEY pending: a hash of the image's ID, known once the image stage has built it" in text
    # with the image on the head, the key is its ID's, shown as the folder it is
    plan = make_plan(inv, prof, bare_facts(inv, ID), serving=False, replace=False)
    key = compile_cache.key(prof, plan.image, ID)
    assert f"/home/{inv.head.name}/.cache/sparkcluster/compile/{key}" in " ".join(plan.render().split())
    assert compile_cache.PENDING not in plan.render()


def test_the_containers_stage_keys_the_cache_by_the_built_images_id(prof):
    inv = inv_with_homes()
    plan = make_plan(inv, prof, bare_facts(inv), serving=False, replace=False)
    owned: dict = {HeadImage: HeadImage({"Id": BUILT})}  # what the image stage read after its build
    r = SimpleNamespace(inv=inv, plan=plan, find=lambda kind: owned.get(kind), put=lambda v: v)
    assert containers.cache_key(r) == compile_cache.key(prof, plan.image, BUILT)
    ready = containers.ready_spec(r, plan.containers[0])
    folder = compile_cache.key_dir(inv.compile_cache(inv.head.name), compile_cache.key(prof, plan.image, BUILT))
    assert ready.binds[folder] == folder and not any(compile_cache.pending(h) for h in ready.binds)
    assert ready == spec_for(inv, prof, inv.head, plan.image, BUILT)  # the spec a later `up` compares to
    done = spec_for(inv, prof, inv.head, plan.image, ID)
    assert containers.ready_spec(r, done) is done  # a known key is kept as planned


# ---- GB10's other JIT caches --------------------------------------------------------------------


def test_gb10s_other_jit_caches_are_kept_in_the_keys_folder(prof):
    inv = inv_with_homes()
    spec = spec_for(inv, prof, inv.head, image_ref(inv, prof), ID)
    folder = compile_cache.key_dir(inv.compile_cache(inv.head.name), compile_cache.key(prof, spec.image, ID))
    for var, sub in {
        "CUDA_CACHE_PATH": "cuda",
        "TVM_FFI_CACHE_DIR": "tvm-ffi",
        "TORCH_EXTENSIONS_DIR": "torch-extensions",
        "CUTE_DSL_CACHE_DIR": "cute-dsl",
        "B12X_COMPILE_CACHE_DIR": "b12x",
    }.items():
        assert spec.env[var] == f"{folder}/{sub}"
        assert var in compile_cache.LOCATION_OR_LOG_ENV  # where, not what: never in the key
    # b12x's extension build stays where b12x accepts it: root's, in the container (its ancestor check)
    assert spec.env["B12X_TRELLIS_BUILD_DIR"] == "/root/.cache/b12x/trellis_build"
    assert not [h for h in spec.binds if h.endswith("/b12x")]


def test_lint_refuses_forwarding_a_new_cache_variable(prof):
    from sparkcluster.config import lint

    bad = prof.model_copy(
        update={"env": prof.env.model_copy(update={"forward": {**prof.env.forward, "CUDA_CACHE_PATH": "/x"}})}
    )
    assert [p for p in lint.lint(bad) if p.rule == "managed-var-forwarded" and "CUDA_CACHE_PATH" in p.message]


# ---- compile_cache = "image" --------------------------------------------------------------------


def test_a_profile_can_use_the_images_caches_in_place(prof):
    inv = inv_with_homes()
    own = prof.model_copy(update={"compile_cache": "image"})
    spec = spec_for(inv, own, inv.head, image_ref(inv, own), ID)
    assert list(spec.binds) == [inv.hf_cache(inv.head.name)]  # the HF cache only
    assert not set(spec.env) & set(compile_cache.ENV)  # the image's own locations stay
    assert json.loads(spec.files["/etc/sparkcluster/agent.json"])["compile_cache"] is None
    plan = make_plan(inv, own, bare_facts(inv, ID), serving=False, replace=False)
    assert not [s for s in plan.steps() if s.action == "compile-cache"]
    with pytest.raises(ValueError):
        prof.model_validate({**prof.model_dump(exclude={"path"}), "compile_cache": "shared"})


# ---- seeded from the image ----------------------------------------------------------------------


def image_cache(tmp_path: Path) -> dict[str, str]:
    """The image's default cache folders, as the seed map names them (here under tmp_path)."""
    vllm = tmp_path / "image" / "root" / ".cache" / "vllm" / "torch_compile_cache" / "abc" / "rank_0_0"
    vllm.mkdir(parents=True)
    (vllm / "model").write_bytes(b"compiled")
    (tmp_path / "image" / "root" / ".triton" / "cache").mkdir(parents=True)  # empty: nothing to copy
    return {
        str(tmp_path / "image" / "root" / ".cache" / "vllm"): "vllm",
        str(tmp_path / "image" / "root" / ".triton" / "cache"): "triton",
        str(tmp_path / "image" / "nowhere"): "cuda",
    }


def test_a_keys_first_start_is_seeded_from_the_images_caches_once(tmp_path):
    folder = tmp_path / ("a" * 16)
    (folder / "vllm").mkdir(parents=True)
    (folder / compile_cache.ABOUT).write_text("{}")
    journal = Journal(str(tmp_path / "journal.jsonl"))
    cfg = {"dir": str(folder), "seed": image_cache(tmp_path)}
    got = compile_reading.seed(cfg, journal)
    assert got == {str(tmp_path / "image" / "root" / ".cache" / "vllm"): 1}
    assert (folder / "vllm" / "torch_compile_cache" / "abc" / "rank_0_0" / "model").read_bytes() == b"compiled"
    entry = json.loads((tmp_path / "journal.jsonl").read_text().splitlines()[-1])
    assert entry["event"] == "compile cache seeded" and entry["key"] == "a" * 16
    # the start that follows reads the seeded files as what it found, not as its own compile
    start = compile_reading.StartReading({"dir": str(folder)}, str(tmp_path / "serve.log"))
    assert start.files_before == 1
    # once: a later container of the same key (the engine may have removed files) is not seeded again
    (folder / "vllm" / "torch_compile_cache" / "abc" / "rank_0_0" / "model").unlink()
    assert compile_reading.seed(cfg, journal) == {}


def test_a_key_with_compiled_files_is_never_seeded_over(tmp_path):
    folder = tmp_path / ("b" * 16)
    (folder / "vllm").mkdir(parents=True)
    (folder / "vllm" / "mine").write_bytes(b"compiled here")
    assert compile_reading.seed({"dir": str(folder), "seed": image_cache(tmp_path)}, None) == {}
    assert not (folder / "vllm" / "torch_compile_cache").exists()
    assert compile_reading.seed(None, None) == {} and compile_reading.seed({"dir": str(folder)}, None) == {}


def test_the_seed_map_names_each_tools_default_for_the_images_user():
    # every seed lands in a folder the key's variables point at (or inside one)
    for dest in compile_cache.SEEDS.values():
        assert dest.split("/")[0] in compile_cache.ENV.values()
    # a folder mounted over the image's own cannot be read, so is not seeded
    assert not set(compile_cache.SEEDS) & set(compile_cache.DEFAULT_DIRS)


# ---- eviction spares a key in use ---------------------------------------------------------------


def sh(cmd: str) -> dict:
    out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, check=True, timeout=60).stdout
    return json.loads(out.strip().splitlines()[-1])


def fill(root: Path, key: str, size: int) -> None:
    sh(compile_caches.prepare_command(str(root), key, 1 << 40, {}))
    (root / key / "vllm" / "blob").write_bytes(b"\0" * size)


def test_eviction_and_purge_never_take_a_key_a_running_container_holds(tmp_path):
    fill(tmp_path, "a" * 16, 4000)
    fill(tmp_path, "b" * 16, 4000)
    held = compile_reading.hold({"dir": str(tmp_path / ("a" * 16))})  # a running container's agent
    assert held is not None
    got = sh(compile_caches.prepare_command(str(tmp_path), "c" * 16, 1000, {}))
    assert [e["key"] for e in got["evicted"]] == ["b" * 16]  # over the cap, yet "a" is in use
    assert got["errors"] == [f"{'a' * 16}: in use by a running container (kept)"]
    assert (tmp_path / ("a" * 16) / "vllm" / "blob").exists()
    got = sh(compile_caches.purge_command(str(tmp_path)))
    assert [r["key"] for r in got["removed"]] == ["c" * 16] and (tmp_path / ("a" * 16)).exists()
    held.close()  # the container stops: the kernel drops its lock
    got = sh(compile_caches.purge_command(str(tmp_path)))
    assert [r["key"] for r in got["removed"]] == ["a" * 16]


def test_the_agent_holds_its_key_shared_so_two_containers_of_one_key_may_run(tmp_path):
    folder = tmp_path / ("d" * 16)
    folder.mkdir()
    one, two = compile_reading.hold({"dir": str(folder)}), compile_reading.hold({"dir": str(folder)})
    assert one is not None and two is not None
    with open(folder / compile_cache.IN_USE) as f, pytest.raises(OSError):
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    one.close()
    two.close()
    assert compile_reading.hold(None) is None
    assert compile_reading.count_files(str(folder)) == 0  # the lock file is ours, not compiled code
