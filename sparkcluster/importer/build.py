"""A `Recipe` made a profile: its TOML text (validated by the profile's own model), the data of a
performance record where the source has one for this exact recipe, and every field that did not map."""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from sparkcluster.config import profile as profiles
from sparkcluster.config.lint import DEFAULT_STEP_TOKENS, MAX_GPU_MEMORY_UTILIZATION, Problem, lint, supervisor_bounds
from sparkcluster.container import conformance
from sparkcluster.errors import InputError
from sparkcluster.importer import formats, sources, vllm_args
from sparkcluster.importer.formats import Recipe, Refused, Unmapped

MANAGED = profiles.MANAGED_VARS + ("MN_IF_NAME", "TP_SOCKET_IFNAME")


@dataclass
class Imported:
    name: str
    format: str
    text: str  # the profile's TOML
    profile: profiles.Profile
    perf: dict | None = None  # a performance record's fields (bench/perf_record.PerfRecord)
    unmapped: list[Unmapped] = field(default_factory=list)
    mutable: str | None = None  # the image ref, where its tag moves
    problems: list[Problem] = field(default_factory=list)  # lint's


def read(fetched: sources.Fetched, hardware: str | None = None) -> Recipe:
    text = fetched.data.decode("utf-8", errors="replace")
    kind, doc = formats.detect(text, fetched.name)
    stem = re.sub(r"\.(ya?ml|json)$", "", fetched.name.rsplit("__", 1)[-1])
    if kind == "registry":
        raise Refused("a sparkrun registry manifest, not a recipe", "import one of the recipes it lists")
    if kind == "nvidia":
        rec = formats.read_nvidia(doc, text, MANAGED)
        if hardware and rec.hardware != hardware:
            raise Refused(
                f"the recipe is for hardware {rec.hardware!r}, not {hardware!r}",
                f"import the recipe under {hardware}/ in the same model's folder",
            )
        perf = fetched.neighbours.get("performance.yaml")
        if perf is not None:
            rec.perf = _nvidia_perf(rec, fetched, perf)
        return rec
    if kind == "eugr":
        return formats.read_eugr(doc, text, stem)
    if kind == "sparkrun-v2":
        return formats.read_sparkrun(doc, text, stem)
    lock = fetched.neighbours.get("lock")
    return formats.read_sparkring(doc, text, json.loads(lock) if lock else None)


def _nvidia_perf(rec: Recipe, fetched: sources.Fetched, data: bytes) -> dict | None:
    try:
        perf = yaml.safe_load(data)
    except yaml.YAMLError:
        rec.note(None, "performance.yaml", "not YAML: no record written")
        return None
    ours = formats.sha256(formats.after_spdx_header(fetched.data))
    if not isinstance(perf, dict) or perf.get("recipe_sha256") != ours:
        rec.note(
            None,
            "performance.yaml",
            f"measured with another version of the recipe (its recipe_sha256 {str(perf.get('recipe_sha256'))[:12]}…, "
            f"this recipe's {ours[:12]}…): no record written",
        )
        return None
    system, software, harness = perf.get("system") or {}, perf.get("software") or {}, perf.get("harness") or {}
    o = fetched.origin
    recipe_url = o.url or (f"https://github.com/{o.repo}/blob/{o.commit}/{o.path}" if o.repo else None)
    perf_url = recipe_url.rsplit("/", 1)[0] + "/performance.yaml" if recipe_url else None
    if perf_url is None:
        rec.note(
            None, "performance.yaml", "the recipe's published address is unknown (--source-url): no record written"
        )
        return None
    comment = next((ln.lstrip("# ").strip() for ln in data.decode().splitlines() if "measured on" in ln), "")
    runs = []
    for p in perf.get("profiles") or []:
        w, r = p.get("workload") or {}, p.get("results") or {}
        figures = {
            "decode_tok_s": r.get("decode_tokens_per_second_mean"),
            "prefill_tok_s": r.get("prefill_tokens_per_second_mean"),
            "e2e_latency_ms_mean": r.get("e2e_latency_ms_mean"),
        }
        cond = {
            "input_tokens": w.get("input_tokens"),
            "output_tokens": w.get("output_tokens"),
            "concurrency": w.get("concurrency"),
            "dataset": w.get("dataset"),
            "dataset_subset": w.get("profile"),
            "requests": w.get("requests"),
            "warmup_requests": w.get("warmup_requests"),
            "context_tokens": w.get("context_tokens"),
            "input_tokens_min": w.get("input_tokens_min"),
            "input_tokens_max": w.get("input_tokens_max"),
        }
        runs.append(
            {
                "id": p.get("id"),
                "repetitions": 1,
                "conditions": {k: v for k, v in cond.items() if v is not None},
                "figures": {k: float(v) for k, v in figures.items() if v is not None},
            }
        )
    count = int(system.get("accelerator_count") or 1)
    return {
        "kind": "published",
        "source": {
            "url": perf_url,
            "measured_at": perf.get("measured_at"),
            "publisher": o.repo or "",
            "recipe_url": recipe_url,
            "recipe_sha256": ours,
            "note": f"{comment}; status: {perf.get('status')}, launch_id: {perf.get('launch_id')}".strip("; "),
        },
        "hardware": {
            "nodes": count,
            "gpus": count,
            "accelerator": system.get("accelerator") or "NVIDIA GB10",
            "label": system.get("label") or "",
        },
        "harness": {"name": harness.get("name"), "version": str(harness.get("version"))},
        "software": {
            "backend": "vllm",
            "backend_version": software.get("backend_version"),
            "image": rec.image,
            "image_digest": software.get("runtime_revision"),
            "driver": system.get("driver_version"),
            "cuda": system.get("cuda_version"),
            "os": system.get("os_version"),
            "model_revision": software.get("model_revision"),
        },
        "runs": runs,
    }


