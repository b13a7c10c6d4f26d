"""A causal-LM teacher whose blocks are read from its file for each forward and dropped after it.

Distillation needs the teacher's outputs only, never its gradients, so its blocks need not
stay in memory between forwards. A streamed teacher holds its embeddings, final norm and
head (what is outside the blocks); each block's weights are memory-mapped from the
checkpoint (model/tensorfile.read_tensor) when the forward reaches the block and unmapped
when the block returns, so one block at a time is resident. With the student in memory
beside it, LoRA KD of an unpruned student no longer holds the same weights twice, and a
pruned student's teacher costs its embeddings and one block, not a second model
(BENCHMARKS.md, "How much memory").

The outputs are bit-identical to a loaded teacher's: the same tensors, cast to the same
compute dtype on the same device, through the same forward. Between forwards the block
parameters are on the meta device: moving or casting the teacher goes through `place`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
from torch import nn

from headprune_cli.errors import CheckpointError
from headprune_cli.model.arch import adapter_for
from headprune_cli.model.checkpoint import read_layout_only, weights_path
from headprune_cli.model.materialize import all_finite, check_entries, place_tensor
from headprune_cli.model.tensorfile import Entry, read_entries, read_tensor

Group = tuple[list[str], Entry]  # tied state-dict names and the file tensor they hold


@dataclass
class _Stream:
    where: str
    blocks: list[list[Group]]  # per block: the tensors read when it runs
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    dtype: torch.dtype | None = None  # the compute dtype of floating tensors (None: as stored)
    checked: set[int] = field(default_factory=set)  # blocks whose tensors were checked finite


def is_streamed(model: nn.Module | None) -> bool:
    return model is not None and isinstance(getattr(model, "_headprune_stream", None), _Stream)


def load_streamed(path: str | os.PathLike, student: nn.Module | None = None) -> nn.Module:
    """The model stored at `path`, frozen, with its blocks read from the file per forward.
    What stays resident (embeddings, final norm, head) is the `student`'s own tensor where the
    student holds it frozen (LoRA) with the same values: one copy serves both."""
    model = read_layout_only(path)
    where = str(path)
    groups = check_entries(model, read_entries(weights_path(path)), where)
    prefixes = _block_prefixes(model)
    frozen = _frozen_tensors(student)
    per_block: list[list[Group]] = [[] for _ in prefixes]
    for names, entry in groups:
        index = _block_of(names, prefixes)
        if index is None:  # outside the blocks (or tied across them): resident
            place_tensor(model, names, _resident(names, entry, frozen, where))
        else:
            per_block[index].append((names, entry))
    for param in model.parameters():
        param.requires_grad_(False)
    stream = _Stream(where, per_block)
    model._headprune_stream = stream  # type: ignore[assignment]  # nn.Module's attribute types
    for index, block in enumerate(adapter_for(model).layer_list(model)):
        block.register_forward_pre_hook(lambda _m, _a, i=index: _read(model, stream, i))
        block.register_forward_hook(lambda _m, _a, _o, i=index: _drop(model, stream, i))
    model.eval()
    return model


def place(model: nn.Module, device: torch.device, dtype: torch.dtype | None) -> None:
    """Move the resident tensors to `device` (and floating ones to `dtype`); blocks follow when read."""
    stream: _Stream = model._headprune_stream  # type: ignore[assignment]  # set by load_streamed
    stream.device, stream.dtype = device, dtype
    for module in model.modules():
        for table in (module._parameters, module._buffers):
            for name, tensor in table.items():
                if tensor is not None and not tensor.is_meta:
                    _set(table, name, _moved(tensor, stream))


def _block_prefixes(model: nn.Module) -> list[str]:
    blocks = {id(block): i for i, block in enumerate(adapter_for(model).layer_list(model))}
    prefixes = [""] * len(blocks)
    for name, module in model.named_modules():
        if id(module) in blocks:
            prefixes[blocks[id(module)]] = name + "."
    return prefixes


def _block_of(names: list[str], prefixes: list[str]) -> int | None:
    homes = {next((i for i, p in enumerate(prefixes) if n.startswith(p)), None) for n in names}
    return homes.pop() if len(homes) == 1 else None


def _frozen_tensors(student: nn.Module | None) -> dict[str, torch.Tensor]:
    """The student's tensors that training will not change, by state-dict name."""
    if student is None:
        return {}
    return {n: t.detach() for n, t in student.state_dict(keep_vars=True).items() if not t.requires_grad}


def _resident(names: list[str], entry: Entry, frozen: dict[str, torch.Tensor], where: str) -> torch.Tensor:
    tensor = _checked(read_tensor(entry), entry, where)
    same = [frozen[n] for n in names if n in frozen]
    if same and same[0].shape == tensor.shape and same[0].dtype == tensor.dtype and torch.equal(same[0], tensor):
        return same[0]  # the mapping of the file's copy is dropped with `tensor`
    return tensor


def _checked(tensor: torch.Tensor, entry: Entry, where: str) -> torch.Tensor:
    if not all_finite(tensor):
        raise CheckpointError(f"{where}: tensor {entry.name!r} contains NaN or inf")
    return tensor


def _moved(tensor: torch.Tensor, stream: _Stream) -> torch.Tensor:
    dtype = stream.dtype if stream.dtype is not None and tensor.is_floating_point() else tensor.dtype
    return tensor.to(device=stream.device, dtype=dtype)


def _set(table: dict, name: str, tensor: torch.Tensor) -> None:
    old = table[name]
    table[name] = nn.Parameter(tensor, requires_grad=False) if isinstance(old, nn.Parameter) else tensor


def _read(model: nn.Module, stream: _Stream, index: int) -> None:
    first = index not in stream.checked
    for names, entry in stream.blocks[index]:
        tensor = read_tensor(entry)
        if first:  # as `load` checks every tensor: each block once, when it is first read
            _checked(tensor, entry, stream.where)
        place_tensor(model, names, _moved(tensor, stream))
    stream.checked.add(index)


def _drop(model: nn.Module, stream: _Stream, index: int) -> None:
    for names, entry in stream.blocks[index]:
        dtype = stream.dtype if stream.dtype is not None and entry.dtype.is_floating_point else entry.dtype
        place_tensor(model, names, torch.empty(entry.shape, dtype=dtype, device="meta"))
