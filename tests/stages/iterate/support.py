"""Data for the iterate tests: a tiny labelled task, in memory or written beside a tiny model."""

from __future__ import annotations

from pathlib import Path

import torch

from headprune_cli.data.readers import Dataset
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
