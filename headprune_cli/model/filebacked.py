"""Weights read from their file as they are used, and given back once used.

`checkpoint.load(path, per_tensor=True)` maps every tensor of the checkpoint on its own
(copy-on-write: tensorfile.read_tensor) and notes where each came from. A page of such a
mapping joins the process's resident set only once it is read, and leaves it only when the
mapping goes. `release(module)` maps the module's tensors afresh, so the pages a pass over
it read leave the resident set; the values stay the file's (read again if used again).

A stage that walks the model block by block then holds about one block of it, not the whole
model: compensation (`prune --data`, iterate's lstsq rounds) releases each block once both
of its streams have passed it. Measured at 1.1 B bf16 (BENCHMARKS.md "How big"): without
this, every page the load's NaN check and the calibration pass read stayed resident (1.0x
of the checkpoint for the rest of the command).

Only a tensor still holding the mapping it was loaded with is released (one replaced since,
by a cast, a cut or a move, is left alone). A tensor written in place keeps its mapping but
not the file's values: the caller names those in `keep` (compensation's refit projections),
and must not release a model whose weights were trained in place.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

from headprune_cli.model.materialize import check_entries
from headprune_cli.model.tensorfile import Entry, read_tensor

_SOURCE = "_headprune_source"  # the attribute a loaded tensor carries: its _Source


@dataclass(frozen=True)
class _Source:
    entry: Entry
    pointer: int  # data_ptr() of the mapping it was given: another pointer means replaced


def track(model: nn.Module, entries: dict[str, Entry], where) -> None:
    """Note each of `model`'s tensors' entry (the model was just filled from `entries`, one
    mapping per tensor), then map them afresh: the load's checks read every page."""
    state = model.state_dict(keep_vars=True)
    for names, entry in check_entries(model, entries, where):
        tensor = state[names[0]]
        setattr(tensor, _SOURCE, _Source(entry, tensor.data_ptr()))
    release(model)


def release(module: nn.Module, keep: Iterable[torch.Tensor] = ()) -> int:
    """Map `module`'s file-backed tensors afresh, except those in `keep` (written in place);
    returns how many. Their pages leave the resident set once nothing else holds them."""
    skip = {id(t) for t in keep}
    done = 0
    for tensor in _tensors(module):
        source = getattr(tensor, _SOURCE, None)
        if source is None or id(tensor) in skip or tensor.data_ptr() != source.pointer:
            continue
        fresh = read_tensor(source.entry)
        with torch.no_grad():
            tensor.data = fresh
        setattr(tensor, _SOURCE, _Source(source.entry, fresh.data_ptr()))
        done += 1
    return done


def _tensors(module: nn.Module) -> list[torch.Tensor]:
    """Every parameter and buffer of `module` once (tied ones are one tensor)."""
    seen: dict[int, torch.Tensor] = {}
    for sub in module.modules():
        for tensor in (*sub._parameters.values(), *sub._buffers.values()):
            if tensor is not None:
                seen.setdefault(id(tensor), tensor)
    return list(seen.values())
