"""Causal-LM metrics of report: perplexity, top-1 next-token and next-word accuracy."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from headprune_cli.data.readers import Dataset
from headprune_cli.stages import objectives
from headprune_cli.stages.report.zero_shot import causal_lm_metrics

# Tokens: 0 "The", 1 "Ġcat", 2 "Ġsat", 3 "s", 4 "Ġon", 5 "Ġmat": all but 0 and 3 begin a word.
STARTS = torch.tensor([False, True, True, False, True, True])
IDS = torch.tensor([[0, 1, 2, 3, 4, 5], [0, 2, 4, 0, 0, 0]])
MASK = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]])
# The model's top-1 guess at each position (for the token after it).
GUESS = torch.tensor([[1, 2, 0, 4, 0, 0], [2, 5, 0, 0, 0, 0]])


class Guesser(nn.Module):
    """A causal LM whose logits put most mass on GUESS (and a little on the others)."""

    def __init__(self) -> None:
        super().__init__()
        self.anchor = nn.Parameter(torch.zeros(1))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **_) -> SimpleNamespace:
        rows = [0 if int(row[1]) == 1 else 1 for row in input_ids]  # which of IDS' rows each one is
        guess = GUESS[rows, : input_ids.shape[1]]  # batches trim trailing padding columns
        logits = torch.nn.functional.one_hot(guess, 6).float() * 3.0
        return SimpleNamespace(logits=logits + self.anchor)


def test_words_count_only_when_every_token_is_top1() -> None:
    metrics = {m.name: m for m in causal_lm_metrics(Guesser(), Dataset(IDS, MASK), 2, STARTS)}
    # Row 0 predicts 1,2,3,4,5: hits on 1,2,4. Row 1 predicts 2,4: a hit on 2.
    assert metrics["token_accuracy"].value == pytest.approx(4 / 7)
    # Row 0 counts "Ġcat" (right), "Ġsat s" (the "s" missed), "Ġon" (right); "Ġmat" is the
    # row's last word. Row 1 counts "Ġsat" (right); "Ġon" is its last word.
    assert metrics["next_word_accuracy"].value == pytest.approx(3 / 4)
    assert metrics["next_word_accuracy"].higher_is_better and metrics["token_accuracy"].higher_is_better


def test_perplexity_is_the_objective_s_own() -> None:
    dataset = Dataset(IDS, MASK)
    ours = causal_lm_metrics(Guesser(), dataset, 1, STARTS)[0]
    theirs = objectives.evaluate(Guesser(), dataset, "causal-lm", batch_size=2)[0]
    assert ours.name == theirs.name == "perplexity" and math.isclose(ours.value, theirs.value, rel_tol=1e-12)


def test_batching_does_not_change_the_counts() -> None:
    one = causal_lm_metrics(Guesser(), Dataset(IDS, MASK), 1, STARTS)
    two = causal_lm_metrics(Guesser(), Dataset(IDS, MASK), 2, STARTS)
    assert [m.value for m in one[1:]] == [m.value for m in two[1:]]
