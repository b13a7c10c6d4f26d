"""torchrun support: the same command runs single-process or data-parallel.

torchrun sets WORLD_SIZE/RANK/LOCAL_RANK; when WORLD_SIZE > 1 we join the process
group (gloo on CPU, nccl on GPUs). Only rank 0 writes files or draws progress bars.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from headprune_cli.errors import HeadpruneError, UsageError, first_line, shorten
from headprune_cli.runtime.faults import note_peers
from headprune_cli.runtime.launch import launch


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1

    def barrier(self) -> None:
        if self.active:
            dist.barrier()

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """All-reduce (sum) a copy; identity when single-process."""
        if not self.active:
            return tensor
        tensor = tensor.clone()
        dist.all_reduce(tensor)
        return tensor


def setup() -> Dist:
    """Join the process group when launched by torchrun with more than one process."""
    place = launch()
    if place.world <= 1:
        return Dist()
    rank, world, local = place.rank, place.world, place.local_rank
    _check_one_gpu_per_process(place.local_world)
    cuda = torch.cuda.is_available() and torch.cuda.device_count() > local
    device = torch.device(f"cuda:{local}") if cuda else torch.device("cpu")
    if not dist.is_initialized():
        if cuda:
            torch.cuda.set_device(device)
        _join("nccl" if cuda else "gloo")
        note_peers(device)
    return Dist(rank=rank, world=world, device=device)


def finish() -> None:
    """Leave the process group together once the work is done: every rank waits for the
    others (rank 0 may still be writing), then the group is destroyed. A rank that exits with
    the group alive can abort at interpreter exit (gloo's threads outlive it: "terminate
    called without an active exception")."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def _join(backend: str) -> None:
    """init_process_group, its failures (nobody listening at the rendezvous, a timeout) as one line."""
    try:
        dist.init_process_group(backend=backend)
    except (RuntimeError, ValueError, OSError) as exc:  # DistNetworkError, DistStoreError are RuntimeErrors
        where = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
        raise HeadpruneError(
            f"could not join the torchrun process group at {where} ({shorten(first_line(exc), 120)})"
        ) from None


def _check_one_gpu_per_process(local_world: int) -> None:
    """On a GPU node every process needs a GPU of its own: nccl cannot share one, and a process
    left on the CPU would join with gloo while the others use nccl, and the group would hang."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if 0 < gpus < local_world:
        raise UsageError(
            f"torchrun started {local_world} processes on this node, which has {gpus} GPU(s); nccl needs one "
            f"GPU per process: use --nproc-per-node {gpus} (or CUDA_VISIBLE_DEVICES= for gloo on the CPU)"
        )


def shard(batch: dict[str, torch.Tensor], ctx: Dist) -> dict[str, torch.Tensor]:
    """This rank's rows of a global batch: rows rank, rank + world, ..."""
    if not ctx.active:
        return batch
    return {k: v[ctx.rank :: ctx.world] for k, v in batch.items()}
