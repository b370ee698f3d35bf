"""The performance record: figures measured at exact conditions, with where they come from.

One format for a figure someone published (NVIDIA's `performance.yaml` of a recipe, a community
table) and for a run of `sparkcluster bench` on the owner's cluster, so the two can be put side by
side and only compared where their conditions agree. A published record lives in a file beside its
profile, `env-profiles/<profile>.perf.toml` (TOML like the profile; `profile.available()` does not
take it for a profile); a bench run writes `record.perf.toml` into its run folder, and a run kept as
the cluster's baseline is copied to `<bench runs>/baselines/<profile>.perf.toml`.

The fields mirror NVIDIA's schema (harness, system, software, profiles[] of workload + results) and
add what a Spark cluster needs said: the node count, the kernel, NCCL and its transport, the image
ID per node, the profile's hash. Required: the source, its date, the hardware and node count, the
harness and each run's conditions, and at least one figure per run; the rest where the source says it.

Figures (per run, i.e. per concurrency level): `decode_tok_s` is one request's decode speed (output
tokens after the first over the time after the first token, the mean over requests: aiperf's
`decode_tokens_per_second_mean`, 1000 / vLLM bench's mean TPOT), `prefill_tok_s` one request's prompt
tokens over its time to first token (aiperf's `prefill_tokens_per_second_mean`), `output_tok_s` the
aggregate output rate of all requests, and the TTFT/ITL percentiles in ms.
"""

from __future__ import annotations

import datetime as dt
import tomllib
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sparkcluster.config import toml_out
from sparkcluster.config.inventory import describe_validation_error
from sparkcluster.errors import InputError

SCHEMA_VERSION = 1
SUFFIX = ".perf.toml"
# harnesses whose figures a record may carry: vLLM's own (what `sparkcluster bench` runs), NVIDIA's
# aiperf (the recipes' performance.yaml), llama-benchy (the community's tables, eugr/llama-benchy)
Harness = Literal["vllm-bench-serve", "aiperf", "llama-benchy"]
FIGURES = (
    "decode_tok_s",
    "prefill_tok_s",
    "output_tok_s",
    "e2e_latency_ms_mean",
    "ttft_ms_p50",
    "ttft_ms_p99",
    "itl_ms_p50",
    "itl_ms_p99",
)
# more is better for these; less for the latencies
THROUGHPUTS = frozenset({"decode_tok_s", "prefill_tok_s", "output_tok_s"})
_HEX64 = r"^[0-9a-f]{64}$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Source(_Strict):
    """Where the figures come from: a published page (https) or a run folder of this cluster."""

    url: str = Field(min_length=1)
    measured_at: dt.date
    publisher: str = ""
    # the recipe the figures were measured with, and its hash as the publisher states it
    recipe_url: str | None = None
    recipe_sha256: str | None = Field(default=None, pattern=_HEX64)
    note: str = ""


UNKNOWN = "unknown"


class Hardware(_Strict):
    nodes: int = Field(ge=1, le=64)
    gpus: int = Field(ge=1, le=512)
    accelerator: str = Field(min_length=1)
    label: str = ""
    topology: str | None = None  # direct, switch, ring, mesh (sparkcluster's words), when said
    # each host's memory in GB (10^9), issue 52: 128 GB and 64 GB Sparks exist (node/memory_fit.py).
    # A run of ours: MemTotal as bench's node facts read it, the smallest node's where they differ
    # (every rank gets what the smallest holds). A published record: what its source says, else
    # "unknown" (never assumed: a record from another memory size is flagged by `bench --compare`).
    memory_gb: Annotated[float, Field(gt=0, le=4096)] | Literal["unknown"] = UNKNOWN

    @property
    def memory_known(self) -> float | None:
        return None if self.memory_gb == UNKNOWN else float(self.memory_gb)


class HarnessInfo(_Strict):
    name: Harness
    version: str = Field(min_length=1)
    argv: list[str] = Field(default_factory=list)  # the exact command, where known (ours always)


class Software(_Strict):
    backend: str = "vllm"
    backend_version: str | None = None
    image: str | None = None
    # a registry digest (what NVIDIA's runtime_revision is) or a local image ID: either names content
    image_digest: str | None = Field(default=None, pattern=r"^sha256:[0-9a-f]{64}$")
    image_ids: dict[str, str] = Field(default_factory=dict)  # node -> its image ID (ours)
    driver: str | None = None
    cuda: str | None = None
    os: str | None = None
    kernel: str | None = None
    nccl: str | None = None
    nccl_transport: dict[str, str] = Field(default_factory=dict)  # node -> what the engine's NCCL chose
    # the backend that served the TP all-reduce, as the ranks' logs named it (issue 59): "PYNCCL",
    # "B12X_ROCENANTE", "not reported" (an engine that names none)
    all_reduce: str | None = None
    model: str | None = None
    model_revision: str | None = None
    profile: str | None = None
    profile_hash: str | None = Field(default=None, pattern=_HEX64)
    sparkcluster_version: str | None = None
    # the profile's speculative-decoding method ("mtp", "eagle3", ...) where it decodes speculatively
    # (ours; a published record where its recipe says): its decode speed depends on the prompts (bench/prompts.py)
    speculative: str | None = None


