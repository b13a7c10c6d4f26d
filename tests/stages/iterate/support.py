"""Data for the iterate tests: a tiny labelled task, in memory or written beside a tiny model."""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from headprune_cli.data.readers import Dataset, batches
from headprune_cli.stages.budget import Budget
from headprune_cli.stages.constraints import Constraints
from headprune_cli.stages.prune.cut import Compensation, choose, cut
from headprune_cli.stages.select.chains import Selection
from tests.support import TINY, VOCAB


def dataset(rows: int, seed: int) -> Dataset:
    """`rows` random 8-token rows labelled by their first token's parity."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, VOCAB, (rows, 8), generator=gen)
    return Dataset(ids, torch.ones_like(ids), ids[:, 0] % 2)


def write_task(folder: Path) -> None:
    """m.safetensors (the tiny reference encoder), train.safetensors and dev.safetensors (32 rows each)."""
    from safetensors.torch import save_file

    from headprune_cli import save

    save(TINY["reference"](), folder / "m.safetensors")
    for name, seed in (("train", 0), ("dev", 1)):
        d = dataset(32, seed)
        save_file(
            {"input_ids": d.input_ids, "attention_mask": d.attention_mask, "labels": d.labels},
            str(folder / f"{name}.safetensors"),
        )


def lstsq(data: Dataset) -> Compensation:
    """lstsq recovery calibrated on `data` in batches of 16, ridge 0.1."""
    return Compensation("lstsq", list(batches(data, 16)), 0.1)


def heads_chosen_at_three_tenths(model, data: Dataset, method: str, **scoring) -> dict[int, list[int]]:
    """The heads `select` would remove from the tiny reference encoder's 11 at a schedule step
    of 0.3 (round(3.3) = 3 heads), scored by `method` on `data`: what a round must remove."""
    share = Budget("heads", 3 / 11)
    return choose(model, share, method, Constraints(), data=data, seed=0, ffn=False, **scoring).remove_heads


def cut_copy(model, selection: Selection, compensation: Compensation | None = None):
    """A copy of `model` cut by `selection` (refit by `compensation` when given); `model` stays as it is."""
    out = copy.deepcopy(model)
    cut(out, selection, compensation)
    return out
