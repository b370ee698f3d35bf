"""A profile written as a sparkrun v2 recipe (`profile export --format sparkrun`): what sparkrun reads
(spark-arena/sparkrun RECIPES.md and core/recipe.py, v0.2.40): `model`, `runtime`, `container`,
`min_nodes`, `defaults` (its `{key}` placeholders), `env`, `command` and `executor_config`.
JSON flag values go into `defaults` and come back through a placeholder, as sparkrun's own recipes do:
its substitution leaves a `{...}` in the command that is not a `{key}` alone, but its 0.3 series
collapses `{{` after substituting (FORMATS.md, "v1 vs v2")."""

from __future__ import annotations

import json
import shlex

import yaml

from sparkcluster.config.flags import serve_argv
from sparkcluster.config.profile import Profile

# serve flags that become sparkrun `defaults` keys (sparkrun's known keys keep their names)
_DEFAULT_KEYS = {
    "--tensor-parallel-size": "tensor_parallel",
    "--pipeline-parallel-size": "pipeline_parallel",
    "--gpu-memory-utilization": "gpu_memory_utilization",
    "--max-model-len": "max_model_len",
    "--served-model-name": "served_model_name",
    "--kv-cache-dtype": "kv_cache_dtype",
}


def _placeholder(flag: str) -> str:
    return _DEFAULT_KEYS.get(flag, flag[2:].replace("-", "_"))


def sparkrun_recipe(prof: Profile) -> str:
    argv = serve_argv(prof, "ngc", port=8000)[2:]  # after `vllm serve`
    defaults: dict = {"port": 8000, "host": prof.serve.host}
    words = ["vllm", "serve", "{model}"]
    i = 1  # argv[0] is the model
    while i < len(argv):
        flag = argv[i]
        has_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
        value = argv[i + 1] if has_value else None
        i += 2 if has_value else 1
        if flag in ("--host", "--port"):
            words += [flag, "{" + flag[2:] + "}"]
            continue
        if flag in ("--distributed-executor-backend",) and prof.executor == "mp":
            continue  # sparkrun's vllm-distributed runtime adds its own launch flags
        if value is None:
            words.append(flag)
        elif flag in _DEFAULT_KEYS or value.startswith("{"):
            key = _placeholder(flag)
            defaults[key] = _scalar(value)
            words += [flag, "{" + key + "}"]
        else:
            words += [flag, value]
    recipe: dict = {
        "recipe_version": "2",
        "model": prof.model,
        "runtime": "vllm",
        "container": prof.image.ref,
        "min_nodes": prof.world_size,
        "metadata": {"description": prof.description or prof.name, "source": f"sparkcluster profile {prof.name}"},
        "defaults": defaults,
    }
    if prof.revision:
        recipe["model_revision"] = prof.revision
    if prof.world_size > 1 and prof.executor == "ray":
        recipe["defaults"]["distributed_executor_backend"] = "ray"
    env = prof.forwarded_env()
    if env:
        recipe["env"] = env
    json_keys = {k for k, v in defaults.items() if isinstance(v, str) and v.startswith("{")}
    recipe["command"] = " \\\n  ".join(_join(words, json_keys)) + "\n"
    ex: dict = {
        "privileged": prof.privileged,
        "gpus": "all",
        "ipc": "host",
        "network": "host",
        "shm_size": prof.shm_size,
    }
    if prof.security_opt:
        ex["security_opt"] = list(prof.security_opt)
    ulimits = []
    if prof.ulimit_stack:
        ulimits.append(f"stack={prof.ulimit_stack}")
    if prof.ulimit_nofile:
        ulimits.append(f"nofile={prof.ulimit_nofile}:{prof.ulimit_nofile}")
    if ulimits:
        ex["ulimit"] = ulimits
    recipe["executor_config"] = ex
    head = f"# sparkrun v2 recipe exported by `sparkcluster profile export --format sparkrun {prof.name}`\n"
    return head + yaml.dump(recipe, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=120)


class _Dumper(yaml.SafeDumper):
    """YAML as sparkrun's recipes are written: a command of several lines as a literal block."""


def _text(dumper: yaml.SafeDumper, value: str):
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _text)


def _scalar(value: str):
    for conv in (int, float):
        try:
            return conv(value)
        except ValueError:
            pass
    if value.startswith("{"):
        return json.dumps(json.loads(value), separators=(", ", ": "))
    return value


def _join(words: list[str], json_keys: set[str]) -> list[str]:
    """One line per flag and its value; `{key}` placeholders are quoted where their value is JSON."""
    lines: list[str] = [" ".join(words[:3])]
    i = 3
    while i < len(words):
        w = words[i]
        if i + 1 < len(words) and not words[i + 1].startswith("--"):
            v = words[i + 1]
            lines.append(f"{w} '{v}'" if v.strip("{}") in json_keys else f"{w} {_quote(v)}")
            i += 2
        else:
            lines.append(w)
            i += 1
    return lines


def _quote(v: str) -> str:
    return v if v.startswith("{") and v.endswith("}") else shlex.quote(v)