class Conditions(_Strict):
    input_tokens: int = Field(ge=1)
    output_tokens: int = Field(ge=1)
    concurrency: int = Field(ge=1)
    dataset: str = Field(min_length=1)  # "random" (vLLM bench's synthetic prompts), "nvidia/SPEED-Bench", ...
    # the dataset's part the prompts came from, where it has parts: SPEED-Bench's "qualitative" or
    # "throughput_1k" ... "throughput_32k" (NVIDIA's performance.yaml: workload.profile)
    dataset_subset: str | None = None
    requests: int | None = Field(default=None, ge=1)
    warmup_requests: int | None = Field(default=None, ge=0)
    context_tokens: int | None = Field(default=None, ge=1)  # the served max_model_len, where said
    input_tokens_min: int | None = Field(default=None, ge=1)
    input_tokens_max: int | None = Field(default=None, ge=1)

    @property
    def key(self) -> tuple[int, int, int]:
        """What two runs must share to be compared: prompt and answer lengths, concurrency."""
        return self.input_tokens, self.output_tokens, self.concurrency

    def describe(self) -> str:
        return f"{self.input_tokens} in / {self.output_tokens} out at concurrency {self.concurrency}"


class Figures(_Strict):
    decode_tok_s: float | None = Field(default=None, gt=0)
    prefill_tok_s: float | None = Field(default=None, gt=0)
    output_tok_s: float | None = Field(default=None, gt=0)
    e2e_latency_ms_mean: float | None = Field(default=None, gt=0)
    ttft_ms_p50: float | None = Field(default=None, gt=0)
    ttft_ms_p99: float | None = Field(default=None, gt=0)
    itl_ms_p50: float | None = Field(default=None, gt=0)
    itl_ms_p99: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _some(self) -> Figures:
        if all(getattr(self, f) is None for f in FIGURES):
            raise ValueError("a run needs at least one figure")
        return self

    def present(self) -> dict[str, float]:
        return {f: getattr(self, f) for f in FIGURES if getattr(self, f) is not None}


class RecordedRun(_Strict):
    """One run of a record: the conditions it ran at and the figures it measured (a name of its own:
    `steps/walk.Run` is the run a command walks its steps in)."""

    id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    conditions: Conditions
    figures: Figures
    repetitions: int = Field(default=1, ge=1)
    # figure -> relative standard deviation over the repetitions, in percent (ours, when repeated)
    spread_pct: dict[str, float] = Field(default_factory=dict)


class PerfRecord(_Strict):
    schema_version: Literal[1] = SCHEMA_VERSION
    kind: Literal["published", "measured"]
    source: Source
    hardware: Hardware
    harness: HarnessInfo
    software: Software = Field(default_factory=Software)
    runs: list[RecordedRun] = Field(min_length=1)

    @model_validator(mode="after")
    def _runs(self) -> PerfRecord:
        ids = [r.id for r in self.runs]
        if len(set(ids)) != len(ids):
            raise ValueError("runs: two runs share an id")
        keys = [r.conditions.key for r in self.runs]
        if len(set(keys)) != len(keys):
            raise ValueError("runs: two runs share their conditions (input, output, concurrency)")
        if self.kind == "published" and not self.source.url.startswith("https://"):
            raise ValueError("source.url: a published record cites an https:// page")
        return self

    def run_at(self, key: tuple[int, int, int]) -> RecordedRun | None:
        return next((r for r in self.runs if r.conditions.key == key), None)


# ---- files ---------------------------------------------------------------------------------------


def record_path(profile_path: Path) -> Path:
    """The record beside a profile file: env-profiles/NAME.toml -> env-profiles/NAME.perf.toml."""
    return profile_path.with_name(profile_path.stem + SUFFIX)


def is_record_file(path: Path) -> bool:
    return path.name.endswith(SUFFIX)


def parse(text: str, source: str = "record") -> PerfRecord:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise InputError(f"{source}: not valid TOML: {e}", "fix the syntax at the position shown") from None
    try:
        return PerfRecord.model_validate(data)
    except ValidationError as e:
        lines = describe_validation_error(source, e)
        raise InputError(
            f"{source}: {len(lines)} problem(s) in the performance record",
            "correct the fields listed above",
            details=lines,
        ) from None


def load(path: Path) -> PerfRecord:
    try:
        text = path.read_text()
    except OSError as e:
        raise InputError(f"cannot read the performance record {path}: {e.strerror}", "check the path") from None
    return parse(text, str(path))


def published_for(prof) -> PerfRecord | None:
    """The record shipped beside the profile's file, or None when it has none."""
    if prof.path is None:
        return None
    p = record_path(Path(prof.path))
    return load(p) if p.is_file() else None


def write(path: Path, rec: PerfRecord) -> None:
    path.write_text(dumps(rec))


# ---- TOML out (the standard library reads TOML but does not write it) ---------------------------


def dumps(rec: PerfRecord) -> str:
    data = rec.model_dump(mode="python", exclude_none=True)
    lines = [f"# performance record ({rec.kind}), schema {rec.schema_version}: sparkcluster/bench/perf_record.py"]
    _table(lines, [], {k: v for k, v in data.items()})
    return "\n".join(lines).rstrip() + "\n"


_INLINE_MAPS = frozenset({"spread_pct", "image_ids", "nccl_transport"})


def _is_table(v) -> bool:
    return isinstance(v, dict)


def _is_table_array(v) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)


def _table(lines: list[str], path: list[str], d: dict) -> None:
    scalars = {k: v for k, v in d.items() if not (_is_table(v) or _is_table_array(v)) or k in _INLINE_MAPS}
    for k, v in scalars.items():
        if v == [] or v == {}:
            continue
        lines.append(f"{toml_out.key(k)} = {toml_out.value(v)}")
    for k, v in d.items():
        if k in _INLINE_MAPS:  # node or figure -> value: written above as one inline table
            continue
        if _is_table(v):
            lines.append("")
            lines.append("[" + ".".join(toml_out.key(p) for p in [*path, k]) + "]")
            _table(lines, [*path, k], v)
        elif _is_table_array(v):
            for item in v:
                lines.append("")
                lines.append("[[" + ".".join(toml_out.key(p) for p in [*path, k]) + "]]")
                _table(lines, [*path, k], item)
