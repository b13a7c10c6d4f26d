"""random (a seeded baseline) and combined (a weighted sum of normalised scores)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from headprune_cli.errors import UsageError
from headprune_cli.names import did_you_mean
from headprune_cli.stages.score.importance.context import ScoreContext
from headprune_cli.stages.score.importance.neurons import random_scores
from headprune_cli.stages.score.importance.protocol import Importance

DEFAULT_WEIGHTS = {"taylor": 1.0, "loo": 1.0}


class Random(Importance):
    """Uniform [0, 1) per ORIGINAL (layer, head): a pruned model's heads keep their draws."""

    name = "random"

    def heads(self, ctx: ScoreContext) -> list[torch.Tensor]:
        layout = ctx.layout
        gen = torch.Generator().manual_seed(ctx.seed)
        table = torch.rand(layout.num_layers, max(layout.num_heads), generator=gen, dtype=torch.float64)
        return [table[layer, heads].to(ctx.device) for layer, heads in zip(layout.layers, layout.heads)]

    def neurons(self, ctx: ScoreContext) -> list[torch.Tensor]:
        return random_scores(ctx)


def min_max(scores: list[torch.Tensor]) -> list[torch.Tensor]:
    """Scale all heads of the model to [0, 1] together (layers stay comparable)."""
    flat = torch.cat(scores)
    low, span = flat.min(), flat.max() - flat.min()
    return [(s - low) / span if span > 0 else torch.zeros_like(s) for s in scores]


class Combined(Importance):
    """sum_m w_m * min_max(score_m): methods share one gradient pass where they can."""

    name = "combined"

    def __init__(self, weights: Mapping[str, float] | None = None, normalize: bool = True):
        from headprune_cli.stages.score.importance.api import make_scorer  # noqa: PLC0415 (api builds this class: a top-level import would be a circle)

        self.weights = dict(weights or DEFAULT_WEIGHTS)
        self.make: Callable[[str], Importance] = lambda method: make_scorer(method, normalize=normalize)
        if not self.weights:
            raise UsageError("combined needs at least one METHOD=WEIGHT")
        for method in self.weights:
            if method == "combined":
                raise UsageError("combined cannot include itself")
            self.make(method)  # an unknown name fails here, before any work

    def heads(self, ctx: ScoreContext) -> list[torch.Tensor]:
        total = None
        for method, weight in sorted(self.weights.items()):
            part = [weight * s for s in min_max(self.make(method).heads(ctx))]
            total = part if total is None else [a + b for a, b in zip(total, part)]
        assert total is not None  # __init__ refuses an empty weight list
        return total

    def settings(self) -> dict[str, Any]:
        return {"weights": dict(sorted(self.weights.items()))}


def parse_weights(items: list[str] | None, known: list[str]) -> dict[str, float] | None:
    """`taylor=0.5,loo=1` or repeated `--weights taylor=0.5` -> {method: weight}."""
    if not items:
        return None
    weights = {}
    for item in (part.strip() for text in items for part in text.split(",")):
        name, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--weights expects METHOD=WEIGHT, got {item!r}")
        if name not in known:
            raise UsageError(f"unknown method {name!r} in --weights" + did_you_mean(name, known))
        try:
            weights[name] = float(value)
        except ValueError:
            raise UsageError(f"--weights {name}: {value!r} is not a number") from None
        if weights[name] != weights[name] or abs(weights[name]) == float("inf"):
            raise UsageError(f"--weights {name}: the weight must be finite")
    return weights
