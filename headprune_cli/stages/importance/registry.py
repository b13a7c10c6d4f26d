"""What every importance method is, declared once: its scorer class, which units it
scores, whether its scores are loss changes, and which options it takes.

Selection reads the declarations (joint selection prices only loss-scale scores against
each other) without importing torch; `make_scorer` builds the class from the same entry.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from headprune_cli.errors import UsageError
from headprune_cli.names import did_you_mean


@dataclass(frozen=True)
class Method:
    name: str
    scorer: str  # "module:Class" under headprune_cli.stages.importance
    units: str  # "heads" or "layers"
    loss_scale: bool  # scores are measured loss changes (comparable across units)
    options: tuple[str, ...] = ()  # score options it takes besides the common ones
    measures_attention: bool = False  # layer methods that also measure each layer's heads together

    def make(self, **settings):
        module, cls = self.scorer.split(":")
        return getattr(importlib.import_module(f"headprune_cli.stages.importance.{module}"), cls)(**settings)


_HEADS = [
    Method("gradient", "gradients:Gradient", "heads", False, ("normalize",)),
    Method("taylor", "gradients:Taylor", "heads", False),
    Method("taylor-weight", "gradients:TaylorWeight", "heads", False),
    Method("fisher", "gradients:Fisher", "heads", False),
    Method("loo", "masked:LeaveOneOut", "heads", True),
    Method("entropy", "masked:Entropy", "heads", False),
    Method("combined", "baselines:Combined", "heads", False, ("weights",)),
    Method("random", "baselines:Random", "heads", False),
    Method("l0", "l0:L0", "heads", False),
]
_LAYERS = [
    Method("cosine", "layers:BlockInfluence", "layers", False),
    Method("loo", "layers:LayerLeaveOneOut", "layers", True, measures_attention=True),
    Method("refit", "layers:LayerRefit", "layers", True, measures_attention=True),
]
HEAD_METHODS: dict[str, Method] = {m.name: m for m in _HEADS}
LAYER_METHODS: dict[str, Method] = {m.name: m for m in _LAYERS}
DEFAULT_LAYER_METHOD = "refit"  # on the real task it chose the layers recovery wins back (BENCHMARKS.md §10)


def head_method(name: str) -> Method:
    if name not in HEAD_METHODS:
        raise UsageError(f"unknown method {name!r}" + did_you_mean(name, HEAD_METHODS))
    return HEAD_METHODS[name]


def layer_method(name: str) -> Method:
    if name not in LAYER_METHODS:
        raise UsageError(f"unknown layer method {name!r}" + did_you_mean(name, LAYER_METHODS))
    return LAYER_METHODS[name]


def loss_scale_layer_methods() -> tuple[str, ...]:
    return tuple(name for name, m in LAYER_METHODS.items() if m.loss_scale)


def is_loss_scale(head: str | None, layers: str | None = None) -> bool:
    """Whether head scores by `head` (or layer scores by `layers`) are loss changes."""
    if layers is not None:
        return layers in LAYER_METHODS and LAYER_METHODS[layers].loss_scale
    return head in HEAD_METHODS and HEAD_METHODS[head].loss_scale
