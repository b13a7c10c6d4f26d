"""lstsq recovery from the original's file: no second full model in memory.

Every round of `iterate --recover lstsq` cuts the ORIGINAL model by all rounds' removals
and refits it (rounds.py). Held in memory, that is the original, the last round's refit
and the new one (4.37x the checkpoint at 1.1 B). Here the original stays in its file: the
plain cut is sliced from it tensor by tensor (the streamed `prune`), the refit is computed
on a fresh memory-mapped load of it and sliced while written (`prune --data`'s route),
and each of the two is read back memory-mapped when its turn comes, so one model is held
at a time. The files hold the bytes `cut` + `save` would write, so the models read back
are the in-memory route's, weight for weight.
"""

from __future__ import annotations

import copy
import dataclasses
import gc
from collections.abc import Callable
from pathlib import Path

from torch import nn

from headprune_cli.model.checkpoint import load
from headprune_cli.model.layout import ModelInfo, info_of
from headprune_cli.model.streaming import prune_file
from headprune_cli.stages.prune.cut import Compensation, refit, write_refit_cut
from headprune_cli.stages.select.chains import Selection


def streamed_round(
    source: Path,
    work: Path,
    number: int,
    union: Selection,
    compensation: Compensation,
    metric: Callable[[nn.Module], float],
    like: ModelInfo,
) -> tuple[nn.Module, float, float]:
    """The original at `source` cut by `union` and refit; returns it (read back from
    `work`/round-N.safetensors) with the dev metric of the plain cut and of the refit one."""
    plain = work / "plain.safetensors"
    prune_file(source, plain, union.remove_heads, union.remove_layers, remove_ffn=union.remove_ffn)
    before = metric(read_back(plain, like))
    gc.collect()  # the plain cut's mapping goes before the refit's load
    plain.unlink()
    path = refit_file(work, number)
    write_refit(source, path, union, compensation)
    recovered = read_back(path, like)
    return recovered, before, metric(recovered)


def refit_file(work: Path, number: int) -> Path:
    return work / f"round-{number}.safetensors"


def write_refit(source: Path, out: Path, union: Selection, compensation: Compensation) -> None:
    """The original refit in memory (its own load, read and given back block by block as
    compensation walks it: model/filebacked.py), written cut: the refit projections from
    memory, everything else sliced from the file."""
    model = load(source, per_tensor=True)
    result = refit(model, union, dataclasses.replace(compensation, release=True))
    assert result is not None  # lstsq recovery always has a compensation
    write_refit_cut(model, source, out, union, result)
    del model
    gc.collect()


def read_back(path: Path, like: ModelInfo) -> nn.Module:
    """A round's file, memory-mapped, standing for the original cut in memory: it keeps the
    original's provenance (what `save` records), not the temporary file's. Each tensor is
    mapped on its own, so the next round can give its pages back once it is scored."""
    model = load(path, per_tensor=True)
    info = info_of(model)
    info.loaded_from, info.provenance = like.loaded_from, copy.deepcopy(like.provenance)
    return model
