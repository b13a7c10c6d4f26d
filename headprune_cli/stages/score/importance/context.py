"""What every scorer works from: the model, the data, the objective, and the shard.

Scorers sum per-batch statistics in float64 and call `ctx.reduce` once; under
`torchrun` (RANK/WORLD_SIZE set) each process takes every WORLD_SIZE-th batch of the
same batches a single process would see, so the only difference from one process is
the order of float64 additions.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from headprune_cli.data.readers import Dataset, as_batch, num_batches
from headprune_cli.model.layout import info_of
from headprune_cli.runtime.device import input_device
from headprune_cli.runtime.distributed import setup
from headprune_cli.runtime.launch import launch

# progress(description, total) -> advance(); the CLI passes a rich progress bar.
ProgressFactory = Callable[[str, int], Callable[[], None]]


def no_progress(description: str, total: int) -> Callable[[], None]:
    return lambda: None


def world() -> tuple[int, int]:
    """(rank, world size) from torchrun's environment; (0, 1) for one process."""
    place = launch()
    return place.rank, place.world


def init_distributed() -> None:
    """Join the process group torchrun set up, the same way finetune does (distributed.setup)."""
    setup()


@dataclass
class ScoreContext:
    model: nn.Module
    dataset: Dataset
    objective: str
    batch_size: int = 32
    seed: int = 0
    progress: ProgressFactory = no_progress
    cache: dict = field(default_factory=dict)  # shared passes (gradient statistics) for `combined`
    ffn: bool = False  # also gather FFN neuron statistics (`score --ffn`)
    recompute: bool = False  # gradient passes recompute each block in the backward (`score --recompute`)
    tokens_per_pass: int = sys.maxsize  # gradient passes split a batch into rows holding at most this many tokens

    @property
    def device(self) -> torch.device:
        """Where batches go and sums live: the input embeddings' device (layers may sit elsewhere)."""
        return input_device(self.model)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def layout(self):
        return info_of(self.model).layout

    def head_counts(self) -> list[int]:
        return [len(h) for h in self.layout.heads]

    def my_batches(self, description: str) -> Iterator[tuple[int, int, dict]]:
        """(batch number, index of its first example, batch on device) for this process's shard."""
        rank, size = world()
        total = num_batches(self.dataset, self.batch_size)
        mine = list(range(rank, total, size))
        advance = self.progress(description, len(mine)) if rank == 0 else (lambda: None)
        for number in mine:
            start = number * self.batch_size
            batch = as_batch(self.dataset.select(start, start + self.batch_size))
            yield number, start, {k: v.to(self.device) for k, v in batch.items()}
            advance()

    def pieces(self, start: int, batch: dict) -> Iterator[tuple[int, dict]]:
        """(index of its first example, rows) of `batch` a few rows at a time within
        `tokens_per_pass` (the whole batch when it fits): per-example statistics add up the same."""
        size, width = batch["input_ids"].shape[:2]
        rows = max(1, self.tokens_per_pass // max(1, width))
        if rows >= size:
            yield start, batch
            return
        for first in range(0, size, rows):
            yield start + first, {k: v[first : first + rows] for k, v in batch.items()}

    def reduce(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """Sum float64 tensors over all processes (identity for one process)."""
        if world()[1] == 1:
            return tensors

        flat = torch.cat([t.reshape(-1) for t in tensors]).to(torch.float64)
        dist.all_reduce(flat)
        out, offset = [], 0
        for t in tensors:
            out.append(flat[offset : offset + t.numel()].view_as(t).to(t.device))
            offset += t.numel()
        return out


@contextmanager
def trainable_only(model: nn.Module, keep: Sequence[nn.Parameter] = ()) -> Iterator[None]:
    """Turn off gradients of every parameter but `keep`: scoring needs gate gradients, not weight gradients."""
    saved = [(p, p.requires_grad) for p in model.parameters()]
    keep_ids = {id(p) for p in keep}
    for p, _ in saved:
        p.requires_grad_(id(p) in keep_ids)
    try:
        yield
    finally:
        for p, flag in saved:
            p.requires_grad_(flag)
