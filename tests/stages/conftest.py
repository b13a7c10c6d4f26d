"""Fixtures the stage tests share."""

from __future__ import annotations

from pathlib import Path

import pytest

from headprune_cli import load, save
from headprune_cli.model.surgery import apply_plan
from tests.support import TINY, tensor_set


@pytest.fixture
def pruned(tmp_path) -> Path:
    """root.safetensors and pruned.safetensors (2 heads removed, provenance to the root), with
    labelled train.safetensors and dev.safetensors beside them."""
    save(TINY["reference"](), tmp_path / "root.safetensors")
    model = load(tmp_path / "root.safetensors")
    apply_plan(model, {0: [1], 2: [0]}, [])
    save(model, tmp_path / "pruned.safetensors")
    tensor_set(tmp_path / "train.safetensors", labels=True)
    tensor_set(tmp_path / "dev.safetensors", labels=True, rows=16, seed=1)
    return tmp_path / "pruned.safetensors"
