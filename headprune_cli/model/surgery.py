"""Gate, remove and drop: the generic operations on the adapter view.

All public functions speak in original layer/head/neuron indices (see layout.py). Gating is
the soft, reversible form used for scoring and as the reference that physical removal
must reproduce exactly: a gated model and the same model with those heads removed give
the same outputs.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import torch
from torch import nn

from headprune_cli.errors import ArchitectureError, PlanError
from headprune_cli.model.arch import adapter_for
from headprune_cli.model.arch.base import hidden_states_in
from headprune_cli.model.ffn import current_positions, ffn_cuts
from headprune_cli.model.layout import info_of


# --- gating -----------------------------------------------------------------------
class _BlockHooks:
    """A context that hooks every block of the model (its `_attach` says where) and removes the hooks on exit."""

    def __init__(self, model: nn.Module, gates):
        self.model, self.gates = model, gates
        self._handles: list[torch.utils.hooks.RemovableHandle] = []

    def __enter__(self):
        adapter = adapter_for(self.model)
        for pos, block in enumerate(adapter.layer_list(self.model)):
            self._handles.append(self._attach(adapter, pos, block))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _attach(self, adapter, pos: int, block: nn.Module) -> torch.utils.hooks.RemovableHandle:
        raise NotImplementedError


class HeadGates(_BlockHooks):
    """Multiplies each head's slice of the output-projection input by a gate.

    `gates[pos]` belongs to the kept layer at block position `pos` and has shape
    [heads], [batch, heads] (per-example gates give per-example gradients in one
    backward pass) or [batch, seq, heads] (per token).
    """

    def __init__(self, model: nn.Module, gates: list[torch.Tensor]):
        super().__init__(model, gates)

    def _attach(self, adapter, pos: int, block: nn.Module) -> torch.utils.hooks.RemovableHandle:
        view = adapter.attention(block)
        return view.o.register_forward_pre_hook(self._hook(pos, view.head_dim))

    def _hook(self, pos: int, head_dim: int):
        def hook(module, args):
            (x, *rest) = args
            heads = x.view(*x.shape[:-1], -1, head_dim)
            gate = self.gates[pos].to(heads.device)  # a no-op on one device; layers may be spread
            # [heads] -> broadcast over everything; [batch, heads] -> over positions;
            # [batch, seq, heads] -> one gate per token (per-token Taylor terms in one backward).
            if gate.dim() == 3:
                gate = gate[..., None]
            else:
                gate = (
                    gate.view(gate.shape[0], *([1] * (heads.dim() - 3)), gate.shape[-1], 1)
                    if gate.dim() == 2
                    else gate[:, None]
                )
            gated = heads * gate
            return (gated.view(x.shape), *rest)

        return hook


class NeuronGates(_BlockHooks):
    """Multiplies each FFN neuron (each input feature of the down projection) by a gate.

    `gates[pos]` belongs to the kept layer at block position `pos` and has shape [width],
    [batch, width] (per example) or [batch, seq, width] (per token); the gradients of a
    loss with respect to them score every neuron in one backward pass, as HeadGates do
    for heads.
    """

    def __init__(self, model: nn.Module, gates: list[torch.Tensor]):
        super().__init__(model, gates)

    def _attach(self, adapter, pos: int, block: nn.Module) -> torch.utils.hooks.RemovableHandle:
        return adapter.ffn(block).down.register_forward_pre_hook(self._hook(pos))

    def _hook(self, pos: int):
        def hook(module, args):
            (x, *rest) = args
            gate = self.gates[pos].to(x.device)
            if gate.dim() == 2:  # [batch, width] -> over every position of the example
                gate = gate.view(gate.shape[0], *([1] * (x.dim() - 2)), gate.shape[-1])
            return (x * gate, *rest)

        return hook


class LayerGates(_BlockHooks):
    """Scales each block's change to the hidden states by a gate: out = in + z * (block(in) - in).

    `gates` has one entry per kept layer in block order, shape [layers] or [batch, layers]
    (per example). A gate of 0 makes the block an identity, exactly as dropping the layer
    (skip_layers) does; 1 leaves it as it is.
    """

    def __init__(self, model: nn.Module, gates: torch.Tensor):
        super().__init__(model, gates)

    def _attach(self, adapter, pos: int, block: nn.Module) -> torch.utils.hooks.RemovableHandle:
        return block.register_forward_hook(self._hook(pos), with_kwargs=True)

    def _hook(self, pos: int):
        def hook(module, args, kwargs, output):
            hidden = hidden_states_in(args, kwargs)
            out = output[0] if isinstance(output, tuple) else output
            gate = self.gates[..., pos].to(out.device, out.dtype)
            gate = gate.view(-1, *([1] * (out.dim() - 1))) if gate.dim() == 1 else gate
            # lerp is exact at both ends (its kernel switches formula at 0.5): a gate of 0 gives the
            # input bit for bit, as a dropped layer does, and 1 the block's own output.
            mixed = torch.lerp(hidden.to(out.dtype), out, gate)
            return (mixed, *output[1:]) if isinstance(output, tuple) else mixed

        return hook


def removal_gates(model: nn.Module, remove_heads: Mapping[int, list[int]]) -> list[torch.Tensor]:
    """Gates of 1 for kept heads and 0 for the heads a plan removes."""
    layout = info_of(model).layout
    gates = []
    for layer, kept in zip(layout.layers, layout.heads):
        removed = set(remove_heads.get(layer, []))
        gates.append(torch.tensor([0.0 if h in removed else 1.0 for h in kept]))
    return gates


@contextmanager
def skip_layers(model: nn.Module, layers: list[int]) -> Iterator[None]:
    """Make the given original layers identities (their output = their input)."""
    adapter = adapter_for(model)
    layout = info_of(model).layout
    blocks = adapter.layer_list(model)
    handles = [blocks[layout.position(i)].register_forward_hook(_identity_hook, with_kwargs=True) for i in layers]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _identity_hook(module, args, kwargs, output):
    hidden = hidden_states_in(args, kwargs)
    if isinstance(output, tuple):
        return (hidden, *output[1:])
    return hidden


# --- physical removal -------------------------------------------------------------
def apply_plan(
    model: nn.Module,
    remove_heads: Mapping[int, list[int]],
    remove_layers: list[int],
    remove_ffn: Mapping[int, list[int]] | None = None,
) -> nn.Module:
    """Remove heads, FFN neurons and layers in place (`remove_ffn`: original layer ->
    original neurons); validates everything before cutting anything."""
    drop = sorted(set(remove_layers))
    heads = head_cuts(model, remove_heads, drop)
    neurons = ffn_cuts(model, remove_ffn, drop)
    for layer, (keep_q, keep_kv) in heads.items():
        _slice_layer(model, layer, keep_q, keep_kv)
    for layer, keep in neurons.items():
        _slice_ffn(model, layer, keep)
    if drop:
        _drop_layers(model, drop)
    return model


def head_cuts(
    model: nn.Module, remove_heads: Mapping[int, list[int]], remove_layers: list[int]
) -> dict[int, tuple[list[int], list[int]]]:
    """The whole plan validated: per layer whose heads it cuts, the original query and
    key/value heads kept."""
    layout = info_of(model).layout
    drop = sorted(set(remove_layers))
    for layer in drop:
        layout.position(layer)
    if len(drop) == len(layout.layers):
        raise PlanError("the plan removes every layer; at least one must remain")
    heads = {int(k): sorted(set(v)) for k, v in remove_heads.items() if int(k) not in drop}
    return {layer: _validated_keep(model, layer, removed) for layer, removed in heads.items() if removed}


def _validated_keep(model: nn.Module, layer: int, removed: list[int]) -> tuple[list[int], list[int]]:
    """The (original) query and KV heads a layer keeps, checked against the rules."""
    layout = info_of(model).layout
    pos = layout.position(layer)
    kept = layout.heads[pos]
    unknown = [h for h in removed if h not in kept]
    if unknown:
        raise PlanError(f"layer {layer}: heads {unknown} are not in the model (kept: {kept})")
    keep_q = [h for h in kept if h not in removed]
    if not keep_q:
        raise PlanError(f"layer {layer}: removing every head is only allowed when the plan also drops the layer")
    group = layout.num_heads[layer] // layout.num_kv_heads[layer]
    if group == 1:
        return keep_q, keep_q
    groups: dict[int, int] = {}
    for h in keep_q:
        groups[h // group] = groups.get(h // group, 0) + 1
    if len(set(groups.values())) != 1:
        sizes = ", ".join(f"kv head {g}: {n}" for g, n in sorted(groups.items()))
        raise ArchitectureError(
            f"layer {layer}: grouped-query attention needs every remaining KV group to keep the same "
            f"number of query heads (would keep {sizes}); remove whole groups instead"
        )
    return keep_q, sorted(groups)


def _slice_layer(model: nn.Module, layer: int, keep_q: list[int], keep_kv: list[int]) -> None:
    info = info_of(model)
    adapter = adapter_for(model)
    pos = info.layout.position(layer)
    current_q, current_kv = info.layout.heads[pos], info.layout.kv_heads[pos]
    view = adapter.attention(adapter.layer_list(model)[pos])
    adapter.slice_heads(view, [current_q.index(h) for h in keep_q], [current_kv.index(h) for h in keep_kv])
    info.layout.heads[pos], info.layout.kv_heads[pos] = keep_q, keep_kv


def _slice_ffn(model: nn.Module, layer: int, keep: list[int]) -> None:
    layout = info_of(model).layout
    adapter = adapter_for(model)
    pos = layout.position(layer)
    adapter.slice_ffn(adapter.ffn(adapter.layer_list(model)[pos]), current_positions(layout, layer, keep))
    layout.ffn[layer] = keep


def _drop_layers(model: nn.Module, drop: list[int]) -> None:
    info = info_of(model)
    adapter = adapter_for(model)
    layout = info.layout
    keep_pos = [p for p, layer in enumerate(layout.layers) if layer not in drop]
    blocks = adapter.layer_list(model)
    adapter.set_layer_list(model, nn.ModuleList(blocks[p] for p in keep_pos))
    adapter.renumber_layers(model, keep_pos)
    layout.layers = [layout.layers[p] for p in keep_pos]
    layout.heads = [layout.heads[p] for p in keep_pos]
    layout.kv_heads = [layout.kv_heads[p] for p in keep_pos]
    layout.ffn = {layer: kept for layer, kept in layout.ffn.items() if layer not in drop}
