"""Lint rules for profiles, each learned in the field (the section of docs/field-notes.md is cited).

Every rule is registered (`rule`: an id, one line on what it guards against, one function) in
`RULES`, which the docs list. `lint(profile, inventory=None)` is pure and returns every problem of
the profile rules at once; those that need the cluster (`CLUSTER_RULES`) run only when an inventory
is given. The plan's rule (several profiles on one node) and the model's (its config.json, at the
weights stage) are registered beside them.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sparkcluster import redact
from sparkcluster.config import compile_cache, model_memory
from sparkcluster.config.flags import BY_FLAG, Gate, flag_names, flag_value, parse_version, refusals, serve_argv
from sparkcluster.config.profile import MANAGED_VARS, Profile, guess_image_kind
from sparkcluster.config.secrets import SECRET_NAMES, SECRET_VALUE
from sparkcluster.config.topology import FIELD_RING_NODES
from sparkcluster.config.vllm_flag_sets import FLAG_SETS
from sparkcluster.node import memory_fit
from sparkcluster.redact import DEFAULT_ENV_FILE

if TYPE_CHECKING:  # pragma: no cover
    from sparkcluster.config.inventory import Inventory

# --gpu-memory-utilization is a fraction of the whole unified pool: 0.9 starved hosts until sshd
# stopped answering; 0.80, not 0.85, keeps burst headroom (docs/field-notes.md, "Memory on a unified-memory machine").
MAX_GPU_MEMORY_UTILIZATION = 0.85
# Prefix caching on a Mamba/hybrid model forces an aligned block size: 2128 seen, and the default
# --max-num-batched-tokens 2048 asserted at start-up; 8192 works (docs/field-notes.md, "Version-dependent flags").
MAMBA_ALIGNED_BLOCK_SIZE = 2128
VLLM_DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048

# directories only root may write on a Spark, whose SSH user is an ordinary account in `docker`
ROOT_ONLY_DIRS = ("/root", "/etc", "/usr", "/var", "/run", "/boot", "/proc", "/sys", "/lib", "/bin", "/sbin")

_SECRET_VALUE = SECRET_VALUE
_SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|APIKEY|PRIVATE_KEY|CREDENTIAL)", re.I)


@dataclass(frozen=True)
class Problem:
    rule: str
    message: str
    fix: str
    severity: str = "fail"  # "warn": said, and `up` goes on

    def line(self) -> str:
        return f"[{self.rule}]{' warning:' if self.severity == 'warn' else ''} {self.message} -- fix: {self.fix}"


def failures(problems: Sequence[Problem]) -> list[Problem]:
    """The problems that stop `up` (warnings are said and pass)."""
    return [x for x in problems if x.severity != "warn"]


def _looks_secret(value: str) -> bool:
    return bool(_SECRET_VALUE.search(value)) or redact.mask(value) != value


def _flag_set(profile: Profile):
    v = profile.image.vllm_version
    if not v:
        return None
    return next((fs for k, fs in FLAG_SETS.items() if parse_version(k) == parse_version(v)), None)


def unchecked_flags(profile: Profile) -> str | None:
    """Why the profile's extra flags could not be checked against its vLLM's, or None."""
    extra = flag_names(list(profile.serve.extra_flags))
    if not extra or _flag_set(profile) is not None:
        return None
    v = profile.image.vllm_version
    what = f"vLLM {v}'s flags are not known here" if v else "the profile states no image.vllm_version"
    return f"serve.extra_flags went unchecked ({', '.join(extra)}): {what}"


def _unknown_flags(profile: Profile, extra: list[str]) -> list[Problem]:
    """Extra flags the profile's vLLM does not accept (a typo fails here, not at the serve stage
    after build, image, weights and Ray), with the closest spelling."""
    fs = _flag_set(profile)
    if fs is None:
        return []
    # the flag table's own flags are judged by their version gates (flag-version), not here
    known = set(fs.flags) | set(BY_FLAG)
    out = []
    for flag in dict.fromkeys(flag_names(extra)):
        # vLLM reads --max_model_len as --max-model-len, and --compilation-config.mode=3 as a key of
        # --compilation-config's JSON
        name = flag.split(".", 1)[0].replace("_", "-")
        if name in known:
            continue
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.8)
        if not close and not fs.complete:
            continue  # a partial set: a real flag may be missing from it
        out.append(
            Problem(
                "unknown-vllm-flag",
                f"serve.extra_flags: {flag} is not a flag of vLLM {fs.version}"
                + (f" (did you mean {close[0]}?)" if close else ""),
                f"replace it with {close[0]}"
                if close
                else f"remove it (vllm serve --help=all lists vLLM {fs.version}'s)",
            )
        )
    return out


@dataclass(frozen=True)
class Rule:
    """One lint rule: its id (what a problem prints in brackets), one line on what it guards against,
    the function that judges it and when it runs. `when`: "profile" (every `profile lint` and `up`'s
    preflight; `cluster` ones only with an inventory), "plan" (several single-node profiles on one
    node), "model" (the model's config.json, read at the weights stage)."""

    id: str
    doc: str
    check: Callable
    severity: str = "fail"  # "warn", or "fail or warn"
    cluster: bool = False
    when: str = "profile"


RULES: dict[str, Rule] = {}


def rule(id: str, doc: str, severity: str = "fail", cluster: bool = False, when: str = "profile"):
    """Registers the function it decorates as the rule `id`; the registry keeps the order rules run in."""

    def register(fn: Callable) -> Callable:
        assert id not in RULES, id
        RULES[id] = Rule(id, doc, fn, severity, cluster, when)
        return fn

    return register


def lint(profile: Profile, inventory: Inventory | None = None) -> list[Problem]:
    """Every problem of the profile at once: the registered profile rules in order, the cluster ones
    only with an inventory."""
    p: list[Problem] = []
    for r in RULES.values():
        if r.when == "profile" and (inventory is not None or not r.cluster):
            p += r.check(profile, inventory)
    return p


# -- memory on unified memory (docs/field-notes.md, "Memory on a unified-memory machine")
@rule("gpu-memory-utilization", "--gpu-memory-utilization above 0.85 of the unified pool starves the host")
def _gpu_memory_utilization(profile: Profile, inventory: Inventory | None) -> list[Problem]:
    s = profile.serve
    if s.gpu_memory_utilization <= MAX_GPU_MEMORY_UTILIZATION or profile.allow_high_gpu_memory_utilization:
        return []
    return [
        Problem(
            "gpu-memory-utilization",
            f"--gpu-memory-utilization {s.gpu_memory_utilization} is above {MAX_GPU_MEMORY_UTILIZATION} "
            "on unified memory: the host starves (sshd stops answering)",
            "lower serve.gpu_memory_utilization to 0.70-0.80, or set "
            "allow_high_gpu_memory_utilization = true if you mean it",
        )
    ]


# -- container options that widen the container's rights (issue 51): NVIDIA's recipes pass
# seccomp=unconfined (io_uring, blocked by Docker's default profile since moby/moby#46762),
# apparmor=unconfined or --privileged; said, never refused
@rule("container-rights", "an unconfined seccomp or AppArmor profile, or --privileged, said (never refused)", "warn")
def _container_rights(profile: Profile, inventory: Inventory | None) -> list[Problem]:
    wide = [o for o in profile.security_opt if o.replace(":", "=").split("=", 1)[-1] == "unconfined"]
    if not (wide or profile.privileged):
        return []
    what = ", ".join([*(f"--security-opt {o}" for o in wide), *(["--privileged"] if profile.privileged else [])])
    return [
        Problem(
            "container-rights",
            f"{what} widens every container's rights (no seccomp or AppArmor filter"
            + (", every device and capability" if profile.privileged else "")
            + ")",
            "keep it only where the engine needs it (NVIDIA's recipes pass seccomp=unconfined for io_uring, "
            "which Docker's default seccomp profile blocks: moby/moby#46762); AppArmor applies only on hosts "
            "that run it",
            severity="warn",
        )
    ]


@rule("security-opt", "a security_opt entry not of docker's name=value form")
def _security_opt(profile: Profile, inventory: Inventory | None) -> list[Problem]:
    bad = [o for o in profile.security_opt if not re.fullmatch(r"[a-z-]+([=:].+)?", o)]
    if not bad:
        return []
    return [
        Problem(
            "security-opt",
            f"security_opt {', '.join(bad)} is not of docker's form (name=value, e.g. seccomp=unconfined)",
            "write each as docker run --security-opt takes it: seccomp=unconfined, apparmor=unconfined, "
            "no-new-privileges",
        )
    ]


# -- the address every other node reaches a node at (Ray's node IP, VLLM_HOST_IP, the rendezvous)
@rule(
    "control-ip",
    "a control_ip the other nodes cannot reach (loopback, unspecified, multicast)",
    cluster=True,
)
def _control_ip(profile: Profile, inventory: Inventory) -> list[Problem]:
    p = []
    for n in inventory.nodes:
        ip = n.control_ip
        if ip.is_loopback or ip.is_unspecified or ip.is_multicast:  # link-local is fine: a direct cable may use it
            p.append(
                Problem(
                    "control-ip",
                    f"nodes.{n.name}.control_ip {ip} is not an address the other nodes can reach",
                    f"set it to {n.name}'s address on {n.control_if} (ip -4 addr show {n.control_if} there)",
                )
            )
    return p


# -- parallelism vs the cluster
@rule("tp-pp-gpus", "tensor x pipeline parallel that is neither the cluster's GPUs nor one node's", cluster=True)
def _tp_pp_gpus(profile: Profile, inventory: Inventory) -> list[Problem]:
    s, gpus = profile.serve, inventory.gpu_count
    # a profile as wide as one node runs there alone (`up --node`), the pair free for another
    one_node = len(inventory.nodes) > 1 and profile.world_size in {n.gpus for n in inventory.nodes}
    if profile.world_size == gpus or one_node:
        return []
    return [
        Problem(
            "tp-pp-gpus",
            f"tensor_parallel_size x pipeline_parallel_size = {s.tensor_parallel_size} x "
            f"{s.pipeline_parallel_size} = {profile.world_size}, but the cluster has {gpus} GPU(s)",
            f"set serve.tensor_parallel_size x serve.pipeline_parallel_size = {gpus}",
        )
    ]


@rule("needs-root", "an inventory setting only root could honour (an hf_cache under /etc, /var...)", cluster=True)
def _needs_root(profile: Profile, inventory: Inventory) -> list[Problem]:
    return needs_root(inventory)


# -- what a ring of four or more serves on (issue 35): TP across the ring with vLLM's own launch
# (`mp`), ranks in cable order (the inventory lists a ring's nodes along its cables, and `net.topology`
# fails when they are not). Each node has cables to its two neighbours only, so a rank group whose
# members are not neighbours talks over no cable at all.
@rule("ring-executor", "Ray on a ring: it places ranks by IP address, not along the cables", cluster=True)
def _ring_executor(profile: Profile, inventory: Inventory) -> list[Problem]:
    if inventory.cluster.topology != "ring" or profile.executor != "ray":
        return []
    return [
        Problem(
            "ring-executor",
            "Ray places vLLM's ranks by IP address, not along the ring's cables, so neighbouring ranks may "
            "sit on nodes no cable joins (eugr spark-vllm-docker refuses it: a ring needs the native "
            "backend with fixed rank placement)",
            'set executor = "mp" (vLLM\'s own multi-node launch: node k of the inventory is node rank k, '
            "in cable order)",
        )
    ]


@rule("ring-pp", "pipeline parallel on a ring: its groups span nodes no cable joins", cluster=True)
def _ring_pp(profile: Profile, inventory: Inventory) -> list[Problem]:
    if inventory.cluster.topology != "ring" or profile.serve.pipeline_parallel_size <= 1:
        return []
    n = len(inventory.nodes)
    pp, tp = profile.serve.pipeline_parallel_size, profile.serve.tensor_parallel_size
    names = [x.name for x in inventory.nodes]
    groups = [names[i::tp] for i in range(tp)] if tp <= n and n % tp == 0 else []
    shown = "; ".join("{" + ",".join(g) + "}" for g in groups) or "groups across the ring"
    return [
        Problem(
            "ring-pp",
            f"pipeline parallel {pp} on a ring: in cable order vLLM's pipeline groups are {shown}, nodes "
            "across the ring's diagonals that no cable joins (their queue pairs time out); an order that "
            "keeps every group on a cable (A,B,D,C) has not been run in the field, so it is refused too",
            f"serve the ring with tensor parallel only: tensor_parallel_size = {inventory.gpu_count}, "
            'pipeline_parallel_size = 1, executor = "mp" (what the field runs: TP=4 on four Sparks)',
        )
    ]


@rule("ring-order", "a ring listed from another node than the head: node ranks leave cable order", cluster=True)
def _ring_order(profile: Profile, inventory: Inventory) -> list[Problem]:
    if inventory.cluster.topology != "ring" or inventory.nodes[0].role == "head":
        return []
    return [
        Problem(
            "ring-order",
            f"the ring's inventory lists {inventory.nodes[0].name} before the head {inventory.head.name}: vLLM's "
            "node ranks run head first, then the workers in inventory order, which is then not cable order",
            "list the nodes from the head along the cables (as `sparkcluster init` writes a ring)",
        )
    ]


@rule("ring-size", "a ring larger than the field has served on (said, not refused)", "warn", cluster=True)
def _ring_size(profile: Profile, inventory: Inventory) -> list[Problem]:
    n = len(inventory.nodes)
    if inventory.cluster.topology != "ring" or n <= FIELD_RING_NODES:
        return []
    return [
        Problem(
            "ring-size",
            f"a ring of {n}: the field has served models on rings of {FIELD_RING_NODES} Sparks only (TP=4), "
            "each collective step crosses every cable and a larger ring is not validated for inference",
            "measure it first (`sparkcluster doctor --fabric`), or cable the Sparks through a switch",
            severity="warn",
        )
    ]


@rule("port-mismatch", "serve.port different from the inventory's api_port", cluster=True)
def _port_mismatch(profile: Profile, inventory: Inventory) -> list[Problem]:
    s = profile.serve
    if s.port is None or s.port == inventory.cluster.api_port:
        return []
    return [
        Problem(
            "port-mismatch",
            f"serve.port {s.port} differs from the inventory's api_port {inventory.cluster.api_port}",
            "remove serve.port (the inventory's api_port is used) or make them equal",
        )
    ]


@rule("executor-backend", "ranks across nodes without --distributed-executor-backend naming the profile's executor")
def _executor_backend(profile: Profile, inventory: Inventory | None) -> list[Problem]:
    s = profile.serve
    if profile.world_size <= 1 or s.distributed_executor_backend == profile.executor:
        return []
    return [
        Problem(
            "executor-backend",
            f"{profile.world_size} ranks across nodes need --distributed-executor-backend {profile.executor} "
            f"(profile has {s.distributed_executor_backend or 'none'})",
            f'remove serve.distributed_executor_backend, or set executor = "{s.distributed_executor_backend}"'
            " (ray: seed 002; mp: vLLM's own multi-node launch)",
        )
    ]


# -- prefix caching on a hybrid model (docs/field-notes.md, "Version-dependent flags")
@rule("prefix-caching-hybrid", "prefix caching on a hybrid (Mamba) model with a step budget under its aligned block")
def _prefix_caching_hybrid(profile: Profile, inventory: Inventory | None) -> list[Problem]:
    s = profile.serve
    mnbt = s.max_num_batched_tokens or VLLM_DEFAULT_MAX_NUM_BATCHED_TOKENS
    if not (profile.hybrid and s.enable_prefix_caching) or mnbt >= MAMBA_ALIGNED_BLOCK_SIZE:
        return []
    return [
        Problem(
            "prefix-caching-hybrid",
            f"prefix caching on a hybrid (Mamba) model forces block_size {MAMBA_ALIGNED_BLOCK_SIZE}, "
            f"above --max-num-batched-tokens {mnbt}: start-up asserts",
            "set serve.max_num_batched_tokens = 8192 (seed 004), or disable prefix caching",
        )
    ]


# -- tool calling needs both flags: HTTP 400 on tool_choice "auto" (docs/field-notes.md, "Version-dependent flags")
@rule("tool-choice-pair", "--enable-auto-tool-choice without --tool-call-parser, or the other way round")
def _tool_choice_pair(profile: Profile, inventory: Inventory | None) -> list[Problem]:
    flags = flag_names(serve_argv(profile, "vllm-openai"))
    has_auto, has_parser = "--enable-auto-tool-choice" in flags, "--tool-call-parser" in flags
    if has_auto == has_parser:
        return []
    missing = "--tool-call-parser" if has_auto else "--enable-auto-tool-choice"
    present = "--enable-auto-tool-choice" if has_auto else "--tool-call-parser"
    return [
        Problem(
            "tool-choice-pair",
            f'{present} without {missing}: clients sending tool_choice "auto" get HTTP 400',
            "set both serve.enable_auto_tool_choice = true and serve.tool_call_parser "
            "(matching the model family), or neither",
        )
    ]


# -- quantization flag vs checkpoint format (docs/field-notes.md, "Version-dependent flags")
@rule("quantization", "a --quantization that does not match the checkpoint's format")
def _quantization(profile: Profile, inventory: Inventory | None) -> list[Problem]:
    p = []
    quant = flag_value(serve_argv(profile, "vllm-openai"), "--quantization")
    if profile.checkpoint_format == "modelopt" and quant != "modelopt":
        p.append(
            Problem(
                "quantization",
                f"ModelOpt NVFP4 checkpoint needs --quantization modelopt (profile has {quant or 'none'})",
                'set serve.quantization = "modelopt"',
            )
        )
    # naming the checkpoint's own format is harmless: seed 004 serves RedHatAI's NVFP4 checkpoint
    # with --quantization compressed-tensors
    if profile.checkpoint_format == "compressed-tensors" and quant not in (None, "compressed-tensors"):
        p.append(
            Problem(
                "quantization",
                f"compressed-tensors checkpoint must not pass --quantization {quant}",
                "remove serve.quantization: vLLM detects compressed-tensors itself",
            )
        )
    return p


@rule("speculative-method", 'an MTP drafter run under method "draft_model" (slower than "mtp")')
def _speculative_method(profile: Profile, inventory: Inventory | None) -> list[Problem]:
    return _speculative_problems(profile.serve.speculative_config)


# -- the image kind and the `vllm serve` prefix (docs/field-notes.md, "Version-dependent flags")
@rule("image-kind", "an image kind that is not the image's, or `vllm serve` in the model or extra flags")
def _image_kind(profile: Profile, inventory: Inventory | None) -> list[Problem]:
    p = []
    guessed = guess_image_kind(profile.image.base)
    if guessed and guessed != profile.image.kind:
        p.append(
            Problem(
                "image-kind",
                f'image {profile.image.base} is a {guessed} image but the profile says kind = "{profile.image.kind}"',
                f'set image.kind = "{guessed}"',
            )
        )
    extra = list(profile.serve.extra_flags)
    prefix = [t for t in [profile.model, *extra] if t in ("vllm", "serve") or t.startswith("vllm serve")]
    if prefix:
        p.append(
            Problem(
                "image-kind",
                f"`vllm serve` appears in the model or extra flags ({' '.join(prefix)}): "
                '`vllm serve vllm serve` fails with "unrecognized arguments"',
                "remove it: sparkcluster adds `vllm serve` for NGC images, and vllm/vllm-openai "
                "images have it as entrypoint",
            )
        )
    return p


@rule("unknown-vllm-flag", "an extra flag the profile's vLLM does not accept, with the closest spelling")
def _unknown_vllm_flag(profile: Profile, inventory: Inventory | None) -> list[Problem]:
    return _unknown_flags(profile, list(profile.serve.extra_flags))


# -- secrets stay off command lines and out of the forwarded variables (docs/field-notes.md, "Secrets")
@rule("secret-on-command-line", "--api-key or a secret-looking value in the extra flags, the model or served_name")
def _secret_on_command_line(profile: Profile, inventory: Inventory | None) -> list[Problem]:
    p = []
    extra = list(profile.serve.extra_flags)
    if [f for f in flag_names(extra) if f == "--api-key"]:
        p.append(
            Problem(
                "secret-on-command-line",
                "--api-key in serve.extra_flags puts the API key on a command line (`ps` shows it)",
                "remove --api-key: the key reaches vllm as VLLM_API_KEY in the exec environment",
            )
        )
    leaked = [i for i, t in enumerate(extra) if _looks_secret(t)]
    if leaked:
        p.append(
            Problem(
                "secret-on-command-line",
                f"serve.extra_flags{leaked} looks like a secret value",
                f"remove it; secrets come from the environment or {DEFAULT_ENV_FILE} (mode 0600)",
            )
        )
    if _looks_secret(profile.model) or (profile.served_name and _looks_secret(profile.served_name)):
        p.append(
            Problem(
                "secret-on-command-line",
                "model or served_name looks like a secret value",
                f"remove it; secrets come from the environment or {DEFAULT_ENV_FILE} (mode 0600)",
            )
        )
    return p


@rule("secret-in-forwarded-vars", "a secret's name or value among the container's forwarded variables")
def _secret_in_forwarded_vars(profile: Profile, inventory: Inventory | None) -> list[Problem]:
    p = []
    for name, value in profile.env.forward.items():
        if name in SECRET_NAMES or _SECRET_NAME.search(name):
            p.append(
                Problem(
                    "secret-in-forwarded-vars",
                    f"env.forward.{name}: a secret in the container's start environment "
                    "(visible in docker inspect, copied to every rank)",
                    f"remove {name} from env.forward; list it in secrets (value from the environment "
                    f"or {DEFAULT_ENV_FILE}, mode 0600, passed to the exec only)",
                )
            )
        elif _looks_secret(value):
            p.append(
                Problem(
                    "secret-in-forwarded-vars",
                    f"env.forward.{name}: the value looks like a secret",
                    f"remove {name} from env.forward; keep secrets in {DEFAULT_ENV_FILE} (mode 0600)",
                )
            )
    return p


# -- sparkcluster sets these itself, per node or for all
@rule("managed-var-forwarded", "a forwarded variable sparkcluster sets itself (per node, or into the compile cache)")
def _managed_var_forwarded(profile: Profile, inventory: Inventory | None) -> list[Problem]:
    p = []
    for name in profile.env.forward:
        if name in MANAGED_VARS or name in compile_cache.ENV:
            p.append(
                Problem(
                    "managed-var-forwarded",
                    f"env.forward.{name}: sparkcluster sets it (per node from the inventory, or from "
                    "the profile's env settings); a forwarded value would be wrong on some node"
                    if name not in compile_cache.ENV
                    else f"env.forward.{name}: sparkcluster points it into the node's compile cache for "
                    "this image, model and flags (inventory compile_cache); a forwarded folder would be "
                    "shared by other keys or lost with the container",
                    f"remove {name} from env.forward",
                )
            )
    return p


# -- flags given twice (extra_flags must not shadow a typed field)
@rule("duplicate-flag", "an extra flag that a typed field or sparkcluster itself sets")
def _duplicate_flag(profile: Profile, inventory: Inventory | None) -> list[Problem]:
    p = []
    extra = list(profile.serve.extra_flags)
    for f in sorted(set(flag_names(extra))):
        spec = BY_FLAG.get(f)
        if spec and spec.field and _typed_field_cannot_say(profile, spec.field, flag_value(extra, f)):
            continue
        if spec and spec.field:
            p.append(
                Problem(
                    "duplicate-flag",
                    f"{f} in serve.extra_flags duplicates the typed field serve.{spec.field}",
                    f"set serve.{spec.field} and remove {f} from serve.extra_flags",
                )
            )
        elif f in ("--served-model-name", "--host", "--port", "--reasoning-parser-plugin"):
            p.append(
                Problem(
                    "duplicate-flag",
                    f"{f} in serve.extra_flags is set by sparkcluster from the profile",
                    f"remove {f} from serve.extra_flags",
                )
            )
    return p


def _typed_field_cannot_say(profile: Profile, field: str, value: str | None) -> bool:
    """The typed field is unset and cannot hold the value extra_flags passes (`--max-model-len auto`,
    vLLM's "as long as the KV cache allows", which an integer field cannot say): nothing is duplicated."""
    if value is None or getattr(profile.serve, field) is not None:
        return False
    try:
        type(profile.serve).model_validate({field: value})
    except ValueError:
        return True
    return False


# -- the reasoning-parser plugin only registers a parser; it still has to be named
@rule("reasoning-plugin", "a reasoning-parser plugin without the parser it registers named")
def _reasoning_plugin(profile: Profile, inventory: Inventory | None) -> list[Problem]:
    s = profile.serve
    if not s.reasoning_parser_plugin_url or s.reasoning_parser:
        return []
    return [
        Problem(
            "reasoning-plugin",
            "serve.reasoning_parser_plugin_url is set but serve.reasoning_parser is not",
            "set serve.reasoning_parser to the parser the plugin registers (e.g. super_v3, seed 002)",
        )
    ]


# -- version gates (docs/field-notes.md, "Version-dependent flags")
@rule("flag-version", "a flag, or a flag's value, that the image's vLLM does not accept")
def _flag_version(profile: Profile, inventory: Inventory | None) -> list[Problem]:
    img = profile.image
    return [
        Problem(
            "flag-version",
            f"{r.item}: image {img.ref} (vLLM {img.vllm_version or 'not stated'}) does not accept it: {r.reason}",
            "remove the flag or use a newer image (and set image.vllm_version to what it ships)",
        )
        for r in refusals(profile)
        if r.kind != "env"
    ]


@rule("env-version", "a forwarded variable that the image's vLLM does not read any more")
def _env_version(profile: Profile, inventory: Inventory | None) -> list[Problem]:
    return [
        Problem(
            "env-version",
            f"env.forward.{r.item}: {r.reason}",
            "use serve.moe_backend (--moe-backend marlin on sm_121, seed 001) and drop the variable",
        )
        for r in refusals(profile)
        if r.kind == "env"
    ]


# Forwarded variables whose vLLM has nothing left to read them for: said, and `up` goes on (the variable
# does no harm). VLLM_USE_V1 chose between the V0 and V1 engines; vLLM 0.11.0 removed V0 ("V1 is the only
# engine in the codebase now": its release notes, https://github.com/vllm-project/vllm/releases/tag/v0.11.0)
# and vllm-project/vllm#28204 then removed the variable from vllm/envs.py, after which vLLM logs "Unknown
# vLLM environment variable detected: VLLM_USE_V1" (llm-d-incubation/llm-d-fast-model-actuation#597).
# NGC's vLLM 26.01 ships vLLM 0.11.1
# (https://docs.nvidia.com/deeplearning/frameworks/vllm-release-notes/rel-26-01.html).
UNREAD_ENV: dict[str, tuple[Gate, str]] = {
    "VLLM_USE_V1": (
        Gate(
            until=(0, 11, 0),
            ngc_removed_from=(26, 1),
            source="vLLM 0.11.0's release notes; vllm-project/vllm#28204",
            verb="has no V0 engine for",
        ),
        "it chose between the V0 and V1 engines, and V1 is the only one left",
    ),
}


@rule("env-unread", "a forwarded variable that the image's vLLM has nothing left to read it for", "warn")
def _env_unread(profile: Profile, inventory: Inventory | None) -> list[Problem]:
    img = profile.image
    p = []
    for name, (gate, what) in UNREAD_ENV.items():
        why = gate.refusal(img.vllm_version, img.kind, img.tag) if name in profile.env.forward else None
        if why:
            p.append(
                Problem(
                    "env-unread",
                    f"env.forward.{name}: {what}: {why}",
                    f"remove {name} from env.forward",
                    severity="warn",
                )
            )
    return p


# Forwarded settings that turn off a cache sparkcluster keeps for the profile (config/compile_cache): the
# folders stay mounted and keyed, and every start compiles again. VLLM_DISABLE_COMPILE_CACHE is read as a
# number, 0 by default (vllm-project/vllm:vllm/envs.py@f218f9c2), and "disable[s] compile cache" (the
# pytorch/Phi-4-mini-instruct-INT4 model card, huggingface.co commit 3be2c474); CUDA_CACHE_DISABLE=1 stops
# the driver adding to or reading its JIT cache (CUDA Programming Guide, "CUDA Environment Variables",
# https://docs.nvidia.com/cuda/cuda-programming-guide/05-appendices/environment-variables.html).
CACHE_SWITCHES: dict[str, str] = {
    "VLLM_DISABLE_COMPILE_CACHE": "vLLM's torch.compile cache (the key's vllm folder, VLLM_CACHE_ROOT)",
    "CUDA_CACHE_DISABLE": "the CUDA driver's JIT cache (the key's cuda folder, CUDA_CACHE_PATH)",
}


def _switched_on(value: str) -> bool:
    return value.strip() not in ("", "0")


@rule("compile-cache-defeated", "a forwarded variable that turns off a compile cache sparkcluster keeps", "warn")
def _compile_cache_defeated(profile: Profile, inventory: Inventory | None) -> list[Problem]:
    if compile_cache.in_place(profile):
        return []  # compile_cache = "image": nothing is mounted, nothing of sparkcluster's is lost
    return [
        Problem(
            "compile-cache-defeated",
            f"env.forward.{name}={value} turns off {what}: sparkcluster keeps that cache for this image, model "
            "and flags (inventory compile_cache) so a restart loads what the last start compiled; with it "
            "off, every start compiles again",
            f"remove {name} from env.forward (a key's cache is never shared with another image, model or "
            "flags), or keep it where that cache is known to break this image",
            severity="warn",
        )
        for name, what in CACHE_SWITCHES.items()
        if _switched_on(value := profile.env.forward.get(name, ""))
    ]


@rule("supervisor-stall", "[supervisor] stall_s under twice one scheduler step at the slowest prefill rate")
def _supervisor_stall(profile: Profile, inventory: Inventory | None) -> list[Problem]:
    return supervisor_bounds(profile)


@rule("memory-fit", "one rank's weights and one sequence's KV cache over gpu_memory_utilization of a node's memory")
def _memory_fit(profile: Profile, inventory: Inventory | None) -> list[Problem]:
    size = model_memory.get(profile.model, profile.revision)
    return _fit(profile, inventory, size)[0] if size is not None else []


@rule("memory-sizes", "nodes of different memory sizes in one cluster (judged with the memory fit)", "warn")
def _memory_sizes(profile: Profile, inventory: Inventory | None) -> list[Problem]:
    return memory_sizes(inventory) if model_memory.get(profile.model, profile.revision) is not None else []


# vLLM V1's scheduler budget per step when a profile sets none (the OpenAI server's default for
# chunked prefill on large GPUs: vllm/engine/arg_utils.py, default_max_num_batched_tokens)
DEFAULT_STEP_TOKENS = 8192


def supervisor_bounds(profile: Profile) -> list[Problem]:
    """The supervisor must not call a long prefill a wedge (issue 25): the KV cache grows with every
    scheduler step, so stall_s must cover one step at the slowest prefill rate, twice over; and the
    longest prompt (max_model_len) is said for the owner to read with the probe's bounds."""
    sv, s = profile.supervisor, profile.serve
    step = s.max_num_batched_tokens or DEFAULT_STEP_TOKENS
    step_s = step / sv.prefill_floor_tok_s
    if sv.stall_s < 2 * step_s:
        return [
            Problem(
                "supervisor-stall",
                f"[supervisor] stall_s {sv.stall_s:g} s is under twice one scheduler step ({step} tokens at "
                f"{sv.prefill_floor_tok_s:g} tok/s = {step_s:.0f} s): a long prefill would read as a wedge",
                f"raise [supervisor] stall_s to {2 * step_s:.0f} or more (or lower serve.max_num_batched_tokens, "
                "or state the setup's prefill rate in [supervisor] prefill_floor_tok_s)",
            )
        ]
    return []


def _speculative_problems(spec: dict | None) -> list[Problem]:
    """Speculative decoding: an MTP drafter belongs under method "mtp", not "draft_model".

    Seed 004: Gemma 4's drafter (google/gemma-4-26B-A4B-it-assistant) runs as
    {"method":"mtp","model":...}; "draft_model" runs the drafter as a full model and switching
    to "mtp" gave +40% generation throughput. "mtp" with a `model` is therefore right, and
    "mtp" without one (Qwen3.6, seed 004) uses the model's own MTP layers.
    """
    if not spec or spec.get("method") != "draft_model":
        return []
    drafter = spec.get("model")
    return [
        Problem(
            "speculative-method",
            f'speculative_config method "draft_model" runs the drafter {drafter or "(none given)"} as a '
            "full model: generation is slower than with an MTP drafter (seed 004: +40% after switching)",
            'set serve.speculative_config.method = "mtp", keeping the drafter as model (seed 004)',
        )
    ]


@rule("memory-sum", "single-node profiles planned on one node whose utilizations sum above 0.85", when="plan")
def memory_sum_problems(profiles: Sequence[Profile]) -> list[Problem]:
    """Single-node profiles planned on one node: their utilizations share one unified pool.

    Each fraction is of the same ~119 GiB, so the sum must keep the headroom a single profile
    must keep (MAX_GPU_MEMORY_UTILIZATION, 0.85): the host's OS, Docker, sshd and the first
    request's graph-capture spike (counted outside the budget) live in the rest, and MemAvailable
    must stay above the 6 GB floor a seed's watchdog warns at (field notes, "Memory on a
    unified-memory machine" and "Host hardening"). 0.85 is the per-profile limit, not derived from
    that floor: 6 GB alone would allow ~0.95. Seed 004 saw it: Gemma 4 at 0.80 plus a
    Nemotron-Nano sidecar at 0.28 on one Spark "actively hurt" Gemma until the sidecar went.
    """
    total = round(sum(p.serve.gpu_memory_utilization for p in profiles), 4)
    if len(profiles) < 2 or total <= MAX_GPU_MEMORY_UTILIZATION:
        return []
    parts = " + ".join(f"{p.name} {p.serve.gpu_memory_utilization}" for p in profiles)
    return [
        Problem(
            "memory-sum",
            f"--gpu-memory-utilization on one node sums to {total} ({parts}), above "
            f"{MAX_GPU_MEMORY_UTILIZATION} of the shared unified pool: the host starves",
            f"lower the profiles' serve.gpu_memory_utilization to sum to {MAX_GPU_MEMORY_UTILIZATION} "
            "or less, or plan one of them on another node",
        )
    ]


def memory_fit_check(
    profile: Profile, inventory: Inventory | None, size: dict | None = None
) -> tuple[list[Problem], list[str]]:
    """Offline, the arithmetic doctor's mem.fit does (node/memory_fit, issue 52): one rank's share of
    the listed weights plus one max_model_len sequence of KV cache against gpu_memory_utilization x
    each node's memory, the inventory's `memory_gb` (what `init` read) or 128 GB assumed. `size`: the
    model's listing as doctor or up last read it (config/model_memory). Returns (problems, notes:
    what was judged, and what was assumed)."""
    if size is None:
        return [], [
            f"memory fit not judged: no listing of {profile.model} remembered "
            "(`sparkcluster doctor` or `up` reads the hub's listing once and remembers its size)"
        ]
    out, notes = _fit(profile, inventory, size)
    return out + memory_sizes(inventory), notes


def _fit(profile: Profile, inventory: Inventory | None, size: dict) -> tuple[list[Problem], list[str]]:
    """memory_fit_check's arithmetic, node by node, for a remembered listing `size`."""
    s = profile.serve
    tp, pp = s.tensor_parallel_size, s.pipeline_parallel_size
    weights = memory_fit.weights_per_rank(size["weights"], tp, pp)
    kv = memory_fit.kv_min(size.get("config"), s.max_model_len, s.kv_cache_dtype or "auto", tp, pp)
    nodes = {n.name: n.memory_gb for n in inventory.nodes} if inventory is not None else {"a node": None}
    out, notes = [], []
    for name, mem_gb in nodes.items():
        said = (
            f"memory_gb {mem_gb:g} from the inventory"
            if mem_gb
            else f"{memory_fit.DEFAULT_MEMORY_GB:g} GB assumed: the inventory states no memory_gb"
        )
        fit = memory_fit.Fit(
            weights, kv, s.gpu_memory_utilization, int((mem_gb or memory_fit.DEFAULT_MEMORY_GB) * memory_fit.GB)
        )
        whole = f"{memory_fit.gb(size['weights'])} of weights over TP {tp} x PP {pp}"
        line = f"{name}: {fit.arithmetic()} ({said}; {whole} from {size.get('source') or 'a listing'})"
        if fit.fits is False:
            out.append(
                Problem(
                    "memory-fit",
                    line,
                    "serve it on nodes with more memory, over more ranks (tensor or pipeline parallel), or pick a "
                    "smaller checkpoint or max_model_len (`init` records each node's memory_gb)",
                )
            )
        else:
            notes.append(line)
    return out, notes


def memory_sizes(inventory: Inventory | None) -> list[Problem]:
    """Nodes of different memory sizes in one cluster: the smallest sets what every rank holds."""
    nodes = {n.name: n.memory_gb for n in inventory.nodes} if inventory is not None else {}
    known = {n: g * memory_fit.GB for n, g in nodes.items() if g}
    out = []
    if not memory_fit.same_size(known):
        shown = ", ".join(f"{n} {g:g} GB" for n, g in nodes.items() if g)
        out.append(
            Problem(
                "memory-sizes",
                f"nodes of different memory sizes in one cluster ({shown}): the smallest sets what every rank holds",
                "pair Sparks of the same memory size (NVIDIA's vllm-cluster guide: \"use two Sparks of the same "
                'memory size")',
                severity="warn",
            )
        )
    return out


def memory_fit_notes(profile: Profile, inventory: Inventory | None) -> list[str]:
    return memory_fit_check(profile, inventory, model_memory.get(profile.model, profile.revision))[1]


def needs_root(inventory: Inventory) -> list[Problem]:
    """Inventory settings only root could honour: `up` runs as the SSH user, on a Spark an ordinary
    account in `docker` (no sudo). `doctor`'s account.* checks judge the nodes themselves."""
    out = []
    cache = inventory.cluster.hf_cache
    as_root = all(n.ssh.startswith("root@") for n in inventory.nodes)  # root said so itself
    if not as_root and any(cache == d or cache.startswith(d + "/") for d in ROOT_ONLY_DIRS):
        out.append(
            Problem(
                "needs-root",
                f"hf_cache {cache} is under a directory only root may write: the SSH user "
                "(an ordinary account on a Spark) cannot create or update the weights there",
                "remove hf_cache (default: the SSH user's own ~/.cache/huggingface, where `hf download` puts "
                "weights) or set it to a directory that user owns",
            )
        )
    return out


def model_shape(config: dict, tp: int, pp: int, forwarded: dict[str, str] | None = None) -> list[Problem]:
    """The model's own shape against the profile's parallelism, from the snapshot's config.json
    (a multimodal model's text part where it has one): attention heads divide by tensor parallel
    (KV heads divide it, or it divides them: vLLM replicates KV heads below TP), and the layers by
    pipeline parallel unless VLLM_PP_LAYER_PARTITION splits them by hand (NVIDIA playbooks#63).
    The registered model rules, in order."""
    c = config.get("text_config") or config.get("llm_config") or config
    return [x for r in RULES.values() if r.when == "model" for x in r.check(c, tp, pp, forwarded or {})]


@rule("tp-heads", "attention heads that tensor parallel does not divide (the model's config.json)", when="model")
def _tp_heads(c: dict, tp: int, pp: int, forwarded: dict[str, str]) -> list[Problem]:
    heads = c.get("num_attention_heads")
    if not isinstance(heads, int) or not heads % tp:
        return []
    return [
        Problem(
            "tp-heads",
            f"the model has {heads} attention heads, which tensor_parallel_size {tp} does "
            "not divide: vLLM refuses to start",
            f"set serve.tensor_parallel_size to a divisor of {heads} and pipeline_parallel_size so that "
            "TP x PP is still the cluster's GPUs",
        )
    ]


@rule("tp-kv-heads", "KV heads and tensor parallel of which neither divides the other", when="model")
def _tp_kv_heads(c: dict, tp: int, pp: int, forwarded: dict[str, str]) -> list[Problem]:
    kv = c.get("num_key_value_heads")
    if not isinstance(kv, int) or not (kv % tp and tp % kv):
        return []
    return [
        Problem(
            "tp-kv-heads",
            f"the model has {kv} KV heads and tensor_parallel_size is {tp}: neither divides the other",
            f"set serve.tensor_parallel_size to a divisor or a multiple of {kv}",
        )
    ]


@rule("pp-layers", "layers that pipeline parallel does not divide, unless split by hand", when="model")
def _pp_layers(c: dict, tp: int, pp: int, forwarded: dict[str, str]) -> list[Problem]:
    layers = c.get("num_hidden_layers")
    manual = "VLLM_PP_LAYER_PARTITION" in forwarded
    if not isinstance(layers, int) or not (layers < pp or (layers % pp and not manual)):
        return []
    return [
        Problem(
            "pp-layers",
            f"the model has {layers} layers, which pipeline_parallel_size {pp} does not divide into equal stages",
            f"set serve.pipeline_parallel_size to a divisor of {layers}, or forward "
            "VLLM_PP_LAYER_PARTITION with the layers per stage",
        )
    ]


# the rules that need the inventory: they run only when one is given
CLUSTER_RULES = tuple(r.id for r in RULES.values() if r.cluster)
