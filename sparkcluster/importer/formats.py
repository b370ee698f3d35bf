"""Each recipe format read into one `Recipe` (the field-by-field mapping: ../shared/recipes/FORMATS.md
of the project's sources, summarised where each reader is):

- NVIDIA/local-ai-inference-recipes `recipe.yaml` (schema 3 and 4): `runtime.image`, `runtime.setup_command`
  (a `docker run`), `serve.command` (shell: `export` lines, inline `VAR=value`, then `vllm serve`),
  `topology`, `serve.api_model`; its `performance.yaml` beside it when its `recipe_sha256` is the
  recipe's (the sha256 of the bytes after the SPDX header's first blank line);
- eugr/spark-vllm-docker and sparkrun v1 (`recipe_version: "1"`): `container` a local tag built by
  eugr's build-and-copy.sh, `command` a Python `str.format` template over `defaults`, `env`, `mods`;
  the docker options are launch-cluster.sh's, not the recipe's;
- sparkrun v2: `model`, `container`, `min_nodes`, `defaults`, `env`, `command` with `{key}`
  substituted by regex (unresolved ones left as written), `executor_config`, hooks;
- sparkring `sparkring-recipe/v1` JSON: structured `serving` keys, the image by digest in its lock file."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import string
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

import yaml

from sparkcluster.importer import shell
from sparkcluster.importer.vllm_args import LAUNCH, tokens

# eugr's local tags and the image build-and-copy.sh makes each from (eugr/spark-vllm-docker
# build-and-copy.sh and recipes/README.md at 358bf26)
EUGR_TAGS = {"vllm-node": "eugr/spark-vllm:latest", "vllm-node-b12x": "eugr/spark-vllm-b12x:latest"}
MUTABLE_TAGS = ("latest", "nightly", "main", "dev")


@dataclass
class Unmapped:
    line: int | None
    item: str
    why: str

    def text(self) -> str:
        return f"line {self.line}: {self.item}: {self.why}" if self.line else f"{self.item}: {self.why}"


class Refused(Exception):
    """The source cannot be made a profile: nothing is written."""

    def __init__(self, why: str, fix: str):
        super().__init__(why)
        self.why, self.fix = why, fix


@dataclass
class Recipe:
    format: str  # nvidia | eugr | sparkrun-v1 | sparkrun-v2 | sparkring
    name: str
    description: str
    image: str
    model: str | None = None
    image_digest: str | None = None
    vllm_version: str | None = None
    served_names: list[str] = field(default_factory=list)
    serve_argv: list[str] = field(default_factory=list)  # the words after `vllm serve`
    env: dict[str, str] = field(default_factory=dict)
    nodes: int | None = None
    tp: int | None = None  # as the recipe states it outside its command
    docker: shell.DockerRun | None = None
    docker_says: str = ""  # where the docker options come from
    container_command: str = ""
    kind: str | None = None
    unmapped: list[Unmapped] = field(default_factory=list)
    perf: dict | None = None
    hardware: str | None = None
    revision: str | None = None

    def note(self, line: int | None, item: str, why: str) -> None:
        self.unmapped.append(Unmapped(line, item, why))


def key_lines(text: str) -> dict[str, int]:
    """Dotted key -> 1-based line of each mapping key in a YAML (or JSON) document."""
    out: dict[str, int] = {}
    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        return out

    def walk(node, prefix: str) -> None:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                name = f"{prefix}{k.value}"
                out.setdefault(name, k.start_mark.line + 1)
                walk(v, name + ".")

    walk(root, "")
    return out


def line_of(text: str, needle: str, after: int = 0) -> int | None:
    for n, line in enumerate(text.splitlines(), 1):
        if n > after and needle in line:
            return n
    return None


def after_spdx_header(data: bytes) -> bytes:
    """NVIDIA's recipe_sha256 covers the recipe after its SPDX header: the bytes after the first blank line."""
    i = data.find(b"\n\n")
    return data[i + 2 :] if data.startswith(b"#") and i >= 0 else data


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def is_mutable(image: str) -> bool:
    tag = image.rsplit(":", 1)[1] if ":" in image.rsplit("/", 1)[-1] else "latest"
    return tag in MUTABLE_TAGS or "nightly" in image


