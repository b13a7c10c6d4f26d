"""Scores artifacts built by hand from tiny models, for select/prune tests."""

from __future__ import annotations

import random
from pathlib import Path

import torch

from headprune_cli import save
from headprune_cli.artifacts.schema import dumps, envelope, input_ref
from headprune_cli.model.cost import cost_table
from headprune_cli.model.layout import info_of

from .models import TINY


def scores_for(model, model_path: Path, scores: dict | None = None, seed: int = 0, layer_scores: bool = True) -> dict:
    """A valid scores artifact for `model` (saved at `model_path`); random scores by default."""
    layout = info_of(model).layout
    rng = random.Random(seed)
    heads = scores or {
        layer: {h: round(rng.random(), 6) for h in kept} for layer, kept in zip(layout.layers, layout.heads)
    }
    artifact = envelope("scores", [input_ref("model", model_path)], {"method": "hand"})
    artifact.update(
        method="hand",
        objective="fidelity",
        shape=[layout.num_layers, max(layout.num_heads)],
        num_heads=layout.num_heads,
        num_kv_heads=layout.num_kv_heads,
        kept={str(l): h for l, h in zip(layout.layers, layout.heads)},
        heads={str(l): {str(h): s for h, s in v.items()} for l, v in heads.items()},
        layers={str(l): round(rng.random(), 6) for l in layout.layers} if layer_scores else None,
        samples=8,
        cost=cost_table(model, 16).to_dict(),
    )
    if not layer_scores:
        del artifact["layers"]
    return artifact


def saved_model(tmp_path: Path, family: str = "bert", name: str = "m.safetensors"):
    model = TINY[family]()
    path = tmp_path / name
    save(model, path)
    return model, path


def write_scores(tmp_path: Path, model, model_path: Path, name: str = "scores.json", **kw) -> Path:
    path = tmp_path / name
    path.write_text(dumps(scores_for(model, model_path, **kw)))
    return path


def tensor_data(tmp_path: Path, n: int = 24, seq: int = 10, vocab: int = 60, seed: int = 3) -> Path:
    """A tokenized data set (.safetensors), so tiny tokenizer-less models can be calibrated."""
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, vocab, (n, seq), generator=gen)
    mask = torch.ones_like(ids)
    mask[::3, -3:] = 0
    path = tmp_path / "calib.safetensors"
    save_file({"input_ids": ids, "attention_mask": mask}, str(path))
    return path
