"""`sparkcluster profile import` and `profile export --format sparkrun` (issue 76), on the field's
own recipes: the files of NVIDIA/local-ai-inference-recipes, eugr/spark-vllm-docker, sparkrun's
registries and FujitsuPolycom/sparkring that ../shared/recipes holds (copied exactly; their
repository, path and commit in its SOURCES.md). They are read from there, never copied into the
project (NVIDIA's recipe YAML is marked proprietary)."""

from __future__ import annotations

import hashlib
import http.server
import shutil
import threading
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from sparkcluster.cli.main import main
from sparkcluster.cli.profile_recipes import make
from sparkcluster.config import profile as profiles
from sparkcluster.config.lint import failures, lint
from sparkcluster.container import conformance
from sparkcluster.importer import formats, shell, sources, vllm_args

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared" / "recipes"
NVIDIA = SHARED / "nvidia-local-ai-inference-recipes"
QWEN38 = NVIDIA / "models__qwen__qwen3.8-27b__dgx-spark-2gpu__linux__vllm__128gb__nvfp4__recipe.yaml"
QWEN36 = NVIDIA / "models__qwen__qwen3.6-35b-a3b__dgx-spark__linux__vllm__128gb__recipe.yaml"
QWEN36_PERF = NVIDIA / "models__qwen__qwen3.6-35b-a3b__dgx-spark__linux__vllm__performance.yaml"
DEEPSEEK = NVIDIA / "models__deepseek__deepseek-v4-flash-0731__dgx-spark-2gpu__linux__vllm__fp4-fp8-mixed__recipe.yaml"
MINIMAX_M3 = NVIDIA / "models__minimax__minimax-m3__dgx-spark-4gpu__linux__vllm__128gb__recipe.yaml"
SPARKRUN_MINIMAX = SHARED / "sparkrun" / "official-recipes__minimax-m2.7__minimax-m2.7-nvfp4-vllm.yaml"
SPARKRUN_QWEN = SHARED / "sparkrun" / "official-recipes__qwen3.6__vllm__qwen3.6-35b-a3b-fp8-mtp-vllm.yaml"
REGISTRY = SHARED / "sparkrun" / ".sparkrun__registry.yaml"
EUGR_QWEN = SHARED / "eugr-spark-vllm-docker" / "recipes__qwen3.6-35b-a3b-nvfp4.yaml"
EUGR_NANO = SHARED / "eugr-spark-vllm-docker" / "recipes__nemotron-3-nano-nvfp4.yaml"
SPARKRING_PAIR = SHARED / "sparkring" / "recipes__deepseek-v4-flash-0731-pair.json"

needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/recipes is not beside the checkout")

# the recipes the "done when" names, and the ranks each serves on
DONE_WHEN = [(QWEN38, 2), (QWEN36, 1), (DEEPSEEK, 2), (MINIMAX_M3, 4), (SPARKRUN_MINIMAX, 2), (EUGR_QWEN, 2)]
DONE_WHEN.append((SPARKRING_PAIR, 2))


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(profiles, "USER_PROFILES", Path("~/.config/sparkcluster/profiles"))
    return tmp_path / ".config" / "sparkcluster" / "profiles"


@dataclass
class Ran:
    exit_code: int
    output: str


@pytest.fixture
def run(capsys):
    """The command line as `sparkcluster` runs it (cli/main: errors as one line and a fix, exit codes)."""

    def invoke(*argv: str) -> Ran:
        rc = main(list(argv))
        out = capsys.readouterr()
        return Ran(rc, out.out + out.err)

    return invoke


# ---- the command line as vLLM reads it -----------------------------------------------------------


