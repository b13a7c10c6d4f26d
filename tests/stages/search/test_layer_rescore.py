"""`search --rescore-layers`: layers chosen one at a time by measured loss, under the budget and the constraints."""

from __future__ import annotations

import json

import pytest

from headprune_cli.model.cost_table import predict
from headprune_cli.stages.budget import Budget
from headprune_cli.stages.constraints import Constraints
from headprune_cli.stages.search.local import search
from headprune_cli.stages.select.strategies import select
from tests.support import ROOT, check_constraints, mha

DEMO = ROOT / "examples" / "demo"
LAYER_ALONE = {0: 3.0, 1: 0.3, 2: 0.05, 3: 0.01}  # what dropping each layer costs with the others in place


def _paired_loss(calls: list):
    """Layers 2 and 3 cost little alone and a great deal together, as the top blocks of a small encoder do."""

    def loss(remove_heads, remove_layers, remove_ffn):
        calls.append(({k: list(v) for k, v in remove_heads.items()}, list(remove_layers)))
        pair = 5.0 if {2, 3} <= set(remove_layers) else 0.0
        return (
            sum(LAYER_ALONE[layer] for layer in remove_layers)
            + pair
            + 0.001 * sum(len(v) for v in remove_heads.values())
        )

    return loss


def _table():
    table = mha({layer: [0.1, 0.2, 0.3, 0.4] for layer in range(4)}, layer_scores=dict(LAYER_ALONE))
    table.method = table.layer_method = "loo"  # head and layer scores on one loss scale: select chooses layers jointly
    return table


def test_rescoring_avoids_the_pair_that_single_pass_layer_scores_pick():
    # 0.55 of the FLOPs needs two of the four layers dropped (heads alone reach 0.83 at most).
    table = _table()
    single_pass = select(table, budget=Budget("flops", 0.55))
    assert single_pass.remove_layers == [2, 3]
    calls: list = []
    result = search(table, _paired_loss(calls), budget=Budget("flops", 0.55), evaluations=30, rescore_layers=True)
    assert result.rescored_layers == [3, 1]  # the cheapest alone first, then the cheapest given that one
    assert result.start_loss == pytest.approx(0.31) and result.best_loss <= result.start_loss
    assert result.selection.remove_layers == [1, 3]
    assert (
        result.evaluations == len(calls) <= 30 and ({}, []) not in calls
    )  # heads alone cannot fit: the unpruned model is not measured
    fitted = [h for h in result.history if h is not None]  # null until a plan within the budget is measured
    assert fitted == sorted(fitted, reverse=True) and fitted == result.history[len(result.history) - len(fitted) :]
    greedy_calls: list = []
    greedy = search(table, _paired_loss(greedy_calls), budget=Budget("flops", 0.55), evaluations=30)
    # the climb alone does not swap a layer for a layer: only a perturbation at its local optimum gets there
    assert greedy.start_loss > 5.0 and greedy.best_loss >= result.best_loss
    first_optimum = greedy.history.index(min(greedy.history))
    assert greedy.restarts >= 1 and first_optimum > 1


def test_every_rescored_plan_keeps_the_budget_and_the_constraints():
    table = mha(
        {layer: [0.1 * (h + layer) for h in range(6)] for layer in range(4)},
        layer_scores={0: 1.0, 1: 0.1, 2: 0.2, 3: 0.3},
    )
    constraints = Constraints(min_heads=2, multiple_of=2, protect=((1, 0),))
    calls: list = []
    result = search(
        table,
        _paired_loss(calls),
        budget=Budget("flops", 0.45),
        constraints=constraints,
        evaluations=25,
        seed=4,
        rescore_layers=True,
    )
    limit = 0.45 * predict(table.cost, table.kept())["flops_per_token"] * (1 + 1e-12)
    assert result.evaluations == len(calls) <= 25 and len(calls) > 4
    for heads, layers in calls:
        assert 1 not in layers and len(layers) < 4  # the protected head's layer stays, and at least one layer
        for layer, removed in heads.items():
            assert layer not in layers and (6 - len(removed)) >= 2 and (6 - len(removed)) % 2 == 0
            assert not (layer == 1 and 0 in removed)
        if predict(table.cost, table.kept(), heads, layers)["flops_per_token"] > limit:
            assert not heads  # a measurement that does not fit is of the layers alone, to choose the next by
    check_constraints(table, constraints, result.selection)
    assert result.selection.predicted["after"]["flops_per_token"] <= limit
    again = search(
        table,
        _paired_loss([]),
        budget=Budget("flops", 0.45),
        constraints=constraints,
        evaluations=25,
        seed=4,
        rescore_layers=True,
    )
    assert (
        again.selection.remove_heads == result.selection.remove_heads
        and again.selection.remove_layers == result.selection.remove_layers
    )


def test_rescored_search_on_the_demo_classifier_writes_a_plan_that_prunes(cli, tmp_path, monkeypatch):
    from headprune_cli import load
    from headprune_cli.data.readers import read_data
    from headprune_cli.stages.search.masked_loss import MaskedLoss

    monkeypatch.setenv("SOURCE_DATE_EPOCH", "0")
    out = tmp_path / "plan.json"
    result = cli(
        "search",
        DEMO / "model.safetensors",
        "--data",
        DEMO / "calib.jsonl",
        "--target-flops",
        "0.5",
        "--rescore-layers",
        "--evaluations",
        "12",
        "--compensate",
        "none",
        "--judge",
        "loss",
        "-o",
        out,
    )
    assert result.code == 0, result.err
    plan = json.loads(out.read_text())
    record = plan["search"]
    assert plan["config"]["rescore_layers"] is True and record["evaluations"] <= 12
    assert sorted(record["rescored_layers"]) == plan["remove_layers"] or record["improvements"] > 0
    assert plan["predicted"]["after"]["flops_per_token"] <= 0.5 * plan["predicted"]["before"]["flops_per_token"] * (
        1 + 1e-12
    )
    model = load(DEMO / "model.safetensors")
    data = read_data(DEMO / "calib.jsonl", model, max_length=64)
    held = MaskedLoss(model, data.select(len(data) - round(len(data) * 0.5), len(data)), "classification", 32)
    assert held({int(k): v for k, v in plan["remove_heads"].items()}, plan["remove_layers"]) == pytest.approx(
        record["best_loss"], rel=1e-9
    )
    assert cli("prune", "--plan", out, "-o", tmp_path / "small.safetensors").code == 0
