"""model/latency_table.py: measured points as interpolated curves and as linear prices."""

from __future__ import annotations

import pytest

from headprune_cli.model.cost_table import CostTable, LayerCost, predict
from headprune_cli.model.latency_table import Curve, LatencyTable, LayerCurves, _monotone, priced


def test_noise_below_the_spread_is_pooled_into_a_non_decreasing_curve():
    assert _monotone([1.0, 3.0, 2.0, 4.0]) == [1.0, 2.5, 2.5, 4.0]
    curve = Curve.of([1, 2, 4], [2.0, 1.8, 5.0])
    assert curve.ms == (1.9, 1.9, 5.0)
    assert curve(3) == pytest.approx(3.45) and curve(4) == 5.0


def test_below_the_smallest_point_the_first_segment_extends_never_below_zero():
    curve = Curve.of([2, 4], [3.0, 5.0])
    assert curve(1) == pytest.approx(2.0) and curve(0) == pytest.approx(1.0)
    assert Curve.of([8, 16], [1.0, 9.0])(1) == 0.0


def _table(attention: dict, ffn: dict, outside=1.0, group=1) -> LatencyTable:
    layers = {
        0: LayerCurves(
            0, group, Curve.of(list(attention), list(attention.values())), Curve.of(list(ffn), list(ffn.values()))
        )
    }
    return LatencyTable(outside, layers, "forward", {"device": {"name": "x"}})


def test_a_layer_is_its_attention_plus_its_ffn_minus_the_full_block_they_share():
    table = _table({1: 3.0, 2: 4.0, 4: 6.0}, {8: 4.0, 16: 5.0, 32: 6.0})
    assert table.full_ms() == 7.0
    assert table.predict_ms({0: 2}, {0: 16}) == pytest.approx(1 + 4 + 5 - 6)
    assert table.predict_ms({}, {}) == 1.0  # every layer dropped: the rest


def test_the_whole_block_timed_twice_is_one_estimate_so_the_unpruned_model_costs_the_total():
    """Each curve times the full block itself; noise makes the two differ (6 and 8 ms here).
    The table's total and its prediction of the unpruned model must be the same number, or a
    budget of F of the total selects a plan the report prices at another fraction."""
    table = _table({1: 3.0, 2: 4.0, 4: 6.0}, {8: 4.0, 16: 5.0, 32: 8.0})
    assert table.full_ms() == pytest.approx(1 + 7.0)
    assert table.predict_ms({0: 4}, {0: 32}) == pytest.approx(table.full_ms())
    # Each cut saves what its own curve says it saves.
    assert table.predict_ms({0: 2}, {0: 32}) == pytest.approx(8.0 - 2.0)
    assert table.predict_ms({0: 4}, {0: 16}) == pytest.approx(8.0 - 3.0)


def test_linear_prices_reproduce_a_linear_table_exactly_and_split_gqa_units_by_flops():
    """Per unit 1 ms (4 query heads + 1 KV head, FLOPs 4 x 10 : 10), per neuron 0.125 ms."""
    table = _table({1: 3.0, 2: 4.0, 4: 6.0}, {8: 3.0, 16: 4.0, 32: 6.0}, group=4)
    cost = CostTable(
        16,
        100,
        50.0,
        [
            LayerCost(
                0,
                10,
                99.0,
                1.0,
                10.0,
                1.0,
                10.0,
                group_size=4,
                ffn_width=32,
                ffn_neuron_params=1.0,
                ffn_neuron_flops=7.0,
            )
        ],
    )
    ms = priced(table, cost)
    layer = ms.layers[0]
    assert layer.q_head_flops == pytest.approx(0.8 / 4) and layer.kv_head_flops == pytest.approx(0.2)
    assert layer.ffn_neuron_flops == pytest.approx(0.125) and ms.outside_flops == 1.0
    assert layer.fixed_params == 10 and layer.ffn_neuron_params == 1.0  # params untouched
    kept = {0: list(range(16))}
    assert predict(ms, kept)["flops_per_token"] == pytest.approx(table.full_ms())
    two_units = {0: list(range(8, 16))}  # 2 of 4 groups removed
    got = predict(ms, kept, two_units, [], {0: list(range(16))})["flops_per_token"]
    assert got == pytest.approx(table.predict_ms({0: 8}, {0: 16}))


def test_two_deep_cuts_never_predict_a_layer_below_zero_nor_a_model_at_zero():
    """Each curve says what its own cut saves from the whole block; together two deep cuts can
    claim more than the block costs (1 + 1 - 10 ms here). The layer is then 0 ms, and the
    model the rest: never zero or less (report divides by it, select promises it)."""
    table = _table({1: 1.0, 4: 10.0}, {8: 1.0, 32: 10.0}, outside=0.5)
    assert table.layers[0].at(1, 8) == 0.0
    assert table.predict_ms({0: 1}, {0: 8}) == 0.5
    assert table.predict_ms({0: 4}, {0: 32}) == pytest.approx(10.5)