def _size(v: str) -> str:
    v = v.strip().lower()
    return v[:-1] if len(v) > 2 and v.endswith("b") and v[-2] in "kmg" else v


def _int(v: str | None) -> int | None:
    try:
        return int(str(v).split(":")[0]) if v is not None else None
    except ValueError:
        return None


def _image(rec: Recipe) -> dict:
    ref = rec.image.split("@", 1)[0]
    last = ref.rsplit("/", 1)[-1]
    base, tag = ref.rsplit(":", 1) if ":" in last else (ref, "latest")
    out: dict[str, Any] = {"base": base, "tag": tag}
    if rec.vllm_version and re.match(r"^[0-9]+\.[0-9]+", rec.vllm_version):
        if rec.vllm_version.startswith("0.1.dev"):
            # setuptools-scm's number for a build made without a release tag (e.g. NVIDIA's b12x recipe:
            # 0.1.dev20482+g83cb22a0e): no release in it, so no version gate may judge by it
            rec.note(
                None, f"backend_version {rec.vllm_version}", "a development build's number, no release: left unstated"
            )
        else:
            out["vllm_version"] = rec.vllm_version
    out["kind"] = rec.kind or profiles.guess_image_kind(base) or "ngc"
    return out


def _topology(rec: Recipe, p: vllm_args.Parsed, text: str) -> tuple[int, int]:
    tp = p.serve.get("tensor_parallel_size") or rec.tp or 1
    pp = p.serve.get("pipeline_parallel_size") or 1
    if rec.tp and int(rec.tp) != tp:
        rec.note(
            formats.line_of(text, "tensor"),
            "tensor parallel",
            f"conflicting TP: the recipe says {rec.tp}, its command {tp}: the command's is kept",
        )
    if rec.nodes and int(rec.nodes) != tp * pp:
        rec.note(
            None,
            "nodes",
            f"the recipe runs {rec.nodes} node(s), its command {tp * pp} rank(s): one rank per node is kept",
        )
    return tp, pp


