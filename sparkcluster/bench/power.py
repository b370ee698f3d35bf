"""A level's GPU energy per 1,000 output tokens (issue 75): the deployment's GPU power, every node's
summed by the head's supervisor (node/energy) and read from its state file every SAMPLE_S while the
level runs, averaged, over the level's output tokens per second. Pure: the samples are passed in."""

from __future__ import annotations

SAMPLE_S = 2.0  # one read of the head's state file (the supervisor rewrites it every look, 2 s)


def level_energy(power_w: list[float], output_tok_s: float | None) -> dict[str, float | None]:
    """{power_w: the level's mean GPU power, j_per_1k_out: joules per 1,000 output tokens}; each None
    where there is no power reading (no NVML, no nvidia-smi) or no output token."""
    if not power_w:
        return {"power_w": None, "j_per_1k_out": None}
    mean = sum(power_w) / len(power_w)
    per_1k = mean / output_tok_s * 1000 if isinstance(output_tok_s, (int, float)) and output_tok_s > 0 else None
    return {"power_w": round(mean, 2), "j_per_1k_out": None if per_1k is None else round(per_1k, 1)}
