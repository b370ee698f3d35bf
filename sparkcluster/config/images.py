"""The cluster image: the profile's base image plus a pinned Ray (images/Dockerfile.vllm-ray, shipped with
the package: config/shipped)."""

from __future__ import annotations

import re

from sparkcluster.config import shipped
from sparkcluster.config.inventory import Inventory
from sparkcluster.errors import InputError

# Pinned: an unpinned install drifts between nodes built on different days (docs/field-notes.md, "Bring-up").
RAY_VERSION = "2.60.0"
DOCKERFILE = shipped.images_dir() / "Dockerfile.vllm-ray"


# An image reference as Docker reads it, less what `upgrade` cannot take (a digest) and with the
# repository in lower case as profiles keep it (distribution/reference, reference.go's grammar:
# domain-component /([a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])/, an optional :port,
# path-component [a-z0-9]+ joined by the separators [_.]|__|[-]+, tag /[\w][\w.-]{0,127}/, a name of
# at most 255 characters)
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN = r"(?:[a-z0-9]|[a-z0-9][a-z0-9-]*[a-z0-9])(?:\.(?:[a-z0-9]|[a-z0-9][a-z0-9-]*[a-z0-9]))*(?::[0-9]+)?"
IMAGE_REF = re.compile(rf"^(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*:[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}}$")
NAME_MAX = 255


def check_image_ref(ref: str, flag: str = "--image") -> None:
    """`ref` is REPOSITORY:TAG as `docker pull` takes it, or an InputError naming what is wrong, with the
    reference that is likely meant where one is (the CLI prints the command line with it in place)."""
    name = ref.rpartition(":")[0]
    if IMAGE_REF.match(ref) and len(name) <= NAME_MAX:
        return
    why = []
    if any(c.isspace() for c in ref):
        why.append("it has a space")
    if "@" in ref:
        why.append("a digest (@sha256:...) is not taken here")
    if "::" in ref:
        why.append("it has '::'")
    tail = ref.rpartition(":")[2] if ":" in ref else ""
    if not tail or "/" in tail:
        why.append("it names no tag")
    if any(c.isupper() for c in (name if tail and "/" not in tail else ref)):
        why.append("the repository is not lower case")
    if len(name) > NAME_MAX:
        why.append(f"its name is over {NAME_MAX} characters")
    err = InputError(
        f"{flag} {ref!r} is not an image reference"
        + (f" ({'; '.join(why)})" if why else "")
        + ": Docker takes [REGISTRY/]REPOSITORY:TAG, the repository in lower case",
        f"name the image as REPOSITORY:TAG, e.g. {flag} nvcr.io/nvidia/vllm:26.05.post1-py3",
    )
    guess = _likely(ref)
    if guess is not None:
        err.fix = f"name the image as REPOSITORY:TAG: {flag} {guess}"
        err.replace = (ref, guess)
    raise err


def _likely(ref: str) -> str | None:
    """The reference `ref` likely means (spaces as '-', one ':', the repository lowered), if that is one."""
    s = re.sub(r"\s+", "-", ref.strip())
    s = re.sub(r":{2,}", ":", s)
    name, sep, tag = s.rpartition(":")
    if not sep or "/" in tag:
        return None
    guess = f"{name.lower()}:{tag}"
    return guess if IMAGE_REF.match(guess) and len(name) <= NAME_MAX else None


def uses_ray(nodes: int, prof) -> bool:
    """Whether Ray spans the deployment: several nodes unless the profile's executor is vLLM's own (mp,
    the multi-node launch); one node only if the profile asks for Ray (`distributed_executor_backend = "ray"`)."""
    if prof.executor == "mp":
        return False
    return nodes > 1 or prof.serve.distributed_executor_backend == "ray"


def executor_of(nodes: int, prof) -> str:
    """What runs the ranks, as `up`'s plan and the containers' label say it: "ray"; vLLM's own
    multi-node launch "mp"; or "uni", vLLM's one-process executor, which it picks for a world of one
    rank (one node's one GPU) when no backend is named (vLLM's ParallelConfig: uni for world_size 1)."""
    if uses_ray(nodes, prof):
        return "ray"
    return "mp" if nodes > 1 or prof.world_size > 1 else "uni"


def served_as_pulled(nodes: int, prof) -> str:
    """Why the profile's base image is served as it is (no Ray to add, nothing built: pulled by the
    owner), or "" when the cluster image is built."""
    if uses_ray(nodes, prof):
        return ""
    return 'executor "mp"' if prof.executor == "mp" else "one node without Ray"


def image_ref(inv: Inventory, prof) -> str:
    """The image every node's container runs: without Ray (executor "mp", or one node) the
    profile's base image as it is (no Ray layer to add), else the base plus the pinned Ray, built
    once on the head."""
    if not uses_ray(len(inv.nodes), prof):
        return prof.image.ref
    return f"{inv.cluster.image_repo}:{prof.image_tag(RAY_VERSION)}"


def check_dockerfile(prof, nodes: int) -> None:
    """Before `up` connects: the Dockerfile it builds the cluster image from is there (an install made
    without the package's data would otherwise fail half-way, on the head). Without Ray nothing is built."""
    if uses_ray(nodes, prof) and not DOCKERFILE.is_file():
        raise InputError(
            f"the cluster image's Dockerfile is missing from this install: {DOCKERFILE}",
            "reinstall sparkcluster from a built wheel or a checkout (README, Install), which carry it",
        )
