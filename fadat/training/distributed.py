"""Training on several processes (torchrun): ``gloo`` on CPU, ``nccl`` on CUDA. Every rank
holds the full model; the trainer sums gradients with one ``all_reduce`` per update (the
arithmetic of ``DistributedDataParallel`` with a SUM reduction, see :mod:`fadat.training.trainer`).
Only CPU was run; the CUDA/nccl paths are written device-agnostically but untested.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from fadat.errors import InputError
from fadat.training.checkpoints import capture_rng_state


@dataclass(frozen=True)
class DistInfo:
    """This process's rank, the number of processes and its device."""

    rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup_distributed(device: str) -> DistInfo:
    """Initialise ``torch.distributed`` when launched by torchrun (``WORLD_SIZE`` > 1): gloo on CPU,
    nccl on CUDA (one device per local rank). Otherwise a single process on ``device``."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError("--device cuda requested but CUDA is not available")
        if world > 1:
            dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        elif dev.index is None:
            # torch.cuda.set_device needs an index: plain "cuda" is the current device
            dev = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(dev)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
    return DistInfo(rank=rank, world_size=world, device=dev)


def peak_rss_mib() -> float:
    """This process's peak resident set size in MiB (``ru_maxrss``; Linux counts KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def all_reduce(tensor: torch.Tensor, info: DistInfo, op=None) -> torch.Tensor:
    """Sum (or ``op``) ``tensor`` over ranks in place; a single process returns it unchanged."""
    if info.world_size > 1:
        dist.all_reduce(tensor, op=op or dist.ReduceOp.SUM)
    return tensor


def gather_rng(info: DistInfo) -> list[dict[str, torch.Tensor]]:
    """Every rank's RNG state (rank 0 writes them all into checkpoint_last)."""
    mine = capture_rng_state()
    if info.world_size == 1:
        return [mine]
    out: list[dict[str, torch.Tensor]] = [{} for _ in range(info.world_size)]
    for key in sorted(mine):
        value = mine[key]
        wire = value.to(torch.int64) if value.dtype == torch.uint8 else value
        wire = wire.to(info.device)
        parts = [torch.empty_like(wire) for _ in range(info.world_size)]
        dist.all_gather(parts, wire)
        for r, part in enumerate(parts):
            out[r][key] = part.cpu().to(value.dtype)
    return out