def detect(text: str, filename: str) -> tuple[str, Any]:
    """(format, parsed document). Refused when it is none of the formats."""
    try:
        doc = json.loads(text) if filename.endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as e:
        raise Refused(
            f"{filename}: neither YAML nor JSON a recipe is written in ({str(e).splitlines()[0]})", "check the file"
        ) from None
    if not isinstance(doc, dict):
        raise Refused(f"{filename}: not a recipe (a mapping of fields)", "name a recipe file")
    if str(doc.get("schema", "")).startswith("sparkring-recipe/"):
        return "sparkring", doc
    if "registries" in doc:
        return "registry", doc
    if "schema_version" in doc and isinstance(doc.get("serve"), dict) and isinstance(doc.get("runtime"), dict):
        return "nvidia", doc
    if "schema_version" in doc and "profiles" in doc and "recipe_sha256" in doc:
        raise Refused(f"{filename} is a performance record, not a recipe", "name the recipe.yaml beside it")
    version = str(doc.get("recipe_version", doc.get("sparkrun_version", "")))
    if version == "1" and "container" in doc and "command" in doc:
        return "eugr", doc
    if version in ("2", "") and "model" in doc and ("container" in doc or "command" in doc):
        return "sparkrun-v2", doc
    raise Refused(
        f"{filename}: not a recipe format sparkcluster reads",
        "import an NVIDIA recipe.yaml, an eugr or sparkrun recipe, or a sparkring recipe JSON",
    )


def _slug(text: str) -> str:
    s = re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-.")
    return s[:63] or "imported"


def _serve_words(argv: list[str]) -> list[str] | None:
    for i in range(len(argv) - 1):
        if PurePosixPath(argv[i]).name == "vllm" and argv[i + 1] == "serve":
            return argv[i + 2 :]
    return None


def _docker_env(rec: Recipe, run: shell.DockerRun, text: str, base_line: int, managed: tuple[str, ...]) -> None:
    for k, v in run.env.items():
        line = line_of(text, f"{k}=", base_line)
        if k in ("HF_TOKEN", "VLLM_API_KEY"):
            rec.note(line, f"-e {k}", "a secret: sparkcluster passes it from your .env, never in the profile")
        elif k in managed:
            rec.note(line, f"-e {k}", "per node: sparkcluster sets it from the inventory")
        elif "$" in v or "<" in v:
            rec.note(line, f"-e {k}={v}", "a placeholder left unfilled (a per-node value): not forwarded")
        else:
            rec.env.setdefault(k, v)


def _shell_env(rec: Recipe, exports: dict[str, str], text: str, base_line: int, managed: tuple[str, ...]) -> None:
    for k, v in exports.items():
        line = line_of(text, f"{k}=", base_line)
        if k in managed:
            rec.note(line, k, "per node: sparkcluster sets it from the inventory")
        elif "$" in v or "<" in v:
            rec.note(line, f"{k}={v}", "a placeholder left unfilled: not forwarded")
        else:
            rec.env[k] = v


