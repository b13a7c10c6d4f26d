"""Score tables built directly (no model): synthetic costs, hypothesis strategies, the constraint check."""

from __future__ import annotations

from hypothesis import strategies as st

from headprune_cli.model.cost_table import CostTable, LayerCost
from headprune_cli.stages.budget import OPTION_FIELDS, given
from headprune_cli.stages.constraints import Constraints
from headprune_cli.stages.score.table import ScoreTable


def synthetic_cost(num_heads, num_kv_heads) -> CostTable:
    layers = [
        LayerCost(
            layer=i,
            fixed_params=1000,
            fixed_flops=2000.0,
            q_head_params=50.0,
            q_head_flops=100.0,
            kv_head_params=30.0,
            kv_head_flops=60.0,
            group_size=n // kv,
        )
        for i, (n, kv) in enumerate(zip(num_heads, num_kv_heads))
    ]
    return CostTable(seq_len=16, outside_params=500, outside_flops=700.0, layers=layers)


@st.composite
def tables(draw):
    n_layers = draw(st.integers(1, 4))
    num_heads, num_kv, heads = [], [], {}
    for layer in range(n_layers):
        kv = draw(st.sampled_from([1, 2, 3, 4]))
        group = draw(st.sampled_from([1, 1, 2, 4]))
        num_heads.append(kv * group)
        num_kv.append(kv)
        values = st.floats(-2, 5, allow_nan=False) | st.sampled_from([0.0, 1.0])  # ties too
        heads[layer] = {h: draw(values) for h in range(kv * group)}
    layer_scores = {layer: draw(st.floats(0, 1)) for layer in range(n_layers)}
    return ScoreTable(
        heads=heads,
        num_heads=num_heads,
        num_kv_heads=num_kv,
        layers=layer_scores,
        cost=synthetic_cost(num_heads, num_kv),
    )


@st.composite
def requests(draw, table):
    pairs = [(l, h) for l, hs in table.heads.items() for h in hs]
    protect = tuple(sorted(set(draw(st.lists(st.sampled_from(pairs), max_size=3)))))
    constraints = Constraints(
        min_heads=draw(st.integers(1, 3)),
        multiple_of=draw(st.sampled_from([1, 1, 2, 3])),
        protect=protect,
        drop_layers=draw(st.integers(0, 1)),
        gqa_unit=draw(st.sampled_from(["group", "head"])),
    )
    kind = draw(st.sampled_from(["global", "layer", "threshold", "budget"]))
    amount = {
        "global": {"ratio": draw(st.floats(0, 1))},
        "layer": {"ratio": draw(st.floats(0, 1))},
        "threshold": {"threshold": draw(st.sampled_from(["0.5", "25%", "90%", "-1"]))},
        "budget": {"target_flops": draw(st.floats(0.3, 1))},
    }[kind]
    return kind, amount, constraints


def check_constraints(table: ScoreTable, c: Constraints, sel) -> None:
    assert len(sel.remove_layers) < len(table.heads)
    protected_layers = {l for l, _ in c.protect}
    assert not set(sel.remove_layers) & protected_layers
    for layer, kept in table.heads.items():
        if layer in sel.remove_layers:
            assert layer not in sel.remove_heads
            continue
        removed = set(sel.remove_heads.get(layer, []))
        assert removed <= set(kept)
        left = [h for h in kept if h not in removed]
        assert len(left) >= c.min_heads
        assert len(left) % c.multiple_of == 0
        assert not {(layer, h) for h in removed} & set(c.protect)
        group = table.num_heads[layer] // table.num_kv_heads[layer]
        sizes = {}
        for h in left:
            sizes[h // group] = sizes.get(h // group, 0) + 1
        assert len(set(sizes.values())) == 1, "GQA groups must keep equal sizes"
        if c.gqa_unit == "group":
            assert set(sizes.values()) == {group}, "group unit removes whole KV groups"


def mha(scores: dict[int, list[float]], layer_scores=None) -> ScoreTable:
    heads = {l: dict(enumerate(v)) for l, v in scores.items()}
    n = [len(v) for v in scores.values()]
    return ScoreTable(heads=heads, num_heads=n, num_kv_heads=n, layers=layer_scores, cost=synthetic_cost(n, n))


def with_budget(amount: dict) -> dict:
    """select()'s keywords from a test's amount: `ratio`/`target_params`/`target_flops`
    become the one Budget they name (stages/budget.py); the other keys stay."""
    out = {k: v for k, v in amount.items() if k not in OPTION_FIELDS}
    found = given(**{k: v for k, v in amount.items() if k in OPTION_FIELDS})
    assert len(found) <= 1, f"a test amount names two budgets: {amount}"
    if found:
        out["budget"] = found[0]
    return out
