"""What every importance method is, declared once: its scorer class (an `Importance`,
protocol.py), which units it scores, whether its scores are loss changes, and which
options it takes. Adding a method is one class and one entry here.

Selection reads the declarations (joint selection prices only loss-scale scores against
each other) without importing torch; `make_scorer` builds the class from the same entry,
passing it only the options the entry names.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Protocol

from headprune_cli.errors import UsageError
from headprune_cli.names import did_you_mean


@dataclass(frozen=True)
class Method:
    name: str
    scorer: str  # "module:Class" under headprune_cli.stages.score.importance
    units: str  # "heads" (its `heads()`, and `neurons()` where `ffn` is YES) or "layers" (its `layers()`)
    loss_scale: bool  # scores are measured loss changes (comparable across units)
    options: tuple[str, ...] = ()  # score options its class takes (keyword arguments) besides the common ones
    measures_attention: bool = False  # layer methods that also measure each layer's heads (and FFN) together
    ffn: str | None = None  # it scores FFN neurons too (`score --ffn`); else why not

    def make(self, **settings):
        module, cls = self.scorer.split(":")
        return getattr(importlib.import_module(f"headprune_cli.stages.score.importance.{module}"), cls)(**settings)


YES = ""  # Method.ffn for methods that score neurons
_HEADS = [
    Method("gradient", "gradients:Gradient", "heads", False, ("normalize",), ffn=YES),
    Method("taylor", "gradients:Taylor", "heads", False, ffn=YES),
    Method("taylor-weight", "gradients:TaylorWeight", "heads", False, ffn=YES),
    Method("fisher", "gradients:Fisher", "heads", False, ffn=YES),
    Method("activation", "activation:Activation", "heads", False, ffn=YES),
    Method(
        "loo",
        "masked:LeaveOneOut",
        "heads",
        True,
        ffn="loo would run one forward pass per neuron (thousands per layer); score neurons with fisher or taylor, "
        "and layers with --layers --layer-method loo",
    ),
    Method(
        "entropy",
        "masked:Entropy",
        "heads",
        False,
        ffn="entropy measures attention distributions, which FFN neurons do not have",
    ),
    Method(
        "combined",
        "baselines:Combined",
        "heads",
        False,
        ("weights", "normalize"),
        ffn="combined min-max-normalises per method, which puts neurons and heads on no common scale",
    ),
    Method("random", "baselines:Random", "heads", False, ffn=YES),
    # The published LLM pruning criteria (flap.py, llm_pruner.py), each as its paper defines it.
    Method("flap", "flap:Flap", "heads", False, ffn=YES),
    Method("wanda-sp", "flap:WandaSp", "heads", False, ffn=YES),
    Method("minitron", "flap:Minitron", "heads", False, ffn=YES),
    Method("llm-pruner", "llm_pruner:LlmPruner", "heads", False, ffn=YES),
    # Structured OBS (obs.py): the units the least-squares refit of `prune --data` repairs best.
    Method("obs", "obs:Obs", "heads", False, ("obs_norm", "obs_score", "obs_damp"), ffn=YES),
    Method(
        "l0",
        "l0:L0",
        "heads",
        False,
        ffn="l0 trains gates on heads only; use `headprune learn --gate-ffn`, or fisher/taylor neuron scores",
    ),
]
_LAYERS = [
    Method("cosine", "layers:BlockInfluence", "layers", False),  # ShortGPT's block influence
    Method("loo", "layers:LayerLeaveOneOut", "layers", True, measures_attention=True),
    Method("refit", "layers:LayerRefit", "layers", True, measures_attention=True),
]
HEAD_METHODS: dict[str, Method] = {m.name: m for m in _HEADS}
LAYER_METHODS: dict[str, Method] = {m.name: m for m in _LAYERS}
DEFAULT_LAYER_METHOD = "refit"  # on the real task it chose the layers recovery wins back (BENCHMARKS.md §10)
# The default scores, per unit, are the measured winners (BENCHMARKS.md §26): with FFN neurons
# fisher beat taylor in every comparison; heads alone split between the two, taylor ahead on average.
DEFAULT_HEAD_METHOD = "taylor"
DEFAULT_FFN_METHOD = "fisher"
# --layer-method's help, for every command that scores layers (score, search).
LAYER_METHOD_HELP = (
    "refit (default: loss change when the layer is dropped and the rest refit briefly, what recovery can win back; "
    "about 12 training steps per layer), loo (the loss change with no refit: one forward per layer; for cuts that "
    "will not be finetuned) or cosine (block influence). refit and loo also measure each layer's attention, so "
    "`select --target-*` can weigh heads against layers."
)
METHOD_DEFAULT_HELP = f"Default: {DEFAULT_FFN_METHOD} with --ffn, else {DEFAULT_HEAD_METHOD} (the measured winners)."


def default_method(ffn: bool) -> str:
    """The importance method a user who names none gets."""
    return DEFAULT_FFN_METHOD if ffn else DEFAULT_HEAD_METHOD


class _MethodOptions(Protocol):
    method: str | None
    ffn: bool


class ChosenMethod:
    """Mixin of the options with --method and --ffn (score, search, iterate)."""

    def chosen_method(self: _MethodOptions) -> str:
        """--method, or the default for the units scored (default_method)."""
        return self.method or default_method(self.ffn)


def head_method(name: str) -> Method:
    if name not in HEAD_METHODS:
        raise UsageError(f"unknown method {name!r}" + did_you_mean(name, HEAD_METHODS))
    return HEAD_METHODS[name]


def layer_method(name: str) -> Method:
    if name not in LAYER_METHODS:
        raise UsageError(f"unknown layer method {name!r}" + did_you_mean(name, LAYER_METHODS))
    return LAYER_METHODS[name]


def check_ffn(method: str) -> None:
    """Refuse `--ffn` for a method that cannot score neurons, saying why."""
    entry = head_method(method)
    if entry.ffn is None or entry.ffn != YES:
        raise UsageError(f"--ffn: method {method!r} scores no FFN neurons: {entry.ffn or 'not supported'}")


def loss_scale_layer_methods() -> tuple[str, ...]:
    return tuple(name for name, m in LAYER_METHODS.items() if m.loss_scale)


def is_loss_scale(head: str | None, layers: str | None = None) -> bool:
    """Whether head scores by `head` (or layer scores by `layers`) are loss changes."""
    if layers is not None:
        return layers in LAYER_METHODS and LAYER_METHODS[layers].loss_scale
    return head in HEAD_METHODS and HEAD_METHODS[head].loss_scale