def to_profile(rec: Recipe, name: str, text: str, fetched: sources.Fetched) -> tuple[dict, list[str]]:
    """The profile's fields, and the header comment's lines."""
    p = vllm_args.parse_serve(rec.serve_argv)
    model = p.model or rec.model
    if not model:
        raise Refused("the command names no model", "check the recipe's vllm serve line")
    if rec.model and p.model and rec.model != p.model:
        rec.note(
            formats.line_of(text, "model"),
            "model",
            f"{rec.model} (downloaded) is not {p.model} (served): the served one is kept",
        )
    for flag in p.unknown:
        rec.note(
            formats.line_of(text, flag.split()[0]), flag, "a flag vLLM's flag table does not know: kept in extra_flags"
        )
    for flag in p.placeholders:
        rec.note(formats.line_of(text, flag.split()[0]), flag, "a placeholder left unfilled")
    for flag in p.secrets:
        rec.note(
            formats.line_of(text, flag), flag, "a secret on the command line: sparkcluster passes it from your .env"
        )
    if "--reasoning-parser-plugin" in p.extra:
        plugin = p.extra[p.extra.index("--reasoning-parser-plugin") + 1]
        rec.note(
            formats.line_of(text, "--reasoning-parser-plugin"),
            f"--reasoning-parser-plugin {plugin}",
            "a file a mod puts in the container: set serve.reasoning_parser_plugin_url to its https URL",
        )
        i = p.extra.index("--reasoning-parser-plugin")
        del p.extra[i : i + 2]
    tp, pp = _topology(rec, p, text)
    serve = {"tensor_parallel_size": tp, **{k: v for k, v in p.serve.items() if k != "tensor_parallel_size"}}
    if pp == 1:
        serve.pop("pipeline_parallel_size", None)
    backend = p.launch.get("--distributed-executor-backend")
    executor = "ray" if backend == "ray" else "mp"
    if p.extra:
        serve["extra_flags"] = p.extra
    out: dict[str, Any] = {}
    if rec.description:
        out["description"] = rec.description
    out["model"] = model
    names = p.served_names or rec.served_names
    if names and names != [model]:
        out["served_name"] = names[0]
        if names[1:]:
            out["aliases"] = names[1:]
    if rec.revision:
        out["revision"] = rec.revision
    if tp * pp > 1:
        out["executor"] = executor
    d = rec.docker
    if d is not None:
        if d.shm_size:
            out["shm_size"] = _size(d.shm_size)
        if _int(d.ulimits.get("stack")):
            out["ulimit_stack"] = _int(d.ulimits.get("stack"))
        if _int(d.ulimits.get("nofile")):
            out["ulimit_nofile"] = _int(d.ulimits.get("nofile"))
        if d.security_opt:
            out["security_opt"] = list(d.security_opt)
        if d.privileged:
            out["privileged"] = True
    out["image"] = _image(rec)
    env = {k: v for k, v in rec.env.items() if k not in MANAGED}
    for k in rec.env:
        if k in MANAGED:
            rec.note(formats.line_of(text, k), k, "per node: sparkcluster sets it from the inventory")
    if env:
        out["env"] = {"forward": env}
    out["serve"] = serve
    article = "an" if rec.format[0] in "aeiou" else "a"
    header = [f"Imported by `sparkcluster profile import` from {article} {rec.format} recipe:"]
    o = fetched.origin
    header.append(f"  {o.url or (f'{o.repo} {o.path}@{o.commit}' if o.repo else fetched.where)}")
    header.append(f"  sha256 {formats.sha256(fetched.data)}")
    if o.known:
        out["source"] = _source(rec, o, fetched)
    return out, header


def _source(rec: Recipe, o: sources.Origin, fetched: sources.Fetched) -> dict:
    src: dict[str, Any] = {}
    if o.url:
        src["url"] = o.url
    else:
        src.update(repo=o.repo, path=o.path, commit=o.commit)
    src["sha256"] = formats.sha256(fetched.data)
    d = rec.docker or formats.shell.DockerRun()
    c: dict[str, Any] = {}
    if d.privileged:
        c["privileged"] = True
    for k in ("gpus", "ipc", "network", "shm_size"):
        if getattr(d, k):
            c[k] = getattr(d, k)
    if d.ulimits:
        c["ulimits"] = dict(d.ulimits)
    for k in ("devices", "cap_add", "security_opt"):
        if getattr(d, k):
            c[k] = list(getattr(d, k))
    if d.entrypoint is not None:
        c["entrypoint"] = d.entrypoint
    c["command"] = rec.container_command or "the source's launcher"
    src["container"] = c
    return src


def _diverges(prof: profiles.Profile, rec: Recipe) -> dict[str, str]:
    out = {}
    for row in conformance.rows(prof):
        if row.why == conformance.UNEXPLAINED:
            out[row.option] = (
                f"the import keeps sparkcluster's {row.created} where the source's container "
                f"({rec.docker_says}) has {row.source}"
            )
    return out


