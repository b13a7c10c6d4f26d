"""The one budget value (stages/budget.py): parsed once, range-checked, priced the same way everywhere."""

from __future__ import annotations

import math

import pytest

from headprune_cli.errors import UsageError
from headprune_cli.model.cost_table import CostTable
from headprune_cli.stages.budget import Budget, BudgetUnreachable, checked, given, one_of


def test_one_of_reads_the_one_budget_the_options_name():
    assert one_of(ratio=None, target_params=None, target_flops=0.6) == Budget("flops", 0.6)
    assert one_of(ratio=0.3, target_params=None, target_flops=None) == Budget("heads", 0.3)
    assert one_of(ratio=None, target_params=None, target_flops=None) is None
    with pytest.raises(UsageError, match="give exactly one of --ratio, --target-params, --target-flops"):
        one_of(ratio=0.3, target_params=None, target_flops=0.5)
    assert given(ratio=None, target_latency=0.8, target_ms=None) == [Budget("latency", 0.8)]


@pytest.mark.parametrize(
    "budget, message",
    [
        (Budget("heads", 1.5), "--ratio 1.5 is outside [0, 1]"),
        (Budget("flops", 0.0), "--target-flops 0.0 is outside (0, 1]"),
        (Budget("params", math.nan), "--target-params nan is outside (0, 1]"),
        (Budget("ms", math.inf), "--target-ms inf must be a positive number"),
        (Budget("latency", 2.0), "--target-latency 2.0 is outside (0, 1]"),
        (Budget("ms", -1.0), "--target-ms -1.0 must be a positive number"),
        (Budget("heads", True), "--ratio True is not a number"),
    ],
)
def test_out_of_range_budgets_are_refused_with_the_options_own_words(budget, message):
    with pytest.raises(UsageError, match=message.replace("[", r"\[").replace("(", r"\(")):
        checked(budget)


def test_a_cost_budget_prices_plans_against_the_cost_before_them():
    budget = Budget("flops", 0.5)
    before, fits, over = {"flops_per_token": 200.0}, {"flops_per_token": 100.0}, {"flops_per_token": 100.001}
    assert budget.is_cost and budget.cost_key == "flops_per_token" and budget.limit(before) == 100.0
    assert budget.fits(fits, before) and not budget.fits(over, before)
    assert budget.share(before, fits) == "0.500 of the flops per token"
    assert budget.removed == 0.5 and Budget("heads", 0.3).removed == 0.3
    assert not Budget("heads", 0.3).is_cost
    with pytest.raises(ValueError):
        Budget("heads", 0.3).cost_key  # noqa: B018


def test_a_block_params_budget_leaves_out_the_params_outside_the_blocks():
    # 300 params, 100 of them outside the blocks (embeddings, tied head): keeping 0.5 of the
    # block params allows 100 + 0.5 * 200 = 200 in all, where --target-params 0.5 allows 150.
    table = CostTable(seq_len=16, outside_params=100, outside_flops=0.0, layers=[])
    budget = one_of(ratio=None, target_params=None, target_flops=None, target_block_params=0.5)
    assert budget == Budget("block_params", 0.5) and budget.option == "--target-block-params"
    priced = budget.priced(table)
    before, fits, over = {"params": 300}, {"params": 200}, {"params": 201}
    assert priced.is_cost and priced.cost_key == "params" and priced.limit(before) == 200.0
    assert priced.fits(fits, before) and not priced.fits(over, before)
    assert Budget("params", 0.5).limit(before) == 150.0
    assert priced.cost(before) == 200 and priced.share(before, fits) == "0.500 of the block params"
    assert priced.with_value(0.4).limit(before) == 180.0  # a schedule's next step keeps the price
    assert Budget("params", 0.5).priced(table) == Budget("params", 0.5)
    with pytest.raises(ValueError, match="priced by a cost table"):
        budget.limit(before)  # never silently priced as if nothing lay outside the blocks
    for bad in (0.0, 1.5, math.nan):
        with pytest.raises(UsageError, match=r"--target-block-params .* is outside \(0, 1\]"):
            checked(Budget("block_params", bad))


def test_an_unreachable_budget_is_its_own_usage_error_with_the_best_plan():
    error = BudgetUnreachable(best="0.612 of the flops per token")
    assert isinstance(error, UsageError) and error.best == "0.612 of the flops per token"
    assert str(error) == "the budget cannot be met within the constraints (best: 0.612 of the flops per token)"
    assert str(BudgetUnreachable(detail="even with all layers but one dropped (params)")).endswith(
        "(even with all layers but one dropped (params))"
    )
