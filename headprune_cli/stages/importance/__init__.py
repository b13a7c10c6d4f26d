"""Importance of every head (and layer): one small scorer class per method, a registry.

A scorer is a callable `scorer(ctx) -> list[Tensor]` (one float64 tensor per kept layer,
in the model's current head order; higher = more important). `score_model` turns that
into original indices; `scores_artifact` wraps it in the versioned JSON envelope.
"""

from headprune_cli.stages.importance.api import HEAD_METHODS, LAYER_METHODS, make_scorer, score_model, scores_artifact
from headprune_cli.stages.importance.context import ScoreContext, init_distributed, world

__all__ = [
    "HEAD_METHODS", "LAYER_METHODS", "ScoreContext", "init_distributed", "make_scorer",
    "score_model", "scores_artifact", "world",
]
