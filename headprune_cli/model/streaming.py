"""Prune and export without instantiating the model: one tensor in memory at a time.

The model is built on the meta device (shapes, no weights) and cut with the same code
as in-memory pruning, which gives the output's layout, config and tensor shapes. What
each kept tensor holds comes from the adapter's `head_slices` and `ffn_slices` (which
projections keep which head features and which FFN neurons): every output tensor is read
from the source file alone, sliced
if the plan cuts it, checked, written and dropped. The bytes equal those of
load -> apply_plan -> save, at a peak of about the largest tensor, not the model.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch
from torch import nn

from headprune_cli.errors import CheckpointError
from headprune_cli.model.arch import adapter_for
from headprune_cli.model.arch.base import sliced_dims
from headprune_cli.model.checkpoint import checkpoint_metadata, read_layout_only, weights_path, write_checkpoint
from headprune_cli.model.ffn import current_positions, ffn_cuts
from headprune_cli.model.layout import info_of
from headprune_cli.model.materialize import all_finite, check_entries, tied_groups
from headprune_cli.model.surgery import apply_plan, head_cuts
from headprune_cli.model.tensorfile import Entry, Spec, read_entries, read_tensor

Cut = tuple[int, torch.Tensor]  # (dimension, kept indices)


Neurons = Mapping[int, list[int]] | None  # remove_ffn: original layer -> original FFN neurons


def prune_file(
    source: str | os.PathLike,
    output: str | os.PathLike,
    remove_heads: Mapping[int, list[int]],
    remove_layers: list[int],
    plan_sha: str | None = None,
    remove_ffn: Neurons = None,
) -> str:
    """Write `source` cut by the plan to `output`, tensor by tensor (no compensation);
    returns the output's sha256."""
    model = read_layout_only(source, hashed=True)
    return prune_layout(model, source, output, remove_heads, remove_layers, plan_sha, remove_ffn)


def prune_layout(
    model: nn.Module,
    source: str | os.PathLike,
    output: str | os.PathLike,
    remove_heads: Mapping[int, list[int]],
    remove_layers: list[int],
    plan_sha: str | None = None,
    remove_ffn: Neurons = None,
    tensors: Mapping[str, torch.Tensor] | None = None,
) -> str:
    """prune_file given `source`'s layout (read_layout_only(source, hashed=True)), which
    it cuts in place. `tensors` (by the file's names: tensors of `source` changed in
    memory, as compensation's refit projections) are sliced instead of the file's; every
    other tensor is read from the file, one at a time."""
    specs = streamed_specs(model, source, remove_heads, remove_layers, remove_ffn, tensors)
    return write_checkpoint(output, specs, checkpoint_metadata(model, output, plan_sha))


def export_specs(source: str | os.PathLike) -> tuple[nn.Module, list[Spec]]:
    """A meta model of `source` (for config.json and headprune.json) and its tensors to copy."""
    model = read_layout_only(source, hashed=True)
    return model, streamed_specs(model, source, {}, [])


def streamed_specs(
    model: nn.Module,
    source,
    remove_heads: Mapping[int, list[int]],
    remove_layers: list[int],
    remove_ffn: Neurons = None,
    tensors: Mapping[str, torch.Tensor] | None = None,
) -> list[Spec]:
    """Cut the meta `model` in place by the plan; return what each output tensor reads
    (the file's tensor, or the one of `tensors` under its name)."""
    entries = read_entries(weights_path(source))
    state = model.state_dict(keep_vars=True)
    origin = {id(state[name]): entry for names, entry in check_entries(model, entries, source) for name in names}
    cuts = _cuts(model, remove_heads, remove_layers, remove_ffn)
    slots = {(id(module), attr): tensor for module in model.modules() for attr, tensor in _own_tensors(module)}
    apply_plan(model, remove_heads, remove_layers, remove_ffn)  # meta only: shapes, layout, config
    modules = dict(model.named_modules())
    cut_state = model.state_dict(keep_vars=True)  # once: a state dict per tensor cost 1.5 s on SmolLM2
    specs = []
    for names in tied_groups(model):
        prefix, _, attr = names[0].rpartition(".")
        old = slots[(id(modules[prefix]), attr)]
        new = cut_state[names[0]]
        read = _reader(origin[id(old)], cuts.get(id(old), []), source, tensors)
        specs.append(Spec(names[0], new.dtype, tuple(new.shape), read))
    return specs


def _cuts(model: nn.Module, remove_heads, remove_layers, remove_ffn: Neurons) -> dict[int, list[Cut]]:
    """id(parameter) -> the cuts the plan makes to it, from the adapter's head_slices and
    ffn_slices."""
    adapter = adapter_for(model)
    layout = info_of(model).layout
    blocks = adapter.layer_list(model)
    slices = []
    for layer, (keep_q, keep_kv) in head_cuts(model, remove_heads, remove_layers).items():
        pos = layout.position(layer)
        q_now = [layout.heads[pos].index(h) for h in keep_q]
        kv_now = [layout.kv_heads[pos].index(h) for h in keep_kv]
        slices += adapter.head_slices(adapter.attention(blocks[pos]), q_now, kv_now)
    for layer, keep in ffn_cuts(model, remove_ffn, sorted(set(remove_layers))).items():
        view = adapter.ffn(blocks[layout.position(layer)])
        slices += adapter.ffn_slices(view, current_positions(layout, layer, keep))
    cuts: dict[int, list[Cut]] = {}
    for module, side, index in slices:
        for attr, dim in sliced_dims(module, side).items():
            cuts.setdefault(id(getattr(module, attr)), []).append((dim, index))
    return cuts


def _own_tensors(module: nn.Module):
    yield from module._parameters.items()
    yield from module._buffers.items()


def _reader(entry: Entry, cuts: list[Cut], where, tensors: Mapping[str, torch.Tensor] | None = None):
    def produce() -> torch.Tensor:
        given = None if tensors is None else tensors.get(entry.name)
        tensor = read_tensor(entry) if given is None else given.detach()
        if not all_finite(tensor):  # as load() refuses it
            raise CheckpointError(f"{where}: tensor {entry.name!r} contains NaN or inf")
        for dim, index in cuts:
            tensor = tensor.index_select(dim, index)
        return tensor

    return produce
