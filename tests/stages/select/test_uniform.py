"""`select --uniform`: the same number of heads and KV groups in every kept layer, with
every strategy and constraint, chosen by the scores."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import headprune_cli
from headprune_cli.errors import UsageError
from headprune_cli.model.cost_table import predict
from headprune_cli.model.layout import info_of
from headprune_cli.stages.budget import Budget
from headprune_cli.stages.constraints import Constraints
from headprune_cli.stages.score.table import ScoreTable
from headprune_cli.stages.select.strategies import select
from tests.support import (
    check_constraints,
    mha,
    requests,
    saved_model,
    synthetic_cost,
    tables,
    with_budget,
    write_scores,
)


def kept_shape(table: ScoreTable, sel) -> set[tuple[int, int]]:
    """{(query heads, KV groups)} over the layers the selection keeps."""
    shapes = set()
    for layer, heads in table.heads.items():
        if layer in sel.remove_layers:
            continue
        left = [h for h in heads if h not in sel.remove_heads.get(layer, [])]
        group = table.num_heads[layer] // table.num_kv_heads[layer]
        shapes.add((len(left), len({h // group for h in left})))
    return shapes


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_strategy_with_uniform_keeps_one_shape_and_every_constraint(data):
    table = data.draw(tables())
    kind, amount, constraints = data.draw(requests(table))
    constraints = Constraints(**{**constraints.__dict__, "uniform": True})
    try:
        sel = select(table, kind, constraints=constraints, **with_budget(amount))
    except UsageError as exc:
        assert any(
            w in str(exc)
            for w in ("--uniform", "--min-heads", "--multiple-of", "budget", "--drop-layers", "every layer")
        )
        return
    check_constraints(table, constraints, sel)
    assert len(kept_shape(table, sel)) == 1
    if kind == "budget":
        after = predict(table.cost, table.kept(), sel.remove_heads, sel.remove_layers)["flops_per_token"]
        assert after <= amount["target_flops"] * predict(table.cost, table.kept())["flops_per_token"] * (1 + 1e-9)


def test_uniform_takes_each_layers_least_important_heads():
    table = mha({0: [0.9, 0.1, 0.5, 0.3], 1: [0.2, 0.8, 0.05, 0.7]})
    sel = select(table, budget=Budget("heads", 0.5), constraints=Constraints(uniform=True))
    assert sel.remove_heads == {0: [1, 3], 1: [0, 2]}
    # Without --uniform, global would take 3 heads from one layer when its scores say so.
    skewed = mha({0: [0.01, 0.02, 0.03, 0.9], 1: [0.5, 0.6, 0.7, 0.8]})
    assert select(skewed, budget=Budget("heads", 0.5)).remove_heads == {0: [0, 1, 2], 1: [0]}
    assert select(skewed, budget=Budget("heads", 0.5), constraints=Constraints(uniform=True)).remove_heads == {
        0: [0, 1],
        1: [0, 1],
    }


def test_uniform_ratio_rounds_to_the_nearest_level_and_ties_keep_more():
    table = mha({0: [0.1, 0.2, 0.3, 0.4], 1: [0.5, 0.6, 0.7, 0.8], 2: [0.1, 0.9, 0.3, 0.2]})
    # 12 heads; levels remove 0, 3, 6, 9. ratio 0.3 -> 4 -> 3 heads (one per layer).
    assert (
        sum(
            map(
                len,
                select(table, budget=Budget("heads", 0.3), constraints=Constraints(uniform=True)).remove_heads.values(),
            )
        )
        == 3
    )
    # ratio 0.375 -> 4.5 rounds to 5, nearer 6 than 3.
    assert (
        sum(
            map(
                len,
                select(
                    table, budget=Budget("heads", 0.375), constraints=Constraints(uniform=True)
                ).remove_heads.values(),
            )
        )
        == 6
    )
    assert (
        select(
            mha({0: [1, 2], 1: [3, 4]}), budget=Budget("heads", 0.25), constraints=Constraints(uniform=True)
        ).remove_heads
        == {}
    )


def test_uniform_threshold_pools_the_step_over_layers():
    table = mha({0: [0.1, 0.2, 0.3, 0.4], 1: [0.5, 0.6, 0.7, 0.8]})
    # First level removes heads scoring 0.1 and 0.5 (mean 0.3), the next 0.2 and 0.6 (mean 0.4).
    assert select(table, threshold="0.35", constraints=Constraints(uniform=True)).remove_heads == {0: [0], 1: [0]}
    assert select(table, threshold="0.45", constraints=Constraints(uniform=True)).remove_heads == {0: [0, 1], 1: [0, 1]}


def test_uniform_budget_removes_the_least_that_fits():
    table = mha({0: [0.1, 0.2, 0.3, 0.4], 1: [0.5, 0.6, 0.7, 0.8]})
    before = predict(table.cost, table.kept())["params"]
    one_each = predict(table.cost, table.kept(), {0: [0], 1: [0]})["params"]
    sel = select(table, budget=Budget("params", one_each / before), constraints=Constraints(uniform=True))
    assert sel.remove_heads == {0: [0], 1: [0]}
    with pytest.raises(UsageError, match="budget"):
        select(table, budget=Budget("params", 0.01), constraints=Constraints(uniform=True))


def test_uniform_gqa_removes_the_same_groups_count_everywhere():
    # 8 query heads in 4 KV groups of 2, per layer; group sums decide which groups go.
    scores = {0: [0.1, 0.1, 0.9, 0.9, 0.5, 0.5, 0.2, 0.2], 1: [0.9, 0.9, 0.1, 0.1, 0.8, 0.8, 0.7, 0.7]}
    heads = {l: dict(enumerate(v)) for l, v in scores.items()}
    table = ScoreTable(heads=heads, num_heads=[8, 8], num_kv_heads=[4, 4], cost=synthetic_cost([8, 8], [4, 4]))
    sel = select(table, budget=Budget("heads", 0.5), constraints=Constraints(uniform=True))
    assert sel.remove_heads == {0: [0, 1, 6, 7], 1: [2, 3, 6, 7]}
    assert kept_shape(table, sel) == {(4, 2)}
    rows = select(table, budget=Budget("heads", 0.5), constraints=Constraints(uniform=True, gqa_unit="head"))
    assert kept_shape(table, rows) == {(4, 4)}  # one query head from every group, all groups kept


def test_uniform_from_an_uneven_model_and_when_impossible():
    # A model pruned unevenly before: layer 0 keeps 3 heads, layer 1 keeps 4.
    table = mha({0: [0.1, 0.2, 0.3, 0.4], 1: [0.5, 0.6, 0.7, 0.8]})
    table.heads[0].pop(0)
    sel = select(table, budget=Budget("heads", 0.0), constraints=Constraints(uniform=True))
    assert kept_shape(table, sel) == {(3, 3)} and sel.remove_heads == {1: [0]}  # the nearest level to 0 removed
    # Layer 0 must keep its 3 (protected) heads; layer 1 loses whole KV groups of 2 heads.
    odd = ScoreTable(
        heads={0: {0: 1.0, 1: 1.0, 2: 1.0}, 1: {h: 0.5 for h in range(4)}},
        num_heads=[3, 4],
        num_kv_heads=[3, 2],
        cost=synthetic_cost([3, 4], [3, 2]),
    )
    with pytest.raises(UsageError, match=r"--uniform: no head count .*layer 0: \[3\]; layer 1: \[4, 2\]"):
        select(
            odd, budget=Budget("heads", 0.5), constraints=Constraints(uniform=True, protect=((0, 0), (0, 1), (0, 2)))
        )


@pytest.mark.parametrize("family", ["llama-gqa", "qwen3"])
def test_cli_select_uniform_and_prune(tmp_path, cli, family):
    model, model_path = saved_model(tmp_path, family)
    scores = write_scores(tmp_path, model, model_path)
    res = cli("select", scores, "--ratio", "0.5", "--uniform", "-o", tmp_path / "plan.json")
    assert res.code == 0, res.err
    assert "the same heads in every layer" in res.err
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["constraints"]["uniform"] is True and plan["config"]["uniform"] is True
    res = cli("prune", "--plan", tmp_path / "plan.json", "-o", tmp_path / "small.safetensors")
    assert res.code == 0, res.err
    layout = info_of(headprune_cli.load(tmp_path / "small.safetensors")).layout
    assert {len(h) for h in layout.heads} == {4} and {len(kv) for kv in layout.kv_heads} == {1}
    # The same through prune --scores, and a plan refuses the option.
    res = cli("prune", "--scores", scores, "--ratio", "0.5", "--uniform", "-o", tmp_path / "again.safetensors")
    assert res.code == 0, res.err
    res = cli("prune", "--plan", tmp_path / "plan.json", "--uniform", "-o", tmp_path / "x.safetensors")
    assert res.code != 0 and "--uniform" in res.err