def build(
    fetched: sources.Fetched, name: str | None = None, hardware: str | None = None, pin: bool = False
) -> Imported:
    rec = read(fetched, hardware)
    name = name or rec.name
    if not re.match(r"^[a-zA-Z0-9][a-zA-Z0-9._-]{0,62}$", name):
        raise Refused(f"not a profile name: {name!r}", "pass --name with letters, digits, '.', '_' or '-'")
    text = fetched.data.decode("utf-8", errors="replace")
    data, header = to_profile(rec, name, text, fetched)
    if pin:
        _pin(rec, data)
    prof = _validate(data, name)
    adjusted = _adjust(prof, data)
    if adjusted:
        header += [f"  adjusted: {a}" for a in adjusted]
        prof = _validate(data, name)
    if prof.source is not None:
        div = _diverges(prof, rec)
        if div:
            data["source"]["diverges"] = div
            prof = _validate(data, name)
    mutable = rec.image if formats.is_mutable(rec.image) else None
    if rec.image_digest:
        header.append(f"  image digest {rec.image_digest} (the source's lock; the tag {rec.image} moves)")
    for u in rec.unmapped:
        header.append(f"  not mapped: {u.text()}")
    body = "\n".join("# " + h if h else "#" for h in header) + "\n" + dumps(data)
    return Imported(name, rec.format, body, prof, rec.perf, rec.unmapped, mutable, lint(prof, None))


def _pin(rec: Recipe, data: dict) -> None:
    """The digest the source states for its image: its lock (sparkring), else the one its published
    figures were measured on (NVIDIA's performance.yaml runtime_revision, for this very recipe)."""
    digest = rec.image_digest or ((rec.perf or {}).get("software") or {}).get("image_digest")
    if digest:
        data["image"]["digest"] = digest
        return
    rec.note(
        None,
        f"--pin {rec.image}",
        "the source states no digest: pull the image and set [image] digest to its RepoDigests entry "
        "(docker image inspect --format '{{index .RepoDigests 0}}' IMAGE)",
    )


def _adjust(prof: profiles.Profile, data: dict) -> list[str]:
    """What the recipe states that lint would otherwise refuse, kept as the recipe states it, said."""
    out = []
    gmu = prof.serve.gpu_memory_utilization
    if gmu > MAX_GPU_MEMORY_UTILIZATION:
        data["allow_high_gpu_memory_utilization"] = True
        out.append(
            f"gpu_memory_utilization {gmu:g} is the recipe's own, above lint's {MAX_GPU_MEMORY_UTILIZATION:g} "
            "ceiling on unified memory: allow_high_gpu_memory_utilization = true (lower it if the host stops answering)"
        )
    if supervisor_bounds(prof):
        step = prof.serve.max_num_batched_tokens or DEFAULT_STEP_TOKENS
        stall = math.ceil(2 * step / prof.supervisor.prefill_floor_tok_s)
        data["supervisor"] = {"stall_s": stall}
        out.append(
            f"[supervisor] stall_s = {stall}: twice one {step}-token scheduler step at the default prefill floor"
        )
    return out


def _validate(data: dict, name: str) -> profiles.Profile:
    try:
        prof = profiles.parse(dumps(data), name=name, source=f"imported profile {name}")
    except InputError as e:
        raise Refused(
            f"the import does not make a valid profile: {e.message}" + "".join(f"; {d}" for d in e.details),
            "report it with the recipe attached",
        ) from None
    assert isinstance(prof, profiles.Profile)
    return prof


# ---- TOML out: the profile's layout (top-level keys, then [image], [env.forward], [serve], [source]) ----

_INLINE = frozenset({"speculative_config", "ulimits"})


def dumps(data: dict) -> str:
    lines: list[str] = []
    _table(lines, [], data)
    return "\n".join(lines).strip() + "\n"


def _table(lines: list[str], path: list[str], d: dict) -> None:
    for k, v in d.items():
        if not isinstance(v, dict) or k in _INLINE:
            lines.append(f"{_key(k)} = {_value(v)}")
    for k, v in d.items():
        if isinstance(v, dict) and k not in _INLINE:
            if any(not isinstance(x, dict) or y in _INLINE for y, x in v.items()):  # a table of tables needs no header
                lines.append("")
                lines.append("[" + ".".join(_key(p) for p in [*path, k]) + "]")
            _table(lines, [*path, k], v)


def _key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else _value(str(k))


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError("not a finite number")
        return repr(v)
    if isinstance(v, dt.date):
        return v.isoformat()
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_key(a)} = {_value(b)}" for a, b in v.items()) + " }"
    s = str(v)
    out = s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    return f'"{out}"'