def read_nvidia(doc: dict, text: str, managed: tuple[str, ...]) -> Recipe:
    lines = key_lines(text)
    runtime, serve, topo = doc.get("runtime") or {}, doc.get("serve") or {}, doc.get("topology") or {}
    image = str(runtime.get("image") or "")
    if not image:
        raise Refused("the recipe names no runtime.image", "add runtime.image to the recipe")
    rec = Recipe(
        "nvidia",
        _slug(f"{str(doc.get('model', 'model')).split('/')[-1]}-{doc.get('hardware', '')}"),
        str(doc.get("title") or ""),
        image,
        vllm_version=str(doc["backend_version"]) if doc.get("backend_version") else None,
        nodes=topo.get("node_count"),
        tp=topo.get("tensor_parallel_size"),
        hardware=doc.get("hardware"),
    )
    if doc.get("backend") not in (None, "vllm"):
        raise Refused(f"backend {doc.get('backend')!r}: sparkcluster serves vLLM", "import a vLLM recipe")
    setup = str(runtime.get("setup_command") or "")
    if setup:
        base = lines.get("runtime.setup_command", 0)
        script = shell.read(setup)
        for c in script.commands:
            run = shell.docker_run(c.argv)
            if run:
                img = run.image or ""
                for k, v in script.exports.items():
                    img = img.replace(f"${k}", v).replace(f"${{{k}}}", v)
                if img and img != image:
                    rec.note(base + c.line, "docker run image", f"{img} differs from runtime.image {image}")
                rec.docker, rec.docker_says = run, "runtime.setup_command"
                rec.container_command = (
                    "an interactive shell (docker run --rm -it) on every node: serve.command's `vllm serve` "
                    "typed in the head's, the worker's with --headless"
                    if run.interactive
                    else shlex_join(run.command) or "the image's own command"
                )
                _docker_env(rec, run, text, base, managed)
                for opt in run.unknown:
                    rec.note(line_of(text, opt.split()[0], base), opt, "a docker option sparkcluster does not take")
                for vol in run.volumes:
                    rec.note(
                        line_of(text, "-v", base),
                        f"-v {vol}",
                        "a mount: sparkcluster mounts the HF cache and its own caches",
                    )
    command = str(serve.get("command") or "")
    base = lines.get("serve.command", 0)
    script = shell.read(command)
    for n, why in script.errors:
        rec.note(base + n, "serve.command", f"not shell words: {why}")
    _shell_env(rec, script.exports, text, base, managed)
    for c in script.commands:
        words = _serve_words(c.argv)
        if words is None:
            rec.note(base + c.line, shlex_join(c.argv[:3]), "a command before serve: sparkcluster runs only vllm serve")
            continue
        _shell_env(rec, c.env, text, base, managed)
        rec.serve_argv = words
        break
    if not rec.serve_argv:
        raise Refused("serve.command runs no `vllm serve`", "check the recipe's serve.command")
    api = serve.get("api_model")
    if api:
        rec.served_names = [str(api)]
    for extra in serve.get("additional_commands") or []:
        where = lines.get("serve.additional_commands")
        if extra.get("target") != "workers":
            rec.note(where, f"additional_commands {extra.get('id')}", "not a worker's launch")
            continue
        cmds = shell.read(str(extra.get("command") or "")).commands
        words = next((w for c in cmds if (w := _serve_words(c.argv)) is not None), None)
        if words is not None and _without_launch(words) != _without_launch(rec.serve_argv):
            rec.note(
                where,
                f"additional_commands {extra.get('id')}",
                "the worker's vllm serve differs from the head's: the head's is kept",
            )
    for k in ("limitations", "security", "sampling", "concurrency"):
        if doc.get(k):
            rec.note(lines.get(k), k, "advisory: not a setting sparkcluster applies")
    return rec


def _without_launch(words: list[str]) -> list[str]:
    """A rank's `vllm serve` words without the flags that differ per rank (`vllm_args.LAUNCH`)."""
    return [w for flag, _v, w in tokens(words) if flag not in LAUNCH]


def _unread(rec: Recipe, doc: dict, known: frozenset[str], lines: dict[str, int], prefix: str = "") -> None:
    for k in doc:
        if k not in known:
            rec.note(lines.get(prefix + str(k)), prefix + str(k), "a key sparkcluster does not read")


EUGR_KEYS = frozenset(
    """recipe_version name description model container build_args mods cluster_only solo_only defaults env
    command""".split()
)
SPARKRUN_KEYS = frozenset(
    """recipe_version sparkrun_version model model_revision runtime runtime_version container min_nodes max_nodes
    mode solo_only cluster_only defaults env command metadata mods pre_exec post_exec post_commands
    stop_after_post builder builder_config executor_config distribution_config runtime_config benchmark
    executor name""".split()
)
EXECUTOR_KEYS = frozenset("privileged gpus ipc network shm_size entrypoint cap_add security_opt devices".split())
SPARKRING_KEYS = frozenset("schema recipe_id status hardware model runtime serving transport evidence".split())


def shlex_join(words: list[str]) -> str:
    return shlex.join(words)


