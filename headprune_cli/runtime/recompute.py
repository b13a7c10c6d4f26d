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

import sys
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from headprune_cli.model.arch import adapter_for
from headprune_cli.model.layout import info_of

# Below this many parameters the interpreter, not the weights or activations, dominates
# the process, and recomputation would only cost time (one more forward per batch).
RECOMPUTE_FROM_PARAMETERS = 400_000_000
# A causal LM's gradient pass may hold this much in activations: an eighth of the weights,
# and never less than 64 MiB (below that, splitting batches only costs time).
ACTIVATION_FLOOR = 64 << 20


def wants_recompute(model: nn.Module, requested: bool | None, batch_tokens: int | None = None) -> bool:
    """`--recompute` / `--no-recompute` as asked; by default on for models of 400 M parameters or
    more, and for a causal LM whose batch of `batch_tokens` would not fit its activation budget."""
    if requested is not None:
        return requested
    if sum(p.numel() for p in model.parameters()) >= RECOMPUTE_FROM_PARAMETERS:
        return True
    return batch_tokens is not None and tokens_per_pass(model, False) < batch_tokens


def tokens_per_pass(model: nn.Module, recompute: bool) -> int:
    """How many tokens a causal LM's gradient pass takes at once within its activation budget
    (batches are split into rows that fit); unbounded for other models, whose batches are short
    and whose shipped configs' scores must not change."""
    if info_of(model).task != "causal-lm":
        return sys.maxsize
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    budget = max(ACTIVATION_FLOOR, weights // 8)
    return max(1, budget // _token_bytes(model, recompute))


def _token_bytes(model: nn.Module, recompute: bool) -> int:
    """An estimate of one token's activations kept for the backward. A block keeps about 12
    hidden-size and 5 FFN-width vectors per token (norms, q/k/v, attention output, residuals,
    gate/up/activation/product), counted in float32 (norms and losses upcast); recomputed, every
    block keeps only its input, and one block at a time holds its activations, their gradients
    and its backward's temporaries: five blocks' worth, what SmolLM2-135M measured (about
    350 KB a token above the weights with one row of 128 tokens in flight)."""
    layout = info_of(model).layout
    hidden = model.get_input_embeddings().embedding_dim  # type: ignore[operator]  # nn.Module types it as a tensor
    ffn = max((layout.ffn_width(layer) for layer in layout.layers), default=0)
    block = 4 * (12 * hidden + 5 * ffn)
    if recompute:
        return len(layout.layers) * hidden * next(model.parameters()).element_size() + 5 * block
    return len(layout.layers) * block


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
