"""What every check is made of: `Result`, `Expect`, `Context`, `Report`, the `check` decorator and
`REGISTRY`. The areas import it, and the package (`checks/__init__`) imports the areas: nothing here
imports an area, so no area imports the package that imports it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from sparkcluster.config.inventory import Inventory, Node
from sparkcluster.facts import HostFacts
from sparkcluster.facts.parsers import ContainerInspect
from sparkcluster.labels import CLUSTER_LABEL
from sparkcluster.node.memory_fit import KvMin

Status = Literal["ok", "warn", "fail", "skip"]
GiB = 1024**3


@dataclass(frozen=True)
class Result:
    id: str
    node: str
    status: Status
    detail: str = ""
    fix: str = ""

    def as_json(self) -> dict:
        return {"id": self.id, "node": self.node, "status": self.status, "detail": self.detail, "fix": self.fix}


@dataclass(frozen=True)
class Expect:
    """What the profile will need, so checks can judge against it. All optional."""

    image: str | None = None
    base_image: str | None = None  # the profile's base (NGC) image the cluster image is built from
    forwarded_env: dict[str, str] = field(default_factory=dict)
    per_host_env: dict[str, dict[str, str]] = field(default_factory=dict)  # node -> env
    gpu_memory_utilization: float | None = None
    on_demand: bool = False  # the engine starts on demand: its supervisor admits each start, not `up`
    image_disk_bytes: int = 30 * GiB  # NGC vLLM base ~9 GB + Ray; a build needs room twice over
    model_disk_bytes: int = 0
    vllm_version: str | None = None  # of the image to be served: decides what vLLM checks itself
    min_driver: str | None = None  # the lowest NVIDIA driver the profile states, e.g. "590.44"
    # docker flags every container must carry, and which must be identical across nodes
    container_flags: dict[str, object] = field(default_factory=dict)
    # "mp": vLLM's own multi-node launch, no Ray (issue 28): Ray's checks give way to the rendezvous's
    executor: str = "ray"
    # one rank's share of the model's weights (node/memory_fit), None when no listing was seen, and
    # where the figure came from (or why it is unknown); the KV cache of one max_model_len sequence
    weights_per_rank: int | None = None
    weights_source: str = ""
    kv_min: KvMin = field(default_factory=lambda: KvMin(None, "no config.json"))


@dataclass
class Context:
    inventory: Inventory
    facts: dict[str, HostFacts]  # reachable nodes only
    unreachable: dict[str, str]  # node -> reason
    expect: Expect = field(default_factory=Expect)

    def nodes(self) -> list[Node]:
        return [n for n in self.inventory.nodes if n.name in self.facts]

    def ours(self, node: str) -> list[ContainerInspect]:
        return [c for c in self.facts[node].ours if c.labels.get(CLUSTER_LABEL) == self.inventory.cluster.name]


class Report:
    """Where one check records its results; each is stamped with the check's id."""

    def __init__(self, check_id: str):
        self.check_id = check_id
        self.results: list[Result] = []

    def ok(self, node: str, detail: str = "") -> None:
        self.results.append(Result(self.check_id, node, "ok", detail))

    def warn(self, node: str, detail: str, fix: str) -> None:
        self.results.append(Result(self.check_id, node, "warn", detail, fix))

    def fail(self, node: str, detail: str, fix: str) -> None:
        self.results.append(Result(self.check_id, node, "fail", detail, fix))

    def skip(self, node: str, why: str) -> None:
        """Nothing to judge on this node, and why (a skip never has an empty reason)."""
        self.results.append(Result(self.check_id, node, "skip", why))


CheckFn = Callable[[Context], list[Result]]
REGISTRY: list[tuple[str, str, CheckFn]] = []


def check(check_id: str, title: str):
    """Register `fn(ctx, report)` under `check_id`; the registered function returns its results."""

    def deco(fn: Callable[[Context, Report], None]) -> CheckFn:
        @functools.wraps(fn)
        def run(ctx: Context) -> list[Result]:
            report = Report(check_id)
            fn(ctx, report)
            return report.results

        REGISTRY.append((check_id, title, run))
        return run

    return deco