def _eugr_render(template: str, values: dict[str, Any]) -> str:
    """Python's str.format, as eugr's run-recipe.py renders `command` (`{{`/`}}` literal braces)."""
    missing = [f for _, f, _, _ in string.Formatter().parse(template) if f and f not in values]
    if missing:
        raise Refused(
            f"command: placeholder {{{missing[0]}}} has no value in defaults",
            f"add {missing[0]} to the recipe's defaults",
        )
    return template.format(**values)


_SPARKRUN_KEY = re.compile(r"\{(\w+)\}")


def _sparkrun_render(template: str, values: dict[str, Any]) -> tuple[str, list[str]]:
    """sparkrun's substitution: `{key}` replaced where defaults (or model) name it, others left as written."""
    left: list[str] = []

    def sub(m: re.Match) -> str:
        if m.group(1) in values:
            return str(values[m.group(1)])
        left.append(m.group(0))
        return m.group(0)

    return _SPARKRUN_KEY.sub(sub, template), left


# sparkrun's defaults that become flags when a recipe has no command (RECIPES.md, v0.2.40)
_DEFAULT_FLAGS = {
    "tensor_parallel": "--tensor-parallel-size",
    "pipeline_parallel": "--pipeline-parallel-size",
}


def _command_words(rec: Recipe, rendered: str, base: int) -> None:
    script = shell.read(rendered)
    for n, why in script.errors:
        rec.note(base + n, "command", f"not shell words: {why}")
    for k, v in {**script.exports}.items():
        rec.env.setdefault(k, v)
    for c in script.commands:
        words = _serve_words(c.argv)
        if words is not None:
            rec.env.update(c.env)
            rec.serve_argv = words
            return
        rec.note(base + c.line, shlex_join(c.argv[:3]), "a command before serve: sparkcluster runs only vllm serve")
    raise Refused("command runs no `vllm serve`", "import a vLLM recipe")


def _hooks(rec: Recipe, doc: dict, lines: dict[str, int]) -> None:
    for mod in doc.get("mods") or []:
        rec.note(
            lines.get("mods"),
            f"mod {mod}",
            "runs its run.sh in every container before serve (it may patch vLLM or fetch files): "
            "sparkcluster runs no such code; the profile serves without it",
        )
    for hook in ("pre_exec", "post_exec", "post_commands"):
        if doc.get(hook):
            rec.note(lines.get(hook), hook, "a hook script: sparkcluster runs no such code")
    if doc.get("build_args"):
        rec.note(lines.get("build_args"), f"build_args {doc['build_args']}", "an image build: pulled instead")
    if doc.get("builder") or doc.get("builder_config"):
        rec.note(lines.get("builder"), "builder", "an image build: the container ref is pulled instead")
    if doc.get("distribution_config"):
        rec.note(lines.get("distribution_config"), "distribution_config", "sparkcluster moves models and images itself")


def _env_values(rec: Recipe, env: dict | None, lines: dict[str, int]) -> None:
    for k, v in (env or {}).items():
        sv = str(v).lower() if isinstance(v, bool) else str(v)
        if "$" in sv:
            rec.note(lines.get(f"env.{k}"), f"env {k}={sv}", "expanded from the control machine's shell: not forwarded")
        else:
            rec.env[str(k)] = sv


# eugr/spark-vllm-docker launch-cluster.sh at 358bf26: the docker options of every launch
EUGR_LAUNCH = shell.DockerRun(privileged=True, gpus="all", network="host", ipc="host", ulimits={"nofile": "1048576"})
EUGR_LAUNCH.entrypoint = ""


