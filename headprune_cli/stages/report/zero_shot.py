"""Causal-LM quality beyond perplexity, from the same forward pass over the eval text.

- `token_accuracy`: how often the model's top-1 next token is the text's next token.
- `next_word_accuracy`: a zero-shot cloze over every word of the eval text (LAMBADA's
  measure, taken at every word instead of only the last of a passage): a word counts as
  predicted when greedy decoding from the true prefix reproduces all of its tokens, i.e.
  every one of them is the model's top-1 choice. A word starts at a token whose text begins
  with whitespace (byte-level BPE `Ġ`/`Ċ`, SentencePiece `▁`); the first word of a row has
  no context and the last one may be cut by truncation, so neither is counted.

Both are fractions (points in a report), higher is better, and need no labels: any held-out
plain text is the task.
"""

from __future__ import annotations

import math
import sys

import torch
from torch import nn

from headprune_cli.data.readers import Dataset, batches, tokenizer_of
from headprune_cli.errors import DataError
from headprune_cli.runtime.device import input_device
from headprune_cli.stages.objectives import LOG_MAX_FLOAT, Metric, check_finite, metric, outputs_of, token_nll

_WORD_MARKS = ("Ġ", "Ċ", "▁", " ", "\n", "\t")


def word_starts(tokenizer_source: nn.Module) -> torch.Tensor:
    """[vocab] bool: which token ids begin a new word (the checkpoint's own tokenizer)."""
    tok = tokenizer_of(tokenizer_source)
    pieces = tok.convert_ids_to_tokens(list(range(len(tok))))
    return torch.tensor([bool(p) and p.startswith(_WORD_MARKS) for p in pieces], dtype=torch.bool)


@torch.no_grad()
def causal_lm_metrics(model: nn.Module, dataset: Dataset, batch_size: int, starts: torch.Tensor) -> list[Metric]:
    """perplexity (as objectives.evaluate computes it), token_accuracy, next_word_accuracy."""
    was_training = model.training
    model.eval()
    try:
        return _metrics(model, dataset, batch_size, starts)
    finally:
        model.train(was_training)


def _metrics(model: nn.Module, dataset: Dataset, batch_size: int, starts: torch.Tensor) -> list[Metric]:
    nll_sum, tokens, hits, words, words_right = 0.0, 0.0, 0, 0, 0
    device = input_device(model)
    for number, cpu_batch in enumerate(batches(dataset, batch_size)):
        batch = {k: v.to(device) for k, v in cpu_batch.items()}
        logits = outputs_of(model, batch)
        nll, count = token_nll(logits, batch)
        check_finite(nll, f"batch {number}")
        nll_sum += float(nll.double().sum())
        tokens += float(count.sum())
        correct, valid = _next_token_hits(logits, cpu_batch)
        hits += int((correct & valid).sum())
        right, total = _word_hits(correct, valid, cpu_batch["input_ids"][:, 1:], starts)
        words_right, words = words_right + right, words + total
    if tokens == 0:
        raise DataError("perplexity needs examples of at least two tokens")
    mean = nll_sum / tokens
    return [
        metric("perplexity", math.exp(mean) if mean < LOG_MAX_FLOAT else sys.float_info.max),
        metric("token_accuracy", hits / tokens),
        metric("next_word_accuracy", words_right / words if words else 0.0),
    ]


def _next_token_hits(logits: torch.Tensor, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, T-1] whether the top-1 prediction at t is token t+1, and whether t+1 is predicted."""
    predicted = logits[:, :-1].argmax(-1).cpu()
    mask = batch["attention_mask"].bool()
    return predicted == batch["input_ids"][:, 1:], mask[:, 1:] & mask[:, :-1]


def _word_hits(
    correct: torch.Tensor, valid: torch.Tensor, targets: torch.Tensor, starts: torch.Tensor
) -> tuple[int, int]:
    """(words all of whose tokens were top-1, words counted) in one batch."""
    vocab = starts.shape[0]
    begins = valid & starts[targets.clamp(0, vocab - 1)] & (targets < vocab)
    word = begins.long().cumsum(1)  # 0 before the first counted word start
    width = targets.shape[1] + 1
    flat = (torch.arange(targets.shape[0]).unsqueeze(1) * width + word)[valid]
    misses = torch.zeros(targets.shape[0] * width, dtype=torch.long).index_add_(0, flat, (~correct[valid]).long())
    last = word.max(1).values  # the row's last word: maybe cut by truncation, not counted
    ids = torch.arange(width).unsqueeze(0)
    counted = (ids >= 1) & (ids < last.unsqueeze(1))
    right = counted & (misses.view(-1, width) == 0)
    return int(right.sum()), int(counted.sum())
