"""Importance of every head, FFN neuron and layer: one small class per method, one registry.

Every method is an `Importance` (protocol.py): `heads(ctx)` / `neurons(ctx)` return one
float64 tensor per kept layer in the model's current order, `layers(ctx)` one score per kept
layer; higher = more important. registry.py declares each method once (class, units,
scale, options). `score_model` turns the scores into a ScoreTable in original indices;
`scores_artifact` wraps it in the versioned JSON envelope. The registry needs no torch, so
selection can read what a method's scores mean without loading it; the rest loads on first use.
"""

from importlib import import_module

from headprune_cli.stages.score.importance.registry import HEAD_METHODS, LAYER_METHODS

_LAZY = {
    "Importance": "protocol",
    "make_scorer": "api",
    "score_model": "api",
    "scores_artifact": "api",
    "ScoreContext": "context",
    "init_distributed": "context",
    "world": "context",
}

__all__ = ["HEAD_METHODS", "LAYER_METHODS", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