def read_eugr(doc: dict, text: str, stem: str, version_label: str = "eugr") -> Recipe:
    lines = key_lines(text)
    tag = str(doc.get("container") or "")
    image = EUGR_TAGS.get(tag)
    if image is None:
        raise Refused(
            f"container {tag!r}: a local image eugr's build-and-copy.sh builds; sparkcluster knows the registry "
            f"images of {', '.join(EUGR_TAGS)} only",
            "push the built image to a registry and write its ref into the profile's [image] after import "
            "of a recipe naming vllm-node",
        )
    rec = Recipe(version_label, _slug(stem), str(doc.get("description") or doc.get("name") or ""), image)
    rec.model = doc.get("model")
    rec.note(
        lines.get("container"),
        f"container {tag}",
        f"a local tag eugr's build-and-copy.sh makes from {image}: pulled as that",
    )
    defaults = dict(doc.get("defaults") or {})
    rendered = _eugr_render(str(doc.get("command") or ""), defaults)
    _command_words(rec, rendered, lines.get("command", 0))
    _env_values(rec, doc.get("env"), lines)
    _hooks(rec, doc, lines)
    if doc.get("solo_only"):
        rec.nodes = 1
    rec.tp = defaults.get("tensor_parallel")
    _unread(rec, doc, EUGR_KEYS | {"benchmark"}, lines)
    if doc.get("benchmark"):
        rec.note(lines.get("benchmark"), "benchmark", "how to measure (llama-benchy arguments), no figures")
    rec.docker, rec.docker_says = EUGR_LAUNCH, "launch-cluster.sh"
    rec.container_command = (
        "launch-cluster.sh's script: the recipe's env exported, then its command (str.format of defaults)"
    )
    rec.kind = "ngc"
    return rec


def read_sparkrun(doc: dict, text: str, stem: str) -> Recipe:
    lines = key_lines(text)
    image = str(doc.get("container") or "")
    if not image:
        raise Refused("the recipe names no container", "add container: an image ref")
    runtime = str(doc.get("runtime") or "vllm")
    if runtime not in ("vllm", "vllm-ray", "vllm-distributed", "eugr-vllm"):
        raise Refused(f"runtime {runtime!r}: sparkcluster serves vLLM", "import a vLLM recipe")
    meta = doc.get("metadata") or {}
    rec = Recipe("sparkrun-v2", _slug(stem), str(meta.get("description") or ""), image)
    rec.model = str(doc["model"])
    rec.revision = doc.get("model_revision")
    defaults = dict(doc.get("defaults") or {})
    values = {**defaults, "model": rec.model}
    command = doc.get("command")
    if command:
        rendered, left = _sparkrun_render(str(command), values)
        for ph in left:
            rec.note(line_of(text, ph), ph, "a placeholder left unfilled: no default names it")
    else:
        words = ["vllm", "serve", rec.model]
        for k, v in defaults.items():
            words += [_DEFAULT_FLAGS.get(k, "--" + k.replace("_", "-")), str(v)]
        rendered = shlex_join(words)
    _command_words(rec, rendered, lines.get("command", 0))
    if defaults.get("served_model_name") and "--served-model-name" not in rendered:
        rec.served_names = [str(defaults["served_model_name"])]
    _env_values(rec, doc.get("env"), lines)
    _hooks(rec, doc, lines)
    rec.nodes = doc.get("min_nodes")
    rec.tp = defaults.get("tensor_parallel")
    _unread(rec, doc, SPARKRUN_KEYS, lines)
    if doc.get("max_nodes") and doc.get("max_nodes") != doc.get("min_nodes"):
        rec.note(
            lines.get("max_nodes"), f"max_nodes {doc['max_nodes']}", "one rank per node: the command's TP x PP is kept"
        )
    ex = doc.get("executor_config") or {}
    for k in ex:
        if k not in EXECUTOR_KEYS:
            rec.note(
                lines.get(f"executor_config.{k}"), f"executor_config.{k}", "a docker option sparkcluster does not take"
            )
    run = shell.DockerRun(
        privileged=bool(ex.get("privileged", True)),
        gpus=str(ex.get("gpus", "all")),
        network=str(ex.get("network", "host")),
        ipc=str(ex.get("ipc", "host")),
        shm_size=str(ex["shm_size"]) if ex.get("shm_size") else None,
    )
    run.cap_add = list(ex.get("cap_add") or [])
    run.security_opt = list(ex.get("security_opt") or [])
    run.devices = list(ex.get("devices") or [])
    if "entrypoint" in ex:
        run.entrypoint = str(ex["entrypoint"])
    rec.docker, rec.docker_says = run, "executor_config (sparkrun's defaults where it says nothing)"
    rec.container_command = "sparkrun's launcher: `vllm serve` with the rendered command"
    rec.kind = "ngc"
    if meta.get("spark_arena_benchmarks"):
        rec.note(
            lines.get("metadata"),
            "metadata.spark_arena_benchmarks",
            "figures kept on spark-arena.com, not in the recipe",
        )
    if doc.get("benchmark"):
        rec.note(
            lines.get("benchmark"),
            "benchmark",
            "how to measure (llama-benchy arguments), no figures: no record written",
        )
    return rec


