"""Joint selection: heads and layers priced on one (loss) scale under one budget."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headprune_cli import load
from headprune_cli.artifacts.schema import dumps
from headprune_cli.errors import UsageError
from headprune_cli.model.cost import cost_table, count_params
from headprune_cli.model.layout import info_of
from headprune_cli.stages.budget import Budget
from headprune_cli.stages.constraints import Constraints
from headprune_cli.stages.score.table import ScoreTable
from headprune_cli.stages.select.strategies import select
from tests.support import saved_model, scores_for, synthetic_cost, tensor_data

# synthetic_cost: a layer is 2000 fixed FLOPs + 160 per head (MHA); 700 outside.
FULL = 700 + 3 * (2000 + 4 * 160)


def table(head_score: float, layer_scores: dict, layer_method: str = "loo", method: str = "loo") -> ScoreTable:
    heads = {layer: {h: head_score + 0.001 * h for h in range(4)} for layer in range(3)}
    return ScoreTable(
        heads=heads,
        num_heads=[4] * 3,
        num_kv_heads=[4] * 3,
        layers=layer_scores,
        cost=synthetic_cost([4] * 3, [4] * 3),
        method=method,
        layer_method=layer_method,
    )


def flops(sel) -> float:
    return sel.predicted["after"]["flops_per_token"]


def test_a_layer_whose_loss_per_flop_is_lowest_goes_before_heads():
    sel = select(table(1.0, {0: 3.0, 1: 0.5, 2: 3.0}), budget=Budget("flops", 0.7))
    assert sel.strategy == "joint" and sel.remove_layers == [1] and sel.remove_heads == {}
    assert flops(sel) <= 0.7 * FULL


def test_cheap_heads_go_before_a_costly_layer():
    sel = select(table(0.01, {0: 9.0, 1: 9.0, 2: 9.0}), budget=Budget("flops", 0.9))
    assert sel.remove_layers == []
    assert sum(map(len, sel.remove_heads.values())) == 6  # 6 x 160 FLOPs >= 10% of 7920
    assert all(heads == [0, 1] for heads in sel.remove_heads.values())  # the lowest-scored heads of each layer
    assert flops(sel) <= 0.9 * FULL


def test_head_steps_a_later_layer_drop_makes_redundant_are_given_back():
    # Heads are cheaper per FLOP, so all 9 removable ones go first; the budget still needs a
    # layer, and once it is gone the two other layers can keep every head.
    sel = select(table(0.01, {0: 1.0, 1: 1.0, 2: 1.0}), budget=Budget("flops", 0.7))
    assert sel.remove_layers == [0] and sel.remove_heads == {}
    assert flops(sel) <= 0.7 * FULL


def test_budget_without_loss_scale_layer_scores_stays_heads_only():
    cosine = table(0.01, {0: 0.0, 1: 0.0, 2: 0.0}, layer_method="cosine")
    sel = select(cosine, budget=Budget("flops", 0.9))
    assert sel.strategy == "budget" and sel.remove_layers == []
    with pytest.raises(UsageError, match="loss changes.*got cosine"):
        select(cosine, "joint", budget=Budget("flops", 0.9))
    with pytest.raises(UsageError, match="got taylor"):  # taylor scores without the attention measurement
        select(table(0.01, {0: 1.0, 1: 1.0, 2: 1.0}, method="taylor"), "joint", budget=Budget("flops", 0.9))
    fixed = select(
        table(1.0, {0: 3.0, 1: 0.5, 2: 3.0}), budget=Budget("flops", 0.9), constraints=Constraints(drop_layers=1)
    )
    assert fixed.strategy == "budget" and fixed.remove_layers == [1]  # an explicit layer count keeps the old meaning


def test_head_scores_become_shares_of_their_layers_measured_attention_loss():
    # Raw taylor scores (large, not a loss) say nothing against layer losses; the attention
    # measurement does: layer 2's heads together cost 0.04, a quarter each by their scores.
    raw = table(5.0, {0: 1.0, 1: 1.0, 2: 1.0}, method="taylor")
    raw.heads[2] = {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0}
    raw.attention = {0: 9.0, 1: 9.0, 2: 0.04}
    sel = select(raw, budget=Budget("flops", 0.95))  # 396 FLOPs: three heads
    assert sel.strategy == "joint" and sel.remove_layers == [] and sel.remove_heads == {2: [0, 1, 2]}
    raw.attention = {0: 9.0, 1: 9.0, 2: 9.0}  # now every head costs more per FLOP than a layer
    assert select(raw, budget=Budget("flops", 0.95)).remove_layers == [0]


def test_protected_layers_stay_and_one_layer_always_remains():
    protected = select(
        table(1.0, {0: 3.0, 1: 0.5, 2: 3.0}), budget=Budget("flops", 0.7), constraints=Constraints(protect=((1, 2),))
    )
    assert 1 not in protected.remove_layers and flops(protected) <= 0.7 * FULL
    with pytest.raises(UsageError, match="budget cannot be met"):
        select(table(0.0, {0: 0.0, 1: 0.0, 2: 0.0}), budget=Budget("flops", 0.05))


def _heavy_heads(table_: ScoreTable) -> ScoreTable:
    """The table with heads that weigh 4.2% of the parameters each but cost 1.9% of the FLOPs."""
    layers = [replace(lc, q_head_params=200.0, kv_head_params=100.0) for lc in table_.cost.layers]
    table_.cost = replace(table_.cost, layers=layers)
    return table_


def test_target_params_budgets_parameters_and_target_flops_budgets_flops():
    cheap_heads = _heavy_heads(table(0.01, {0: 9.0, 1: 9.0, 2: 9.0}))
    by_params = select(cheap_heads, "joint", budget=Budget("params", 0.9))
    by_flops = select(cheap_heads, "joint", budget=Budget("flops", 0.9))
    removed = {
        name: sum(map(len, sel.remove_heads.values())) for name, sel in (("params", by_params), ("flops", by_flops))
    }
    assert removed == {"params": 3, "flops": 6}  # 3 x 300 >= 10% of 7100 parameters; 6 x 160 >= 10% of 8620 FLOPs
    assert by_params.predicted["after"]["params"] <= 0.9 * by_params.predicted["before"]["params"]
    assert flops(by_flops) <= 0.9 * FULL
    # The best a budget can do (two layers gone, one head left) is told in the budget's own unit.
    with pytest.raises(UsageError, match=r"best: 0\.254 of the params\)"):
        select(_heavy_heads(table(0.0, {0: 0.0, 1: 0.0, 2: 0.0})), "joint", budget=Budget("params", 0.05))


def test_a_budget_met_exactly_takes_no_more_than_it_needs():
    # 3 of the 12 heads are 480 FLOPs: a budget of exactly 8620 - 480 needs those three and no
    # fourth; float rounding of target x before must not make it look missed.
    sel = select(table(0.01, {0: 9.0, 1: 9.0, 2: 9.0}), "joint", budget=Budget("flops", (FULL - 480) / FULL))
    assert sum(map(len, sel.remove_heads.values())) == 3 and flops(sel) == FULL - 480


def test_joint_refuses_a_fixed_layer_choice_and_scores_without_costs():
    scores = table(0.01, {0: 1.0, 1: 1.0, 2: 1.0})
    for fixed in (Constraints(drop_layers=1), Constraints(layer_threshold=0.5)):
        with pytest.raises(
            UsageError, match="^strategy 'joint' chooses the layers itself; leave out --drop-layers/--layer-threshold$"
        ):
            select(scores, "joint", budget=Budget("flops", 0.9), constraints=fixed)
    scores.cost = None
    with pytest.raises(
        UsageError, match="^a --target-params/--target-flops budget needs the cost table in the scores$"
    ):
        select(scores, "joint", budget=Budget("flops", 0.9))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    heads=st.lists(st.lists(st.floats(-1, 3), min_size=4, max_size=4), min_size=3, max_size=3),
    layers=st.lists(st.floats(-1, 6), min_size=3, max_size=3),
    target=st.floats(0.35, 1.0),
    min_heads=st.integers(1, 3),
    multiple_of=st.sampled_from([1, 2]),
)
def test_joint_always_fits_and_respects_constraints(heads, layers, target, min_heads, multiple_of):
    t = ScoreTable(
        heads={l: dict(enumerate(h)) for l, h in enumerate(heads)},
        num_heads=[4] * 3,
        num_kv_heads=[4] * 3,
        layers=dict(enumerate(layers)),
        cost=synthetic_cost([4] * 3, [4] * 3),
        method="loo",
        layer_method="refit",
    )
    c = Constraints(min_heads=min_heads, multiple_of=multiple_of)
    try:
        sel = select(t, "joint", budget=Budget("flops", target), constraints=c)
    except UsageError as exc:
        assert "cannot be met" in str(exc)
        return
    assert flops(sel) <= target * FULL * (1 + 1e-9)
    assert len(sel.remove_layers) < 3
    for layer, removed in sel.remove_heads.items():
        assert layer not in sel.remove_layers
        kept = 4 - len(removed)
        assert kept >= min_heads and kept % multiple_of == 0


def test_the_scores_artifact_decides_whether_a_budget_prices_layers_too(tmp_path, cli):
    # Layers join a budget only when heads and layers are both loss changes: loo heads with
    # loo layers. Hand-made head scores (another scale), or no layer scores, keep it to heads.
    model, model_path = saved_model(tmp_path)
    strategies = {}
    for method, layers in (("loo", True), ("hand", True), ("loo", False)):
        artifact = scores_for(model, model_path, layer_scores=layers)
        artifact["method"] = method
        artifact["config"]["layers"] = "loo" if layers else None
        path = tmp_path / f"{method}-{layers}.json"
        path.write_text(dumps(artifact))
        result = cli("select", path, "--target-flops", "0.9")
        assert result.code == 0, result.err
        strategies[method, layers] = json.loads(result.out)["strategy"]
    assert strategies == {("loo", True): "joint", ("hand", True): "budget", ("loo", False): "budget"}


def test_cli_scores_selects_and_prunes_layers_and_heads_to_the_predicted_cost(tmp_path, cli):
    model, path = saved_model(tmp_path)
    data = tensor_data(tmp_path)
    scores = tmp_path / "scores.json"
    args = (
        "score",
        path,
        "--data",
        data,
        "--objective",
        "fidelity",
        "--method",
        "taylor",
        "--layers",
        "--layer-method",
        "loo",
    )
    assert cli(*args, "-o", scores).code == 0
    written_scores = json.loads(scores.read_text())
    assert written_scores["config"]["layers"] == "loo" and sorted(written_scores["attention"]) == ["0", "1", "2"]
    plan = tmp_path / "plan.json"
    result = cli("select", scores, "--target-flops", "0.4", "-o", plan)
    assert result.code == 0, result.err
    written = json.loads(plan.read_text())
    assert written["strategy"] == "joint" and written["remove_layers"]  # 3 layers x 4 heads: 0.4 needs a layer
    assert cli("prune", "--plan", plan, "-o", tmp_path / "small.safetensors").code == 0
    small = load(tmp_path / "small.safetensors")
    assert info_of(small).layout.layers == [l for l in range(3) if l not in written["remove_layers"]]
    assert count_params(small) == written["predicted"]["after"]["params"]
    assert written["predicted"]["after"]["flops_per_token"] <= 0.4 * written["predicted"]["before"]["flops_per_token"]
    cost = cost_table(small, 16)
    assert cost.layers and len(cost.layers) == 3 - len(written["remove_layers"])


def test_a_layer_drop_that_overshoots_is_undone_when_head_steps_meet_the_budget_for_less():
    # Per FLOP a layer (1.0 / 2640) is cheaper than a head (0.1 / 160), so the greedy drops
    # two layers: 0.39 of the FLOPs for a target of 0.6, at a loss of 2.0. One layer and six
    # heads (the most the two kept layers may lose at --min-heads 1) fit too, for 1.0 + 0.6.
    sel = select(table(0.1, {0: 1.0, 1: 1.0, 2: 1.0}), budget=Budget("flops", 0.6))
    (dropped,) = sel.remove_layers
    assert sel.remove_heads == {layer: [0, 1, 2] for layer in range(3) if layer != dropped}
    assert 0.55 * FULL < flops(sel) <= 0.6 * FULL
    # when the heads cost more than the second layer, the drop stays
    sel = select(table(0.2, {0: 1.0, 1: 1.0, 2: 1.0}), budget=Budget("flops", 0.6))  # 1.0 + 6 x 0.2 > 2.0
    assert sel.remove_layers == [0, 1] and sel.remove_heads == {}


def test_with_ffn_neurons_an_overshooting_layer_drop_gives_way_to_neuron_steps():
    from headprune_cli.model.cost_table import LayerCost

    # Per layer: 1000 fixed + 4 heads x 160 + 8 neurons x 125 = 2640 FLOPs; 700 outside.
    cost = replace(
        synthetic_cost([4] * 3, [4] * 3),
        layers=[
            LayerCost(
                layer=i,
                fixed_params=1000,
                fixed_flops=1000.0,
                q_head_params=50.0,
                q_head_flops=100.0,
                kv_head_params=30.0,
                kv_head_flops=60.0,
                group_size=1,
                ffn_width=8,
                ffn_neuron_params=10.0,
                ffn_neuron_flops=125.0,
            )
            for i in range(3)
        ],
    )
    scores = table(0.3, {0: 1.0, 1: 1.0, 2: 1.0})
    scores = replace(
        scores,
        cost=cost,
        ffn={l: [1.0] * 8 for l in range(3)},
        ffn_kept={l: list(range(8)) for l in range(3)},
        ffn_loss={l: 0.4 for l in range(3)},
        num_ffn=[8] * 3,
    )
    # A neuron costs 0.4 / 8 = 0.05 for 125 FLOPs, more per FLOP than a layer (1.0 for 2640):
    # the greedy drops two layers (loss 2.0, 0.39 of the FLOPs); one layer and seven neurons
    # reach 0.6 for 1.35.
    sel = select(scores, budget=Budget("flops", 0.6), constraints=Constraints(ffn_multiple_of=1))
    assert sel.strategy == "joint" and len(sel.remove_layers) == 1 and sel.remove_heads == {}
    assert sum(map(len, sel.remove_ffn.values())) == 7
    assert 0.55 * 8620 < flops(sel) <= 0.6 * 8620
