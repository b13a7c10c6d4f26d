"""Depth: the refit layer score and the recovery rate after dropping layers."""

from __future__ import annotations

import copy

import pytest
import torch

from headprune_cli.data.readers import read_data
from headprune_cli.errors import DataError
from headprune_cli.model.surgery import HeadGates, apply_plan
from headprune_cli.stages.objectives import embed, per_example_loss
from headprune_cli.stages.score.importance import score_model
from headprune_cli.stages.score.importance.layers import LayerRefit
from headprune_cli.stages.training.train import DEEP_CUT_FACTOR, LR_BY_PARAMS, FinetuneConfig, default_lr, finetune
from tests.support import TINY, give_tokenizer, write_jsonl, write_text


@pytest.fixture
def setup(tmp_path):
    model = give_tokenizer(TINY["reference"]())
    data = read_data(write_jsonl(tmp_path / "d.jsonl", 16, num_labels=2), model)
    return model, data


def _loss(model, part, objective="classification", reference=None) -> torch.Tensor:
    batch = {"input_ids": part.input_ids, "attention_mask": part.attention_mask}
    if part.labels is not None:
        batch["labels"] = part.labels
    model.eval()
    with torch.no_grad():
        out = embed(model, batch)
        return per_example_loss(out, batch, objective, out if reference is None else reference).double(), out


def test_refit_is_the_held_out_loss_after_removal_and_a_short_refit(setup):
    model, data = setup
    scores = score_model(model, data, "random", layers="refit", batch_size=16).layers
    fit, held = data.select(0, 8), data.select(8, 16)
    base, _ = _loss(model, held)
    cut = apply_plan(copy.deepcopy(model), {}, [1])
    torch.manual_seed(0)
    finetune(
        cut,
        fit,
        FinetuneConfig(steps=LayerRefit.REFIT_STEPS, batch_size=LayerRefit.BATCH, seed=0, kd_weight=0.5),
        teacher=model,
    )
    after, _ = _loss(cut, held)
    assert scores[1] == pytest.approx((after - base).mean().item(), abs=1e-9)
    # The refit is real training: the score differs from dropping the layer outright (loo).
    loo = score_model(model, data, "random", layers="loo", batch_size=16).layers
    assert scores[1] != pytest.approx(loo[1], abs=1e-4)
    # And it is deterministic.
    assert score_model(model, data, "random", layers="refit", batch_size=16).layers == scores


def test_attention_is_the_loss_change_of_removing_all_of_a_layers_heads(setup):
    model, data = setup
    result = score_model(model, data, "taylor", layers="loo", batch_size=5)
    base, _ = _loss(model, data)
    for pos in range(3):
        gates = [torch.zeros(k) if i == pos else torch.ones(k) for i, k in enumerate((4, 3, 4))]
        with HeadGates(model, gates):
            removed, _ = _loss(model, data)
        assert result.attention[pos] == pytest.approx((removed - base).mean().item(), abs=2e-6)
    assert score_model(model, data, "taylor", layers="cosine").attention is None  # not on the loss scale


def test_refit_distils_without_labels_for_fidelity(tmp_path):
    model = give_tokenizer(TINY["reference"]())
    data = read_data(write_text(tmp_path / "t.txt", 12), model, need_labels=False)
    scores = score_model(model, data, "taylor", "fidelity", layers="refit", batch_size=6).layers
    assert sorted(scores) == [0, 1, 2] and all(v >= 0 for v in scores.values())  # 1 - cosine never falls below 0
    with pytest.raises(DataError, match="at least 4"):
        score_model(model, data.select(0, 3), "taylor", "fidelity", layers="refit")


def test_recovery_rate_is_higher_once_layers_are_dropped():
    model = TINY["bert"]()
    table_rate = LR_BY_PARAMS[0][1]  # a tiny model: the smallest size class
    assert default_lr(model) == table_rate
    assert default_lr(apply_plan(copy.deepcopy(model), {0: [1]}, [])) == table_rate  # heads only: a light cut
    assert default_lr(apply_plan(model, {}, [1])) == pytest.approx(DEEP_CUT_FACTOR * table_rate)