def test_vllm_reads_underscores_dots_and_short_forms():
    p = vllm_args.parse_serve(
        [
            "org/model",
            "-tp",
            "2",
            "--max_model_len=4096",
            "--speculative-config.method",
            "mtp",
            "--speculative_config.num_speculative_tokens=3",
            "--no-enable-prefix-caching",
            "--enforce-eager",
            "--load-format",
            "fastsafetensors",
        ]
    )
    assert p.model == "org/model"
    assert p.serve["tensor_parallel_size"] == 2 and p.serve["max_model_len"] == 4096
    assert p.serve["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 3}
    assert p.serve["enable_prefix_caching"] is False and p.serve["enforce_eager"] is True
    assert p.extra == ["--load-format", "fastsafetensors"] and p.unknown == []


def test_launch_flags_are_dropped_and_an_unknown_flag_is_named_not_dropped():
    p = vllm_args.parse_serve(
        ["m", "--nnodes", "2", "--node-rank", "$NODE_RANK", "--headless", "--no-such-flag", "1", "--port", "8000"]
    )
    assert set(p.launch) == {"--nnodes", "--node-rank", "--headless"}
    assert p.unknown == ["--no-such-flag 1"] and p.extra == ["--no-such-flag", "1"]
    assert p.placeholders == []  # a rank's own placeholder goes with its flag


def test_shell_exports_and_inline_variables_become_variables():
    script = shell.read('export A="1"\nB=2 C=x \\\n  vllm serve m \\\n  --port 8000  # comment\n')
    assert script.exports == {"A": "1"}
    (cmd,) = script.commands
    assert cmd.env == {"B": "2", "C": "x"} and cmd.argv == ["vllm", "serve", "m", "--port", "8000"]


# ---- the field's recipes -------------------------------------------------------------------------


@needs_shared
@pytest.mark.parametrize("path,ranks", DONE_WHEN, ids=lambda x: x.name if isinstance(x, Path) else str(x))
def test_each_recipe_imports_to_a_profile_that_lints(path, ranks):
    imp = make(str(path)).imported
    assert imp.profile.world_size == ranks
    assert not failures(lint(imp.profile)), [p.line() for p in lint(imp.profile)]


@needs_shared
def test_nvidia_two_spark_recipe_maps_its_command_env_and_docker_options():
    imp = make(str(QWEN38)).imported
    p = imp.profile
    assert p.model == "nvidia/Qwen3.8-27B-NVFP4" and p.image.ref == "vllm/vllm-openai:v0.28.0"
    assert p.executor == "mp" and p.serve.tensor_parallel_size == 2
    assert p.env.forward["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"  # serve.command's export
    assert p.env.forward["NCCL_IB_DISABLE"] == "0"  # setup_command's -e
    assert "NCCL_SOCKET_IFNAME" not in p.env.forward  # per node: the inventory's
    assert p.privileged and p.shm_size == "16g" and p.ulimit_stack == 67108864
    assert p.serve.speculative_config["method"] == "dflash"
    named = {u.item for u in imp.unmapped}
    assert "-e HF_TOKEN" in named and "-e NODE_RANK=$NODE_RANK" in named


@needs_shared
def test_a_stale_performance_record_is_named_not_written():
    imp = make(str(DEEPSEEK)).imported
    assert imp.perf is None
    assert any(u.item == "performance.yaml" and "another version" in u.why for u in imp.unmapped)


@needs_shared
def test_a_performance_record_for_this_very_recipe_is_written(tmp_path, home, run):
    """NVIDIA's recipe_sha256 is the sha256 of recipe.yaml after its SPDX header (FORMATS.md): a
    performance.yaml that names this recipe's hash becomes the profile's record."""
    recipe = tmp_path / "recipe.yaml"
    shutil.copy(QWEN36, recipe)
    ours = hashlib.sha256(formats.after_spdx_header(recipe.read_bytes())).hexdigest()
    perf = yaml.safe_load(QWEN36_PERF.read_text())
    perf["recipe_sha256"] = ours
    (tmp_path / "performance.yaml").write_text(yaml.safe_dump(perf))
    url = "https://github.com/NVIDIA/local-ai-inference-recipes/blob/" + "d" * 40 + "/models/x/recipe.yaml"
    r = run("profile", "import", str(tmp_path), "--name", "q36", "--source-url", url)
    assert r.exit_code in (0, 1), r.output
    rec = tomllib.loads((home / "q36.perf.toml").read_text())
    assert rec["source"]["recipe_sha256"] == ours and rec["runs"][0]["figures"]["decode_tok_s"] == 94.78


@needs_shared
def test_a_mod_is_named_with_its_line_and_the_profile_written(home, run):
    r = run("profile", "import", str(EUGR_NANO))
    assert r.exit_code == 1, r.output
    assert "line 19: mod mods/nemotron-nano" in r.output
    assert "--reasoning-parser-plugin nano_v3_reasoning_parser.py" in r.output
    assert (home / "nemotron-3-nano-nvfp4.toml").is_file()
    assert "Traceback" not in r.output


@needs_shared
def test_sparkrun_v2_hooks_and_placeholders_are_named(home):
    imp = make(str(SPARKRUN_QWEN)).imported
    assert [u.item for u in imp.unmapped if u.item.startswith("mod ")] == [
        "mod mods/fix-qwen3-coder-next",
        "mod mods/fix-qwen3.5-chat-template",
    ]
    assert imp.profile.serve.speculative_config == {"method": "mtp", "num_speculative_tokens": 2}


@needs_shared
def test_the_registry_manifest_lists_its_recipes_and_writes_nothing(home, run):
    r = run("profile", "import", str(REGISTRY))
    assert r.exit_code == 2, r.output
    assert "registry official: 2 recipe(s)" in r.output
    assert "official-recipes__minimax-m2.7__minimax-m2.7-nvfp4-vllm.yaml" in r.output
    assert not home.exists()


@needs_shared
def test_refusals_write_nothing(tmp_path, home, run):
    local = tmp_path / "r.yaml"
    local.write_text(EUGR_QWEN.read_text().replace("container: vllm-node", "container: vllm-node-tf5"))
    missing = tmp_path / "m.yaml"
    missing.write_text(EUGR_QWEN.read_text().replace("--host {host}", "--host {hostname}"))
    for src, words in [
        (QWEN36_PERF, "is a performance record, not a recipe"),
        (local, "container 'vllm-node-tf5': a local image"),
        (missing, "placeholder {hostname} has no value"),
        (tmp_path / "absent.yaml", "no file or folder"),
    ]:
        r = run("profile", "import", str(src))
        assert r.exit_code == 2 and words in r.output, r.output
        assert "Traceback" not in r.output
    r = run("profile", "import", str(QWEN38), "--hardware", "dgx-spark")
    assert r.exit_code == 2 and "is for hardware 'dgx-spark-2gpu'" in r.output
    assert not home.exists()


@needs_shared
def test_mutable_tags_are_named_and_pinned_where_the_source_states_a_digest(home, run):
    r = run("profile", "import", str(SPARKRUN_MINIMAX))
    assert "image ghcr.io/spark-arena/dgx-vllm-eugr-nightly:latest: a mutable tag" in r.output
    r = run("profile", "import", str(SPARKRING_PAIR), "--pin")
    assert "image pinned: ghcr.io/fujitsupolycom/gb10-vllm-serving@sha256:6fc26fda" in r.output
    r = run("profile", "import", str(DEEPSEEK), "--pin")
    assert r.exit_code == 1 and "--pin eugr/spark-vllm-b12x:latest: the source states no digest" in r.output


@needs_shared
def test_an_existing_profile_of_yours_is_not_overwritten_without_force(home, run):
    assert run("profile", "import", str(EUGR_QWEN), "--name", "mine").exit_code == 1
    r = run("profile", "import", str(EUGR_QWEN), "--name", "mine")
    assert r.exit_code == 2 and "--force" in r.output
    assert run("profile", "import", str(EUGR_QWEN), "--name", "mine", "--force").exit_code == 1


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a):  # no request lines on the test's stderr
        pass


@needs_shared
def test_a_url_is_fetched_with_the_performance_file_beside_it(tmp_path, home, run):
    served = tmp_path / "models" / "qwen"
    served.mkdir(parents=True)
    shutil.copy(QWEN36, served / "recipe.yaml")
    shutil.copy(QWEN36_PERF, served / "performance.yaml")

    def handler(*a, **kw):
        return _Quiet(*a, directory=str(tmp_path), **kw)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/models/qwen/recipe.yaml"
        fetched = sources.fetch(url)
        assert fetched.name == "recipe.yaml" and "performance.yaml" in fetched.neighbours
        r = run("profile", "import", url, "--name", "from-url")
        assert r.exit_code == 1 and (home / "from-url.toml").is_file(), r.output
        assert "performance.yaml: measured with another version of the recipe" in r.output
        r = run("profile", "import", url.replace("recipe.yaml", "gone.yaml"))
        assert r.exit_code == 2 and "HTTP 404" in r.output
    finally:
        server.shutdown()


# ---- the shipped catalogue -----------------------------------------------------------------------


def _shipped_imports() -> list[profiles.Profile]:
    return [p for p in conformance.shipped_profiles() if p.source is not None and p.source.sha256]


def _sample(sha: str) -> Path | None:
    for f in sorted(SHARED.glob("*/*")):
        if f.is_file() and hashlib.sha256(f.read_bytes()).hexdigest() == sha:
            return f
    return None


def test_the_catalogue_has_25_profiles_and_seven_made_by_the_importer():
    assert len(conformance.shipped_profiles()) >= 25
    assert len(_shipped_imports()) >= 7


@needs_shared
@pytest.mark.parametrize("prof", _shipped_imports(), ids=lambda p: p.name)
def test_each_shipped_import_is_what_the_importer_makes_of_its_source(prof):
    sample = _sample(prof.source.sha256)
    if sample is None:
        pytest.skip(f"{prof.name}: its source is not in ../shared/recipes")
    s = prof.source
    url = s.url or f"https://github.com/{s.repo}/blob/{s.commit}/{s.path}"
    w = make(str(sample), name=prof.name, pin=prof.image.digest is not None, source_url=url)
    assert w.imported.text == Path(prof.path).read_text()
    perf = profiles.Path(prof.path).with_name(prof.name + ".perf.toml")
    assert (w.perf_text or None) == (perf.read_text() if perf.is_file() else None)


def _inventory_file(tmp_path: Path, nodes: int) -> Path:
    blocks = ['[cluster]\nname = "imports"\n']
    for i in range(nodes):
        blocks.append(
            f'[[nodes]]\nname = "spark-{"abcd"[i]}"\nrole = "{"head" if i == 0 else "worker"}"\n'
            f'ssh = "spark@192.168.1.{11 + i}"\ncontrol_if = "enp1s0f1np1"\ncontrol_ip = "192.168.100.{10 + i}"\n'
            'data_plane = [ { netdev = "enp1s0f1np1", hca = "rocep1s0f1" } ]\nmemory_gb = 128\n'
        )
    p = tmp_path / f"inv{nodes}.toml"
    p.write_text("\n".join(blocks))
    return p


@needs_shared
@pytest.mark.parametrize("path,ranks", DONE_WHEN, ids=lambda x: x.name if isinstance(x, Path) else str(x))
def test_up_dry_run_of_each_import_carries_the_recipe(path, ranks, tmp_path, home, monkeypatch, run):
    imp = make(str(path)).imported
    r = run("profile", "import", str(path), "--name", "imported")
    assert r.exit_code in (0, 1), r.output
    env = tmp_path / ".env"
    env.write_text("")
    env.chmod(0o600)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("SPARKCLUSTER_ENV_FILE", str(env))
    r = run(
        "--inventory", str(_inventory_file(tmp_path, ranks)), "up", "--profile", "imported", "--dry-run", "--offline"
    )
    assert r.exit_code == 0, r.output
    p = imp.profile
    assert p.model in r.output and p.image.base in r.output
    assert f"--tensor-parallel-size {p.serve.tensor_parallel_size}" in r.output
    for k, v in p.env.forward.items():
        assert f"{k}={v}" in r.output, k
    for flag in p.serve.extra_flags:
        if flag.startswith("--"):
            assert flag in r.output, flag


# ---- export --------------------------------------------------------------------------------------


@needs_shared
@pytest.mark.parametrize("path", [QWEN38, EUGR_QWEN, SPARKRING_PAIR], ids=lambda x: x.name)
def test_an_exported_sparkrun_recipe_imports_back_to_the_same_serving(path, tmp_path, home, run):
    imp = make(str(path)).imported
    assert run("profile", "import", str(path), "--name", "there").exit_code in (0, 1)
    out = tmp_path / "there-vllm.yaml"
    r = run("profile", "export", "there", "--format", "sparkrun", "-o", str(out))
    assert r.exit_code == 0, r.output
    doc = yaml.safe_load(out.read_text())
    assert doc["recipe_version"] == "2" and doc["min_nodes"] == imp.profile.world_size
    back = make(str(out)).imported.profile
    assert back.model == imp.profile.model and back.image.ref == imp.profile.image.ref
    assert back.serve == imp.profile.serve
    assert back.env.forward == imp.profile.env.forward and back.executor == imp.profile.executor


@needs_shared
def test_a_conflicting_tp_and_an_unfilled_placeholder_are_named_with_their_line(tmp_path):
    tp = tmp_path / "tp.yaml"
    tp.write_text(EUGR_QWEN.read_text().replace("--tensor-parallel-size {tensor_parallel}", "--tensor-parallel-size 1"))
    imp = make(str(tp)).imported
    (conflict,) = [u for u in imp.unmapped if u.item == "tensor parallel"]
    assert "conflicting TP: the recipe says 2, its command 1" in conflict.why and conflict.line
    ph = tmp_path / "ph.yaml"
    ph.write_text(SPARKRUN_MINIMAX.read_text().replace("--load-format {load_format}", "--load-format {loader}"))
    (left,) = [u for u in make(str(ph)).imported.unmapped if u.item == "{loader}"]
    assert left.why == "a placeholder left unfilled: no default names it" and left.line == 31


def test_a_value_the_typed_field_cannot_hold_is_no_duplicate():
    base = profiles.load_profile("nemotron")

    def with_extra(*extra: str) -> profiles.Profile:
        serve = base.serve.model_copy(update={"extra_flags": list(extra), "max_model_len": None})
        return base.model_copy(update={"serve": serve})

    assert "duplicate-flag" not in [p.rule for p in lint(with_extra("--max-model-len", "auto"))]
    assert "duplicate-flag" in [p.rule for p in lint(with_extra("--max-model-len", "4096"))]


@needs_shared
def test_hardware_picks_the_recipe_in_a_model_folder(tmp_path, home, run):
    model = tmp_path / "qwen3.6-35b-a3b"
    for hw, src in [("dgx-spark", QWEN36), ("dgx-spark-2gpu", QWEN38)]:
        d = model / hw / "linux" / "vllm" / "128gb"
        d.mkdir(parents=True)
        shutil.copy(src, d / "recipe.yaml")
    r = run("profile", "import", str(model))
    assert r.exit_code == 2 and "2 recipes" in r.output and "--hardware ID" in r.output
    r = run("profile", "import", str(model), "--hardware", "dgx-spark", "--name", "one")
    assert r.exit_code in (0, 1), r.output
    assert profiles.parse((home / "one.toml").read_text(), "one").world_size == 1


@needs_shared
def test_a_worker_that_differs_from_the_head_and_a_key_not_read_are_named(tmp_path):
    text = QWEN38.read_text()
    head, worker = text.split("additional_commands:", 1)
    worker = worker.replace("--max-num-seqs 8", "--max-num-seqs 4")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(head + "additional_commands:" + worker)
    named = {u.item: u.why for u in make(str(recipe)).imported.unmapped}
    assert named["additional_commands worker"] == "the worker's vllm serve differs from the head's: the head's is kept"
    v2 = tmp_path / "v2.yaml"
    v2.write_text(SPARKRUN_MINIMAX.read_text() + "\nexecutor_config:\n  memory_limit: 110g\nwarmup: true\n")
    named = {u.item: u.why for u in make(str(v2)).imported.unmapped}
    assert named["warmup"] == "a key sparkcluster does not read"
    assert named["executor_config.memory_limit"] == "a docker option sparkcluster does not take"
