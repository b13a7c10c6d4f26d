"""Recompute each block in the backward instead of keeping its activations (`score --recompute`).

A gradient pass keeps, for the backward, every activation of every block: at LLM scale
that is the part of scoring that grows past the weights (BENCHMARKS section 8: 0.39 GB for
2 x 64 tokens through a 1.1 B LLaMA, above the 1.3x-the-checkpoint memory rule). Wrapped in
torch's non-reentrant activation checkpointing, a block keeps only its inputs and runs its
forward once more when the backward reaches it, so one block's activations are alive at a
time, for one more forward per batch.

Scores do not change: the recomputed forward is the same arithmetic on the same inputs,
and the gate and neuron-tap hooks stay attached until the backward has run, so the
recomputation sees the same graph (torch checks the recomputed tensors' shapes). Hooks that
register tensor hooks fire on the original forward's tensors only, which is what the
backward differentiates, so nothing is counted twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from headprune_cli.model.arch import adapter_for

# Below this many parameters the interpreter, not the weights or activations, dominates
# the process, and recomputation would only cost time (one more forward per batch).
RECOMPUTE_FROM_PARAMETERS = 400_000_000


def wants_recompute(model: nn.Module, requested: bool | None) -> bool:
    """`--recompute` / `--no-recompute` as asked; by default on for models of 400 M parameters or more."""
    if requested is not None:
        return requested
    return sum(p.numel() for p in model.parameters()) >= RECOMPUTE_FROM_PARAMETERS


@contextmanager
def recomputed_blocks(model: nn.Module, enabled: bool = True) -> Iterator[None]:
    """While open, every block of `model` runs under activation checkpointing."""
    if not enabled:
        yield
        return
    blocks = adapter_for(model).layer_list(model)
    saved = [block.__dict__.get("forward") for block in blocks]  # an instance-level forward (e.g. accelerate's)
    for block in blocks:
        block.forward = _checkpointed(block.forward)
    try:
        yield
    finally:
        for block, own in zip(blocks, saved):
            if own is None:
                del block.forward
            else:
                block.forward = own


def _checkpointed(forward):
    def run(*args, **kwargs):
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run
