"""The stages of `up`, one module each, in the order they run. Each module holds its stage's steps
(what the plan prints) together with the mechanics those steps run, so the two cannot drift."""

STAGES = ("preflight", "image", "weights", "containers", "ray", "probe", "serve")
