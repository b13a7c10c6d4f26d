"""Tiny training inputs: a tokenized tensor set and a saved root model (learned gates, head dropout)."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

from headprune_cli import save

from .models import TINY, VOCAB


def tensor_set(path: Path, labels: bool, rows: int = 32, seed: int = 0) -> Path:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, VOCAB, (rows, 8), generator=gen)
    tensors = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if labels:
        tensors["labels"] = ids[:, 0] % 2
    save_file(tensors, str(path))
    return path


def saved_root(tmp_path: Path, family: str) -> tuple[Path, Path]:
    save(TINY[family](), tmp_path / "root.safetensors")
    return tmp_path / "root.safetensors", tensor_set(tmp_path / "train.safetensors", labels=family == "reference")
