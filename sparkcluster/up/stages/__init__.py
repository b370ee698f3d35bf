"""The stages of `up`, one module each, in the order they run: the one registry of stages.

Each module holds its stage's steps (`steps(plan)`, what the plan prints) together with the mechanics
those steps run, so the two cannot drift; a `summary` of what its steps did; and the state its steps
leave for later ones, a type of its own kept in the run (`UpRun.put`, `UpRun.get`).
"""

from __future__ import annotations

from types import ModuleType

from sparkcluster.up.stages import collective, containers, gate, image, probe, ray, replace, serve, weights

# stage name -> its module, in the order the stages run
STAGES: dict[str, ModuleType] = {
    "preflight": gate,
    "replace": replace,
    "image": image,
    "weights": weights,
    "containers": containers,
    "ray": ray,
    "fabric": collective,
    "probe": probe,
    "serve": serve,
}
