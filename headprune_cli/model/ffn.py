"""FFN neurons as a pruning unit: what a plan's `remove_ffn` means for one model.

A neuron of layer L is one feature of the FFN's hidden width: one output row of the up
(and gate) projection and one input column of the down projection. Plans name neurons by
their original index (as in the unpruned model), like heads; `ffn_cuts` checks a whole
`remove_ffn` {layer: [neurons]} against the model's layout before anything is cut, and
answers with the original neurons each cut layer keeps.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from headprune_cli.errors import PlanError
from headprune_cli.model.layout import Layout, info_of


def ffn_cuts(
    model: nn.Module, remove_ffn: Mapping[int, list[int]] | None, remove_layers: list[int]
) -> dict[int, list[int]]:
    """Original layer -> original FFN neurons it keeps, for every layer whose FFN the plan
    cuts. Refuses unknown layers, layers the plan also drops, indices that are not
    integers, listed twice or not in the model, and a plan that empties an FFN."""
    layout = info_of(model).layout
    drop = set(remove_layers)
    cuts: dict[int, list[int]] = {}
    for key, neurons in (remove_ffn or {}).items():
        layer = _index(key, "remove_ffn: layer")
        if layer not in layout.layers:
            raise PlanError(f"remove_ffn: layer {layer} is not in this model (kept: {layout.layers})")
        if not neurons:
            continue
        if layer in drop:
            raise PlanError(
                f"remove_ffn: layer {layer} is also in remove_layers; list its neurons or drop it, not both"
            )
        cuts[layer] = _kept_after(layout, layer, neurons)
    return cuts


def _index(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).isdigit():
        raise PlanError(f"{what} {str(value)[:20]!r} is not a non-negative integer")
    return int(value)


def _kept_after(layout: Layout, layer: int, neurons: list[int]) -> list[int]:
    removed = [_index(n, f"remove_ffn.{layer}: neuron") for n in neurons]
    if len(set(removed)) != len(removed):
        raise PlanError(f"remove_ffn.{layer}: neurons listed twice: {_few(sorted(_repeated(removed)))}")
    kept = layout.kept_neurons(layer)
    present = set(kept)
    unknown = sorted(n for n in removed if n not in present)
    if unknown:
        raise PlanError(
            f"layer {layer}: FFN neurons {_few(unknown)} are not in the model "
            f"(it keeps {len(kept)} of {layout.num_ffn[layer]}, original indices)"
        )
    gone = set(removed)
    left = [n for n in kept if n not in gone]
    if not left:
        raise PlanError(f"layer {layer}: removing every FFN neuron is only allowed when the plan also drops the layer")
    return left


def _repeated(values: list[int]) -> set[int]:
    seen: set[int] = set()
    twice: set[int] = set()
    for v in values:
        (twice if v in seen else seen).add(v)
    return twice


def _few(values: list[int], limit: int = 8) -> str:
    shown = ", ".join(str(v) for v in values[:limit])
    return f"[{shown}{', ...' if len(values) > limit else ''}]" + (
        f" ({len(values)} in all)" if len(values) > limit else ""
    )


def current_positions(layout: Layout, layer: int, keep: list[int]) -> list[int]:
    """Where the kept original neurons sit in the layer's current (possibly cut) FFN."""
    position = {n: i for i, n in enumerate(layout.kept_neurons(layer))}
    return [position[n] for n in keep]


def removal_ffn_gates(model: nn.Module, remove_ffn: Mapping[int, list[int]]) -> list[torch.Tensor]:
    """Gates of 1 for kept neurons and 0 for the neurons a plan removes, per kept layer."""
    layout = info_of(model).layout
    gates = []
    for layer in layout.layers:
        kept = layout.kept_neurons(layer)
        gate = torch.ones(len(kept))
        removed = {int(n) for n in remove_ffn.get(layer, [])}
        if removed:
            gate[torch.tensor([i for i, n in enumerate(kept) if n in removed], dtype=torch.long)] = 0.0
        gates.append(gate)
    return gates
