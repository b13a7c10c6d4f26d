"""A causal LM's output head applied in chunks of tokens: losses without [batch, seq, vocab] logits.

The logits of a batch are tokens x vocabulary floats: 4096 tokens of a 49 k vocabulary are
0.8 GB in float32, and a cross-entropy or a distillation term keeps two or three such
tensors for its backward. Here the model runs with its output head switched off (it
returns the last hidden state), and the head runs on a chunk of tokens at a time inside
torch's non-reentrant activation checkpointing: the forward keeps only each chunk's hidden
states, and the backward computes one chunk's logits again when it reaches it. Memory is
one chunk's logits, whatever the batch and the vocabulary; the gradients are the
unchunked ones (the same per-token arithmetic; only matrix products over fewer rows).

Chunks are used only when a batch's logits exceed CHUNKS_FROM elements, so small models
(the shipped configs) take the plain path and their artifacts stay byte-identical.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from headprune_cli.model.layout import info_of

# float32 logits per chunk: 4 MiB, 21 tokens of a 49 k vocabulary, 8 of a 128 k one (a chunk's
# cross-entropy holds about four such tensors at once).
LOGITS_PER_CHUNK = 1 << 20
# Batches with fewer logits than this (16 MiB in float32) take whole logits.
CHUNKS_FROM = 1 << 22


def chunk_tokens(vocab: int) -> int:
    """How many tokens one chunk holds."""
    return max(1, LOGITS_PER_CHUNK // max(1, vocab))


def head_name(model: nn.Module) -> str | None:
    """The attribute holding the output head when the logits are exactly head(last hidden state)
    (LLaMA, Mistral, Qwen, GPT-2, Gemma without soft-capping), else None: chunks cannot be used."""
    if info_of(model).task != "causal-lm":
        return None
    config = getattr(model, "config", None)
    if getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None) not in (None, 1, 1.0):
        return None
    getter = getattr(model, "get_output_embeddings", None)
    head = getter() if callable(getter) else None
    if not isinstance(head, nn.Linear):
        return None
    return next((name for name, child in model.named_children() if child is head), None)


def wants_chunks(model: nn.Module, batch: dict) -> bool:
    """Whether this batch's logits are large enough to be computed in chunks."""
    name = head_name(model)
    if name is None:
        return False
    ids = batch["input_ids"]
    return ids.numel() * getattr(model, name).out_features > CHUNKS_FROM


@contextmanager
def head_off(model: nn.Module) -> Iterator[nn.Linear]:
    """While open, `model(...)` returns the last hidden state where it returned logits; yields the head."""
    name = head_name(model)
    if name is None:
        raise ValueError("this model's logits are not a plain linear head of its last hidden state")
    head = getattr(model, name)
    setattr(model, name, nn.Identity())
    try:
        yield head
    finally:
        setattr(model, name, head)


def _rows(hidden: torch.Tensor) -> torch.Tensor:
    """[B, T, D] hidden states of the predicting positions (all but the last) as [B*(T-1), D]."""
    return hidden[:, :-1].reshape(-1, hidden.shape[-1])


def _spans(total: int, size: int) -> list[tuple[int, int]]:
    return [(start, min(start + size, total)) for start in range(0, total, size)]


def chunked_nll(head: nn.Linear, hidden: torch.Tensor, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """objectives.token_nll from hidden states: summed next-token NLL per example and the count."""
    from headprune_cli.stages.objectives import next_token_mask  # noqa: PLC0415 (objectives imports this module)

    ids = batch["input_ids"]
    flat, targets = _rows(hidden), ids[:, 1:].reshape(-1)

    def nll(h: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        logits = head(h)  # in at least float32, as objectives.token_nll computes it
        wide = logits if logits.dtype in (torch.float32, torch.float64) else logits.float()
        return F.cross_entropy(wide, t, reduction="none")

    pieces = [_run(nll, flat[a:b], targets[a:b]) for a, b in _spans(len(flat), chunk_tokens(head.out_features))]
    per_token = torch.cat(pieces).view(ids.shape[0], ids.shape[1] - 1)
    valid = next_token_mask(batch).to(per_token.dtype)
    return (per_token * valid).sum(1), valid.sum(1)


def chunked_kd(
    head: nn.Linear,
    hidden: torch.Tensor,
    teacher_head: nn.Linear,
    teacher_hidden: torch.Tensor,
    temperature: float,
    mask: torch.Tensor,
    kd_term,
) -> torch.Tensor:
    """Sum over masked next-token positions of kd_term(student logits, teacher logits, T) [N],
    one chunk of tokens at a time; the teacher's logits never need gradients."""
    flat, ref, weights = _rows(hidden), _rows(teacher_hidden).detach(), mask.reshape(-1)

    def term(h: torch.Tensor, r: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            target = teacher_head(r).float()
        return (kd_term(head(h).float(), target, float(temperature)) * w).sum()

    total = torch.zeros((), device=hidden.device)
    for a, b in _spans(len(flat), chunk_tokens(head.out_features)):
        total = total + _run(term, flat[a:b], ref[a:b], weights[a:b])
    return total


def _run(fn, *args: torch.Tensor) -> torch.Tensor:
    """fn(*args), keeping only its inputs for the backward when gradients are on."""
    if not torch.is_grad_enabled():
        return fn(*args)
    return checkpoint(fn, *args, use_reentrant=False)
