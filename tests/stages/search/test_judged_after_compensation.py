"""`search --compensate`: candidates judged after the compensation prune will apply, restarts
at local optima, the budget in candidates or seconds, and the record the plan keeps."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from headprune_cli.data.readers import Dataset
from headprune_cli.stages.budget import Budget
from headprune_cli.stages.prune.compensation import DEFAULT_RIDGE, METHODS, compensate
from headprune_cli.stages.search import stage as search_stage
from headprune_cli.stages.search.judged import HeldOutJudge
from headprune_cli.stages.search.local import search
from headprune_cli.stages.search.masked_loss import MaskedLoss
from headprune_cli.stages.search.refit import Refit
from tests.support import ROOT, mha
from tests.support.models import TINY, calibration, with_biases

DEMO = ROOT / "examples" / "demo"


def _rows(batches: list[dict]) -> Dataset:
    return Dataset(torch.cat([b["input_ids"] for b in batches]), torch.cat([b["attention_mask"] for b in batches]))


MODELS = {"bert": lambda: with_biases(TINY["bert"]()), "llama": TINY["llama"]}  # llama: no biases at all


@pytest.mark.parametrize("family", list(MODELS))
@pytest.mark.parametrize("method", ["lstsq", "bias"])
@pytest.mark.parametrize(
    ("remove_heads", "remove_ffn"),
    [({1: [0, 2]}, {}), ({}, {2: list(range(0, 48, 2))})],
    ids=["heads-of-one-layer", "ffn-of-one-layer"],
)
def test_the_judged_model_is_the_one_prune_compensates_when_one_layer_is_cut(family, method, remove_heads, remove_ffn):
    # With one layer cut, nothing upstream changes, so the unpruned model's statistics are
    # exactly those prune collects from its pruned stream: the judged model is the shipped one.
    fit, held = calibration(3, seed=1), _rows(calibration(2, seed=2))
    model = MODELS[family]()
    judged = MaskedLoss(model, held, "fidelity", 16).measure(
        remove_heads,
        [],
        remove_ffn,
        Refit(model, fit, method, DEFAULT_RIDGE, ffn=True).applied(remove_heads, [], remove_ffn),
    )[0]
    shipped = copy.deepcopy(model)
    reference = MaskedLoss(shipped, held, "fidelity", 16)  # references from the unpruned copy
    compensate(shipped, remove_heads, [], fit, method, DEFAULT_RIDGE, remove_ffn=remove_ffn)
    masked = MaskedLoss(model, held, "fidelity", 16)(remove_heads, [], remove_ffn)
    assert judged == pytest.approx(reference(remove_heads, [], remove_ffn), rel=1e-5, abs=1e-9)
    if family == "llama" and method == "bias":  # no bias to refit: prune leaves it alone, and so does the judge
        assert judged == masked
    else:
        assert judged < masked  # compensation won something back, and the judgement saw it
    assert MaskedLoss(model, held, "fidelity", 16)({}, []) == pytest.approx(0.0, abs=1e-6)  # weights put back


def _duplicated_head_model():
    """Layer 0's head 1 computes exactly what its head 0 does, with 4x the output weight: masking
    it costs the most of any head, and lstsq folds it into head 0 at no cost."""
    model = TINY["bert"]()
    attention = model.bert.encoder.layer[0].attention
    with torch.no_grad():
        for projection in (attention.self.query, attention.self.key, attention.self.value):
            projection.weight[8:16] = projection.weight[0:8]
            projection.bias[8:16] = projection.bias[0:8]
        attention.output.dense.weight[:, 8:16] *= 4.0
    return model


def test_judging_after_compensation_picks_the_plan_whose_compensated_score_is_best():
    model = _duplicated_head_model()
    fit, held = calibration(4, seed=3), _rows(calibration(2, seed=4))
    # greedy removes layer 2's head 3; one step away: layer 0's head 1 or layer 1's head 0
    table = mha({0: [1.0, 0.5, 1.1, 1.2], 1: [0.4, 1.3, 1.4, 1.5], 2: [1.6, 1.7, 1.8, 0.1]})
    masked = HeldOutJudge(MaskedLoss(model, held, "fidelity", 16), "loss")
    refit = Refit(model, fit, "lstsq", 1e-6, ffn=False)
    compensated = HeldOutJudge(MaskedLoss(model, held, "fidelity", 16), "loss", refit)
    budget = Budget("heads", 1 / 12)
    by_mask = search(table, masked, budget=budget, evaluations=10)
    by_refit = search(table, compensated, budget=budget, evaluations=10)
    duplicate = {0: [1]}
    assert by_refit.selection.remove_heads == duplicate and by_mask.selection.remove_heads != duplicate
    other = by_mask.selection.remove_heads
    # the two judges rank the same two plans in opposite orders
    assert masked(duplicate, []).loss > masked(other, []).loss
    assert compensated(duplicate, []).loss < compensated(other, []).loss
    assert compensated(duplicate, []).loss < 1e-4  # lstsq folded the copy into head 0


def _counts_loss(plan_loss: dict):
    """A loss of how many heads each of three layers loses (2.0 for counts not listed)."""

    def loss(remove_heads, remove_layers, remove_ffn):
        return plan_loss.get(tuple(len(remove_heads.get(layer, [])) for layer in range(3)), 2.0)

    return loss


def test_a_restart_leaves_a_local_optimum_that_the_climb_alone_cannot():
    # greedy takes three heads of layer 0; every single move from there is worse (2.0), and the
    # best plan (one head of each layer) is two moves away
    table = mha({0: [0.01, 0.02, 0.03, 0.04], 1: [1.0, 1.1, 1.2, 1.3], 2: [2.0, 2.1, 2.2, 2.3]})
    loss = _counts_loss({(3, 0, 0): 1.0, (1, 1, 1): 0.5})
    result = search(table, loss, budget=Budget("heads", 0.25), evaluations=60, seed=0)
    assert result.start_loss == 1.0 and result.best_loss == 0.5 and result.restarts >= 1
    assert {k: len(v) for k, v in result.selection.remove_heads.items()} == {0: 1, 1: 1, 2: 1}
    assert result.history[:3] == [1.0] * 3  # the start's two neighbours were both worse
    assert result.history == sorted(result.history, reverse=True) and len(result.history) == result.evaluations


def test_restarts_spend_the_whole_budget_or_say_the_space_ran_out():
    table = mha({layer: [0.1 * h for h in range(6)] for layer in range(4)})
    flat = search(table, lambda *plan: 1.0, budget=Budget("heads", 0.5), evaluations=40, seed=2)
    assert flat.evaluations == 40 and flat.restarts >= 1 and flat.stopped == "evaluations"
    tiny = mha({0: [0.1, 0.2], 1: [0.3, 0.4]})
    small = search(tiny, lambda *plan: 1.0, budget=Budget("heads", 0.25), evaluations=40)
    assert small.stopped == "exhausted" and small.evaluations == 2  # one head of either layer: two plans in all


def test_a_seconds_budget_stops_the_search_on_time():
    table = mha({layer: [0.1 * h for h in range(6)] for layer in range(4)})
    now = [0.0]

    def clock() -> float:
        return now[0]

    def loss(*plan) -> float:
        now[0] += 1.0  # every judgement takes one second
        return 1.0

    result = search(table, loss, budget=Budget("heads", 0.5), evaluations=1000, seconds=7.5, clock=clock)
    assert result.stopped == "seconds" and result.evaluations == 8


def test_the_search_defaults_are_prunes():
    assert search_stage.DEFAULT_RIDGE == DEFAULT_RIDGE and search_stage.COMPENSATIONS == METHODS
    assert search_stage.SearchOptions.model_fields["compensation"].default == "lstsq"


def test_the_plan_records_the_search_and_is_byte_identical_for_a_seed(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "0")
    out = tmp_path / "plan.json"
    args = ["search", DEMO / "model.safetensors", "--data", DEMO / "calib.jsonl", "--ratio", "0.5"]
    result = cli(*args, "--evaluations", "12", "-o", out)
    assert result.code == 0, result.err
    assert "judged after --compensate lstsq" in result.err and "restarts" in result.err
    plan = json.loads(out.read_text())
    record = plan["search"]
    assert record["compensation"] == "lstsq" and record["judge"] == "accuracy"
    assert plan["config"]["compensation"] == "lstsq" and plan["config"]["judge"] == "metric"
    assert len(record["path"]) == record["evaluations"] == 12 and record["stopped"] == "evaluations"
    assert record["path"] == sorted(record["path"]) and record["path"][-1] == record["best_accuracy"]
    assert record["best_accuracy"] >= record["start_accuracy"] and record["restarts"] >= 0
    again = tmp_path / "again.json"
    assert cli(*args, "--evaluations", "12", "-o", again).code == 0
    assert again.read_bytes() == out.read_bytes()
    assert (
        cli(
            "prune",
            "--plan",
            out,
            "--compensate",
            "lstsq",
            "--data",
            DEMO / "calib.jsonl",
            "-o",
            tmp_path / "s.safetensors",
        ).code
        == 0
    )
