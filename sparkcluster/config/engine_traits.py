"""How the vLLM of the image being served behaves, where sparkcluster's checks depend on it.

Flags and variables a version accepts are gated in `flags`; this module gates behaviour. What we
know, and from where (docs/field-notes.md, "vLLM's own environment copying", and
shared measurements of the real vLLM 0.32 CPU build on the testbed):

- vLLM 0.21 (the NGC 26.05 image) runs the older Ray executor: it copies the driver's VLLM_*/NCCL_*/
  UCX_*/HF_* variables to every rank and they OVERWRITE the rank's own, unless named in
  `ray_non_carry_over_env_vars.json`; it refuses to start when two nodes register one IP ("Every
  node should have a unique IP address").
- vLLM 0.32 runs the V2 Ray executor by default: copied variables are applied with `setdefault`
  (a rank's own value wins) and there is no unique-IP check, so a node registered at the wrong
  address is served from anyway. `VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0` brings the older executor back.
- Both: the API server exits with status 0 when a rank dies, so an exit status proves nothing.

The release that made V2 the default lies between the two; we gate at the first one observed.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkcluster.config.flags import parse_version

V2_EXECUTOR_DEFAULT_SINCE = (0, 32, 0)
V2_SWITCH = "VLLM_USE_RAY_V2_EXECUTOR_BACKEND"


@dataclass(frozen=True)
class EngineTraits:
    vllm_version: str
    ray_executor: str  # "v2" or "v1"

    @property
    def head_values_overwrite_ranks(self) -> bool:
        """The driver's copied variables overwrite a rank's own (v1), unless listed as non-carry-over."""
        return self.ray_executor == "v1"

    @property
    def checks_unique_node_ips(self) -> bool:
        """vLLM itself refuses two nodes at one IP (v1 only)."""
        return self.ray_executor == "v1"

    def node_ip_consequence(self) -> str:
        if self.checks_unique_node_ips:
            return (
                f"vLLM {self.vllm_version} would stop at start-up with "
                '"Every node should have a unique IP address" or wait on a placement group'
            )
        return (
            f"vLLM {self.vllm_version} (Ray executor V2) does not check node IPs itself and "
            "would serve with ranks reached at the wrong address"
        )


def traits(vllm_version: str, forwarded_env: dict[str, str] | None = None) -> EngineTraits:
    """The behaviour of the image's vLLM, given the variables the profile forwards."""
    v2 = parse_version(vllm_version) >= V2_EXECUTOR_DEFAULT_SINCE
    switch = (forwarded_env or {}).get(V2_SWITCH)
    if switch is not None:
        v2 = switch.strip().lower() not in ("0", "false", "no", "off", "")
    return EngineTraits(vllm_version, "v2" if v2 else "v1")
