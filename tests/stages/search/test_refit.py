"""search's Refit: the statistics it collects once, the projections a plan touches, its refusals
and its cache of solved projections."""

from __future__ import annotations

import pytest
import torch

from headprune_cli.errors import NumericalError, UsageError
from headprune_cli.stages.prune.compensation import DEFAULT_RIDGE
from headprune_cli.stages.search import refit as refit_module
from headprune_cli.stages.search.refit import Refit
from tests.support.models import TINY, calibration, with_biases


def _projections(model) -> dict[str, torch.Tensor]:
    return {
        name: p.detach().clone()
        for name, p in model.named_parameters()
        if "attention.output.dense" in name or "output.dense" in name
    }


def test_batches_without_a_mask_are_all_real_tokens():
    model = with_biases(TINY["bert"]())
    masked = calibration(2, seed=1)
    for batch in masked:
        batch["attention_mask"] = torch.ones_like(batch["input_ids"])
    plain = [{"input_ids": b["input_ids"]} for b in masked]
    with_mask, without = (Refit(model, rows, "lstsq", DEFAULT_RIDGE, ffn=True) for rows in (masked, plain))
    assert with_mask.projections.keys() == without.projections.keys()
    for key, projection in with_mask.projections.items():
        other = without.projections[key]
        torch.testing.assert_close(projection.gram, other.gram, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(projection.cross, other.cross, rtol=1e-12, atol=1e-12)
        assert projection.tokens == other.tokens == 2 * 16 * 12


def test_a_plan_rewrites_only_the_projections_it_cuts_and_puts_them_back():
    model = with_biases(TINY["bert"]())
    before = _projections(model)
    refit = Refit(model, calibration(2, seed=1), "lstsq", DEFAULT_RIDGE, ffn=True)
    # layer 0 loses heads, layer 2 is dropped (its heads too: nothing to refit there), layer 1 loses neurons
    with refit.applied({0: [1], 2: [0, 3]}, [2], {1: [0, 1, 2, 3]}):
        during = _projections(model)
    changed = sorted(name for name in before if not torch.equal(before[name], during[name]))
    assert changed == [
        "bert.encoder.layer.0.attention.output.dense.bias",
        "bert.encoder.layer.0.attention.output.dense.weight",
        "bert.encoder.layer.1.output.dense.bias",
        "bert.encoder.layer.1.output.dense.weight",
    ]
    after = _projections(model)
    assert all(torch.equal(before[name], after[name]) for name in before)


def test_refit_refuses_a_method_it_cannot_judge_and_an_empty_calibration():
    model = TINY["bert"]()
    with pytest.raises(UsageError) as refused:
        Refit(model, calibration(1, seed=1), "diag", DEFAULT_RIDGE, ffn=False)
    assert str(refused.value) == "search judges after bias or lstsq compensation, not 'diag'"
    with pytest.raises(UsageError) as refused:
        Refit(model, [], "bias", DEFAULT_RIDGE, ffn=False)
    assert str(refused.value) == "--compensate bias needs calibration rows to collect statistics from"


def test_solved_projections_are_cached_least_recently_used_first_at_the_models_precision(monkeypatch):
    monkeypatch.setattr(refit_module, "CACHE_SIZE", 2)
    refit = Refit(TINY["bert"](), calibration(2, seed=1), "lstsq", DEFAULT_RIDGE, ffn=False)
    plans = [{0: [0]}, {0: [1]}, {0: [2]}]
    for plan in plans[:2]:
        with refit.applied(plan, [], {}):
            pass
    with refit.applied(plans[0], [], {}):  # used again: now the most recent
        pass
    with refit.applied(plans[2], [], {}):  # a third: the least recent, head 1's cut, goes
        pass
    kept = [cols for (_, cols) in refit._solved]
    assert kept == [tuple(range(8, 32)), (*range(16), *range(24, 32))]  # head 0's cut, then head 2's
    assert all(weight.dtype == bias.dtype == torch.float32 for weight, bias in refit._solved.values())


@pytest.mark.parametrize("poison", [float("inf"), float("nan")])
def test_a_projection_whose_outputs_are_not_finite_is_refused(poison):
    # The last collected projection (layer 2's attention output: nothing downstream is collected
    # with ffn=False) gets one non-finite weight. Its inputs stay finite, so with inf its Gram
    # matrix stays finite and only the cross term is not: either alone must refuse.
    model = with_biases(TINY["bert"]())
    with torch.no_grad():
        model.bert.encoder.layer[2].attention.output.dense.weight[0, 0] = poison
    with pytest.raises(NumericalError) as refused:
        Refit(model, calibration(2, seed=1), "lstsq", DEFAULT_RIDGE, ffn=False)
    assert str(refused.value) == "calibration activations contain NaN or inf"
