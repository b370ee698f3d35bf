"""A deployment's GPU power and energy per 1,000 generated tokens, and "busy but low power" (issue 75),
from what the head's supervisor reads at each look: every node's GPU power (NVML, this node's through
metrics.Nvml and each peer's from its report, `gpu_power_w`) and the engine's generation counter.

Energy per 1,000 tokens is the GPU energy over the last WINDOW_S (power integrated over the looks'
times) divided by the tokens generated in it; none while no token was generated or any node's power
is unknown (never a figure from part of the deployment).

"Busy but low power": requests running while every GPU of the deployment draws under LOW_POWER_W
for LOW_POWER_SAMPLES looks in a row. A GB10 doing work draws well above it: a llama.cpp benchmark on
one saw the GPU alternate between 15-20 W and 31-36 W (ggml-org/llama.cpp discussion #18254, as
quoted in tonyd2wild/DeepSeek-V4.1-Flash-vLLM-DGX-Spark#1), so under 15 W with requests running is
below even its slow state. It is evidence beside the progress counters, named in a wedge verdict's
cause; never a verdict by itself (a node's power reading can lag, a request can wait on the host).

Standard library only: this file is shipped into every container."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

LOW_POWER_W = 15.0
LOW_POWER_SAMPLES = 5
WINDOW_S = 60.0


@dataclass
class Energy:
    """One start's readings (a new one per start): `update` at each look."""

    power_w: float | None = None  # every node's GPUs, summed; None while any node's is unknown
    joules_per_1k: float | None = None
    low_samples: int = 0
    low_max_w: float | None = None  # the highest node's power at the last low look
    samples: deque = field(default_factory=deque)  # (t, generated tokens, power_w)

    def update(self, now: float, powers: dict[str, float | None], generated: float | None, busy: bool) -> bool:
        """This look's readings; True when "busy but low power" has just begun (journalled once)."""
        known = [p for p in powers.values() if isinstance(p, (int, float))]
        self.power_w = round(sum(known), 3) if known and len(known) == len(powers) else None
        if self.power_w is not None and generated is not None:
            self.samples.append((now, generated, self.power_w))
        while self.samples and now - self.samples[0][0] > WINDOW_S:
            self.samples.popleft()
        self.joules_per_1k = joules_per_1k(list(self.samples))
        was = self.low
        if busy and known and len(known) == len(powers) and max(known) < LOW_POWER_W:
            self.low_samples += 1
            self.low_max_w = max(known)
        else:
            self.low_samples, self.low_max_w = 0, None
        return self.low and not was

    @property
    def low(self) -> bool:
        return self.low_samples >= LOW_POWER_SAMPLES

    def signal(self) -> str:
        """The evidence a wedge verdict's cause adds ("" when there is none)."""
        if not self.low:
            return ""
        under = f"every GPU under {LOW_POWER_W:g} W for {LOW_POWER_SAMPLES}+ looks"
        return f"busy but low power: {under} with requests running"


def power_report(gpus: list[dict]) -> dict:
    """What a node's report says of its GPUs' power (metrics.Nvml.readings()): their sum in watts,
    absent where NVML does not answer or reads no power (never zero)."""
    watts = [g["power_w"] for g in gpus if isinstance(g.get("power_w"), (int, float))]
    return {"gpu_power_w": round(sum(watts), 3)} if watts else {}


def joules_per_1k(samples: list[tuple[float, float, float]]) -> float | None:
    """GPU energy per 1,000 generated tokens over `samples` (time, tokens counter, watts), pure: the
    power integrated by the trapezoid rule, over the tokens between the first sample and the last."""
    if len(samples) < 2:
        return None
    tokens = samples[-1][1] - samples[0][1]
    if tokens <= 0:
        return None
    joules = sum((b[0] - a[0]) * (a[2] + b[2]) / 2 for a, b in zip(samples, samples[1:]))
    return round(joules / tokens * 1000, 3)
