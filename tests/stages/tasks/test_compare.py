"""The cross-task numbers on cases small enough to work out by hand."""

from __future__ import annotations

import math

import pytest

from headprune_cli.errors import UsageError
from headprune_cli.stages.score.table import ScoreTable
from headprune_cli.stages.select.chains import Selection
from headprune_cli.stages.tasks.compare import (
    Kept,
    jaccard,
    kept_by,
    overlap,
    pairs,
    ranks,
    retained,
    shared_table,
    spearman,
)


def table(heads: dict[int, dict[int, float]], ffn: dict[int, list[float]] | None = None) -> ScoreTable:
    return ScoreTable(
        heads=heads,
        num_heads=[len(h) for h in heads.values()],
        num_kv_heads=[len(h) for h in heads.values()],
        method="fisher",
        ffn=ffn,
        ffn_kept={layer: list(range(len(v))) for layer, v in ffn.items()} if ffn else None,
        num_ffn=[len(v) for v in ffn.values()] if ffn else None,
    )


def kept(heads: set, ffn: set = frozenset()) -> Kept:
    return Kept(frozenset(heads), frozenset(ffn))


def test_jaccard_by_hand():
    assert jaccard({1, 2, 3}, {2, 3, 4}) == 2 / 4
    assert jaccard({1}, {2}) == 0.0
    assert jaccard(set(), set()) == 1.0


def test_spearman_by_hand_with_ties():
    # d = (0, 1, -1, 0): rho = 1 - 6 * 2 / (4 * 15) = 0.8
    assert spearman([1, 2, 3, 4], [10, 30, 20, 40]) == pytest.approx(0.8)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert list(ranks([5.0, 1.0, 5.0, 2.0])) == [3.5, 1.0, 3.5, 2.0]  # ties share the mean rank
    # with ties: Pearson of ranks (1, 2.5, 2.5, 4) and (1, 2, 3, 4)
    a, b = [1.0, 2.5, 2.5, 4.0], [1.0, 2.0, 3.0, 4.0]
    ma, mb = sum(a) / 4, sum(b) / 4
    cov = sum((x - ma) * (y - mb) for x, y in zip(a, b, strict=True))
    expected = cov / math.sqrt(sum((x - ma) ** 2 for x in a) * sum((y - mb) ** 2 for y in b))
    assert spearman([1, 7, 7, 9], [1, 2, 3, 4]) == pytest.approx(expected)
    assert spearman([1, 1, 1], [1, 2, 3]) is None  # constant: undefined, never NaN


def test_every_and_only_on_a_constructed_case():
    found = overlap(
        {
            "x": kept({(0, 0), (0, 1), (1, 0)}, {(0, 5)}),
            "y": kept({(0, 0), (0, 2), (1, 0)}, {(0, 5), (0, 6)}),
            "z": kept({(0, 0), (1, 0), (1, 1)}, {(0, 5)}),
        }
    )
    assert found["heads"]["every"] == {(0, 0), (1, 0)}
    assert found["heads"]["only"] == {"x": {(0, 1)}, "y": {(0, 2)}, "z": {(1, 1)}}
    assert found["ffn"]["every"] == {(0, 5)}
    assert found["ffn"]["only"] == {"x": set(), "y": {(0, 6)}, "z": set()}


def test_kept_pairs_and_retained_from_selections():
    x = table({0: {0: 4.0, 1: 3.0, 2: 2.0, 3: 1.0}}, {0: [1.0, 1.0, 2.0, 4.0]})
    y = table({0: {0: 1.0, 1: 2.0, 2: 3.0, 3: 4.0}}, {0: [4.0, 2.0, 1.0, 1.0]})
    kx = kept_by(x, Selection("s", {0: [2, 3]}, [], remove_ffn={0: [0, 1]}))
    ky = kept_by(y, Selection("s", {0: [0, 1]}, [], remove_ffn={0: [2, 3]}))
    assert kx == kept({(0, 0), (0, 1)}, {(0, 2), (0, 3)})
    (row,) = pairs({"x": x, "y": y}, {"x": kx, "y": ky})
    assert row["spearman_heads"] == pytest.approx(-1.0)
    assert row["jaccard_heads"] == 0.0 and row["jaccard_ffn"] == 0.0
    # x's total importance is 10 + 8 = 18; its kept units hold 4 + 3 + 2 + 4
    assert retained(x, kx) == pytest.approx(13 / 18)


def test_shared_table_is_the_mean_of_normalised_scores():
    x = table({0: {0: 2.0, 1: 2.0}}, {0: [4.0, 0.0]})  # total 8
    y = table({0: {0: 0.0, 1: 10.0}}, {0: [10.0, 0.0]})  # total 20
    shared = shared_table([x, y])
    assert shared.heads[0][0] == pytest.approx((2 / 8 + 0) / 2)
    assert shared.heads[0][1] == pytest.approx((2 / 8 + 10 / 20) / 2)
    assert shared.ffn == {0: [pytest.approx((4 / 8 + 10 / 20) / 2), 0.0]}


def test_shared_table_refuses_tasks_scored_differently():
    x, y = table({0: {0: 1.0}}), table({0: {0: 1.0}})
    y.method = "taylor"
    with pytest.raises(UsageError, match="different methods"):
        shared_table([x, y])
