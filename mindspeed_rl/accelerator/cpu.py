"""CPU: gloo, one 'device' per CPU slot, megatron-core made to run without CUDA."""
from __future__ import annotations

import gc
from typing import Dict

import torch

from .base import Accelerator, host_rss_gib


class CpuAccelerator(Accelerator):
    kind = "cpu"
    dist_backend = "gloo"
    ray_resource = "CPU"

    def device_count(self) -> int:
        import os

        return os.cpu_count() or 1

    def device(self, local_rank: int = 0) -> torch.device:
        return torch.device("cpu")

    def synchronize(self) -> None:
        return None

    def empty_cache(self) -> None:
        gc.collect()

    def memory_stats(self) -> Dict[str, float]:
        rss = host_rss_gib()
        return {"allocated_gib": rss, "reserved_gib": rss, "max_allocated_gib": rss, "host_rss_gib": rss}

    def prepare_megatron(self) -> None:
        from .megatron_cpu_compat import apply

        apply()

    def prepare_vllm(self) -> None:
        """No torch.compile in an in-process vLLM on CPU: its compiled helpers (the sampler's log-prob
        gather, the vocab-parallel embedding mask) cost 3-4 s per process on first use, with infer TP > 1
        while the peer rank spins in the shared-memory all-reduce, and buy nothing at this scale."""
        import os
        import uuid

        import torch._dynamo
        import torch.distributed as dist

        torch._dynamo.config.disable = True
        # vLLM names the shared-memory segments of its CPU TP all-reduce after the group's ranks and an
        # identity that is empty for in-process engines: two jobs on one host (or a segment an earlier
        # run left behind) then collide ("create shm in SHMManager failed. errno: 17"). Prefix every
        # name with a token that all ranks of this world share.
        if dist.is_initialized() and dist.get_world_size() > 1:
            token = [uuid.uuid4().hex[:12]]
            dist.broadcast_object_list(token, src=0)
            os.environ[SHM_IDENT] = f"mindspeed_rl_{token[0]}"
            _prefix_shm_group_names()

    def release_vllm(self) -> None:
        """Unlink this engine's shared-memory segments (vLLM leaves them in /dev/shm)."""
        import glob
        import os

        ident = os.environ.pop(SHM_IDENT, "")
        if not ident:
            return
        for path in glob.glob(os.path.join("/dev/shm", glob.escape(ident) + "*cpushm*")):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass  # a peer rank removed it first


SHM_IDENT = "MINDSPEED_RL_VLLM_SHM_IDENT"


def _prefix_shm_group_names() -> None:
    import os

    from vllm.distributed.device_communicators import cpu_communicator

    shm = cpu_communicator._CPUSHMDistributed
    original = getattr(shm.make_group_name, "mindspeed_rl_original", shm.make_group_name)

    def make_group_name(communicator) -> str:
        # the original starts with the port of the init method: "//" for the external launcher's env://
        return os.environ.get(SHM_IDENT, "") + original(communicator).replace("/", "")

    make_group_name.mindspeed_rl_original = original
    shm.make_group_name = staticmethod(make_group_name)