# what sparkring's launcher adds to a recipe's serving keys: its `docker run` options and
# --enable-auto-tool-choice beside the tool-call parser (FujitsuPolycom/sparkring
# scripts/deepseek_v4_pair_serve.sh at 12b188ebb159d626cbacf290db74942d70c9ac0d)
SPARKRING_LAUNCH = "scripts/deepseek_v4_pair_serve.sh"
_SPARKRING_SKIP = {"node_count", "sizing_note", "external_kv_cache", "sircl"}


def read_sparkring(doc: dict, text: str, lock: dict | None) -> Recipe:
    lines = key_lines(text)
    serving = dict(doc.get("serving") or {})
    runtime = doc.get("runtime") or {}
    image = digest = None
    if lock:
        img = lock.get("serving_image") or lock.get("base_image") or {}
        if img.get("repository"):
            image = f"{img['repository']}:{img.get('tag_for_humans') or 'latest'}"
            digest = img.get("manifest_digest")
    if image is None:
        raise Refused(
            f"runtime.image_lock {runtime.get('image_lock')!r}: the lock file is not beside the recipe",
            "import from a checkout of the sparkring repository (its runtime/ folder holds the lock)",
        )
    model = doc.get("model") or {}
    rec = Recipe("sparkring", _slug(str(doc.get("recipe_id") or "sparkring")), str(doc.get("recipe_id") or ""), image)
    rec.image_digest = digest
    rec.model = model.get("repository")
    rec.revision = model.get("revision")
    rec.nodes = serving.get("node_count") or (doc.get("hardware") or {}).get("ranks")
    rec.tp = serving.get("tensor_parallel_size")
    words: list[str] = [str(rec.model)]
    for k, v in serving.items():
        if k in _SPARKRING_SKIP:
            if k != "node_count":
                rec.note(lines.get(f"serving.{k}"), f"serving.{k}", "sparkring's own: no vLLM flag")
            continue
        flag = {"speculation": "--speculative-config", "kv_cache_memory_bytes_per_rank": "--kv-cache-memory-bytes"}.get(
            k, "--" + k.replace("_", "-")
        )
        if isinstance(v, bool):
            words += [flag] if v else []
        elif isinstance(v, dict):
            words += [flag, json.dumps(v, separators=(",", ":"))]
        else:
            words += [flag, str(v)]
    if serving.get("tool_call_parser"):
        words.append("--enable-auto-tool-choice")  # the launcher passes it beside the parser (SPARKRING_LAUNCH)
    rec.serve_argv = words
    _unread(rec, doc, SPARKRING_KEYS, lines)
    if runtime.get("environment_template"):
        rec.note(
            lines.get("runtime.environment_template"),
            f"runtime.environment_template {runtime['environment_template']}",
            "a docker --env-file with <placeholders> for sparkring's transport: not read",
        )
    if doc.get("transport"):
        rec.note(lines.get("transport"), "transport", "sparkring's patched NCCL transport: not applied")
    rec.docker = shell.DockerRun(
        gpus="all",
        network="host",
        ipc="host",
        shm_size="16g",
        ulimits={"memlock": "-1:-1"},
        devices=["/dev/infiniband"],
    )
    rec.docker.entrypoint = runtime.get("entrypoint")
    rec.docker_says = f"sparkring's launcher, {SPARKRING_LAUNCH}"
    rec.container_command = f"{runtime.get('entrypoint', 'vllm')} serve with the recipe's serving keys as flags"
    rec.kind = "vllm-openai"  # the image's own entrypoint attests another model: sparkring overrides it
    evidence = doc.get("evidence") or {}
    if evidence.get("result"):
        rec.note(lines.get("evidence"), "evidence.result", "prose figures, not a measurement record")
    return rec
