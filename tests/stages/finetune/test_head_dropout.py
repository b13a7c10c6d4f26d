"""`finetune --head-dropout P`: heads dropped per example while training, unscaled; P = 0 is plain finetune."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from headprune_cli import load
from headprune_cli.stages.training.gating import HeadDropout
from headprune_cli.stages.training.train import FinetuneConfig, finetune
from tests.support import saved_root as root


def test_masks_drop_heads_per_example_at_rate_p_without_rescaling(tmp_path):
    ckpt, _ = root(tmp_path, "reference")
    dropout = HeadDropout(load(ckpt), 0.3, seed=0)
    sampled = dropout.sample(step=0, micro=0, rows=4000, total=1)
    assert list(sampled) == ["head.0", "head.1", "head.2"]  # by hook name: HeadGates, per block
    masks = list(sampled.values())
    assert [m.shape for m in masks] == [(4000, 4), (4000, 3), (4000, 4)]
    values = torch.cat(masks, dim=1)
    assert set(values.unique().tolist()) == {0.0, 1.0}  # kept heads keep their full scale
    assert abs((values == 0).float().mean().item() - 0.3) < 0.02
    assert not torch.equal(values[0], values[1]) or not torch.equal(values[1], values[2])  # per example
    assert torch.equal(
        torch.cat(list(dropout.sample(0, 0, 4000, 1).values()), dim=1), values
    )  # a pure function of (seed, step, micro)
    assert not torch.equal(torch.cat(list(dropout.sample(1, 0, 4000, 1).values()), dim=1), values)


@pytest.mark.parametrize("family", ["reference", "llama-gqa"])
def test_head_dropout_changes_training_and_zero_changes_nothing(tmp_path, family):
    ckpt, data = root(tmp_path, family)
    rows = load_file(str(data))
    cfg = FinetuneConfig(steps=4, lr=1e-3, batch_size=8)

    def trained(gating_p):
        model = load(ckpt)
        gating = None if gating_p is None else HeadDropout(model, gating_p, seed=0)
        result = finetune(model, rows, cfg, gating=gating)
        return result.first_loss, {k: v.clone() for k, v in result.model.state_dict().items()}

    plain_loss, plain = trained(None)
    zero_loss, zero = trained(0.0)
    drop_loss, drop = trained(0.5)
    assert zero_loss == plain_loss and all(torch.equal(plain[k], zero[k]) for k in plain)
    assert drop_loss != plain_loss
    assert any(not torch.equal(plain[k], drop[k]) for k in plain)


def test_cli_head_dropout_zero_writes_the_same_bytes_as_plain_finetune(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "0")
    ckpt, data = root(tmp_path, "reference")
    outs = {}
    for name, extra in {"plain": [], "zero": ["--head-dropout", "0"], "drop": ["--head-dropout", "0.3"]}.items():
        outs[name] = tmp_path / f"{name}.safetensors"
        res = cli(
            "finetune",
            ckpt,
            "--data",
            data,
            "--steps",
            "4",
            "--lr",
            "1e-3",
            "--batch-size",
            "8",
            "-o",
            outs[name],
            *extra,
        )
        assert res.code == 0, res.err
    assert outs["zero"].read_bytes() == outs["plain"].read_bytes()
    assert outs["drop"].read_bytes() != outs["plain"].read_bytes()
    assert load(outs["drop"]).headprune.layout.heads == load(ckpt).headprune.layout.heads  # nothing is cut
