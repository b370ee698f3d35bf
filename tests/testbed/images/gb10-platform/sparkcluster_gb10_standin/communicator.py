"""The stand-in platform's communicator (a testbed test double; see the package docstring). A module
of its own: vLLM imports it by name once its platform is resolved, never while resolving it."""

import os
import socket

import torch
from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator


class Gb10StandinCommunicator(CpuCommunicator):
    """The CPU build's communicator, joined through CPU shared memory only where every rank of the
    group is on one host. vLLM's CPU build assumes one host: where its `_C` has the shared-memory
    ops (`init_shm_manager`), it joins a tensor-parallel group through `/dev/shm` segments whatever
    the hosts, and a rank on another host fails with `open shm in SHMManager failed. errno: 2`
    (seen on the 2026-11-24 CI machine; the machines before it ran without that path). On a Spark pair the ranks meet through
    NCCL; here, across hosts, through torch.distributed (gloo over the link between them)."""

    def _all_group_ranks_share_shm_group_name(self) -> bool:
        here = os.environ.get("VLLM_HOST_IP") or socket.gethostname()
        hosts: list[str] = [""] * self.world_size
        torch.distributed.all_gather_object(hosts, here, group=self.device_group)
        return len(set(hosts)) == 1 and super()._all_group_ranks_share_shm_group_name()
