"""Tiny task models that share one base: what `headprune tasks` compares."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from headprune_cli import load, save
from headprune_cli.files.io import sha256_file
from headprune_cli.model.layout import info_of
from tests.support import TINY, tensor_set


def fine_tuned(base: Path, out: Path, seed: int, record_base: bool = True) -> Path:
    """`base` with every weight moved a little (a stand-in for fine-tuning), naming its base."""
    model = load(base)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * p.std().nan_to_num(0.0) * torch.randn(p.shape, generator=gen))
    if record_base:
        info_of(model).provenance.update(base=sha256_file(base), base_path=base.name)
    save(model, out)
    return out


@pytest.fixture
def shared_base(tmp_path) -> Path:
    """base.safetensors (tiny BERT classifier), a.safetensors and b.safetensors fine-tuned
    from it, other.safetensors (a model of another base), data.safetensors (labelled)."""
    save(TINY["bert"](), tmp_path / "base.safetensors")
    fine_tuned(tmp_path / "base.safetensors", tmp_path / "a.safetensors", 1)
    fine_tuned(tmp_path / "base.safetensors", tmp_path / "b.safetensors", 2)
    torch.manual_seed(7)
    other = TINY["bert"]()
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.01)
    save(other, tmp_path / "other.safetensors")
    tensor_set(tmp_path / "data.safetensors", labels=True)
    return tmp_path


def task_args(folder: Path, names=("a", "b"), fidelity: bool = True) -> list[str]:
    args = []
    for name in names:
        args += ["--task", f"name={name},model={folder / f'{name}.safetensors'},data={folder / 'data.safetensors'}"]
    if fidelity:
        model, data = folder / "base.safetensors", folder / "data.safetensors"
        args += ["--task", f"name=fid,model={model},data={data},objective=fidelity"]
    return args
