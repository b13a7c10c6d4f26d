"""Learned gates on heads, FFN neurons and layers under one budget: the expected share the
Lagrangian drives is the cost the sampled model has, a closed layer gate is a dropped layer,
and the closing drops the layers whose gates closed."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from headprune_cli.model.cost_table import predict
from headprune_cli.model.surgery import LayerGates, skip_layers
from headprune_cli.stages.budget import Budget
from headprune_cli.stages.constraints import Constraints
from headprune_cli.stages.learn.gate_space import GateSpace
from headprune_cli.stages.learn.learn import make_gates
from headprune_cli.stages.select.chains import Selection
from headprune_cli.stages.training.gating import applied
from tests.support import TINY, model_inputs, model_output


def removed_by_mask(space: GateSpace, mask: torch.Tensor) -> float:
    """The share of the cost one 0/1 draw of every gate removes, priced by the cost table."""
    heads, neurons, layers = space.parts(mask)
    gone_units = {u for u, on in enumerate(heads.tolist()) if not on}
    remove_heads: dict[int, list[int]] = {}
    for u, (layer, hs) in enumerate(space.head_units):
        if u in gone_units:
            remove_heads.setdefault(layer, []).extend(hs)
    remove_ffn, start = {}, 0
    for layer, kept in zip(space.layers, space.neurons):
        part = neurons[start : start + len(kept)].tolist()
        remove_ffn[layer] = [n for n, on in zip(kept, part) if not on]
        start += len(kept)
    dropped = [layer for layer, on in zip(space.layers, layers.tolist()) if not on]
    kept = dict(zip(space.layers, space.heads))
    after, before = predict(space.cost, kept, remove_heads, dropped, remove_ffn), predict(space.cost, kept)
    # A block-params budget counts neither side's embeddings and heads (the cost table's outside).
    outside = space.cost.outside_params if space.budget.kind == "block_params" else 0
    key = space.budget.cost_key
    return 1.0 - (after[key] - outside) / (before[key] - outside)


@pytest.mark.parametrize("family", ["reference", "llama-gqa"])
@pytest.mark.parametrize("kind", ["flops", "params", "block_params"])
def test_the_expected_share_is_the_mean_cost_of_the_sampled_models(family, kind):
    space = GateSpace(TINY[family](), Budget(kind, 0.5), 16, ffn=True, layers=True)
    p = torch.rand(space.size, generator=torch.Generator().manual_seed(0))
    draws = torch.rand(4000, space.size, generator=torch.Generator().manual_seed(1)) < p
    sampled = sum(removed_by_mask(space, d) for d in draws.float()) / len(draws)
    assert float(space.expected_removed(p)) == pytest.approx(sampled, abs=0.01)
    # At 0/1 probabilities the expectation is the cut's exact share, as select prices it.
    mask = draws[0].float()
    assert float(space.expected_removed(mask)) == pytest.approx(removed_by_mask(space, mask), abs=1e-9)


def test_a_block_params_budget_prices_the_blocks_alone():
    # Every layer gate closed removes every block: all of the block params, but only part of
    # the params (the embeddings and the LM head stay); a budget counting those would say < 1.
    model = TINY["llama"]()
    blocks = sum(p.numel() for p in model.model.layers.parameters())
    every = {kind: GateSpace(model, Budget(kind, 0.5), 16, layers=True) for kind in ("params", "block_params")}
    shut = {k: torch.cat([torch.ones(s.size - len(s.layers)), torch.zeros(len(s.layers))]) for k, s in every.items()}
    assert float(every["block_params"].expected_removed(shut["block_params"])) == pytest.approx(1.0, abs=1e-9)
    total = sum(p.numel() for p in model.parameters())
    assert float(every["params"].expected_removed(shut["params"])) == pytest.approx(blocks / total, abs=1e-9)
    assert every["block_params"].now == blocks


def test_without_layer_or_neuron_gates_the_share_is_the_heads_share_of_the_cost():
    model = TINY["reference"]()
    heads_only, every = GateSpace(model, Budget("flops", 0.5), 16), GateSpace(model, Budget("flops", 0.5), 16, ffn=True)
    p = torch.rand(heads_only.size, generator=torch.Generator().manual_seed(2))
    open_rest = torch.cat([p, torch.ones(every.size - heads_only.size)])
    # Heads priced alone (FFN in the fixed cost) or beside open neurons: the same share.
    assert float(heads_only.expected_removed(p)) == pytest.approx(float(every.expected_removed(open_rest)), abs=1e-9)
    assert 0 < float(heads_only.expected_removed(p)) < 1


def test_a_closed_layer_gate_is_a_dropped_layer_and_an_open_one_changes_nothing():
    model = TINY["reference"]().eval()
    inputs = model_inputs("reference")
    plain = model_output(model, inputs)
    with LayerGates(model, torch.tensor([1.0, 0.0, 1.0])):
        gated = model_output(model, inputs)
    with skip_layers(model, [1]):
        skipped = model_output(model, inputs)
    assert torch.equal(gated, skipped) and not torch.equal(gated, plain)
    with LayerGates(model, torch.ones(3)):
        assert torch.equal(model_output(model, inputs), plain)
    # Per example: the first row's layer 1 closed, the second's open.
    rows = {k: v[:2] for k, v in inputs.items()}
    with LayerGates(model, torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 1.0]])):
        mixed = model_output(model, rows)
    torch.testing.assert_close(mixed[0], skipped[0])
    torch.testing.assert_close(mixed[1], plain[1])


def test_the_closing_drops_the_layers_whose_gates_closed_and_meets_the_budget():
    model = TINY["reference"]()
    gates = make_gates(
        model, Budget("flops", 0.5), Constraints(), seed=0, seq_len=16, lr=0.3, warmup=0.5, closed_share=0.4,
        ffn=True, layers=True,
    )  # fmt: skip
    heads, neurons, layers = gates.space.parts(torch.arange(gates.space.size))
    with torch.no_grad():
        gates.log_alpha[layers[1]] = -8.0  # layer 1's gate shut
        gates.log_alpha[neurons[::3]] = -8.0  # a third of the neurons shut
    selection = gates.close(gates.table())
    assert selection.remove_layers == [1]
    assert gates.removed_share(selection) >= 0.5 - 1e-9
    # The closed 0/1 gates applied to the model are the cut model.
    from headprune_cli.model.surgery import apply_plan

    inputs = model_inputs("reference")
    with applied(model, gates.space.split(gates.space.closed(selection))):
        gated = model_output(model.eval(), inputs)
    cut = apply_plan(model, selection.remove_heads, selection.remove_layers, selection.remove_ffn)
    torch.testing.assert_close(model_output(cut, inputs), gated, rtol=1e-5, atol=1e-6)


def test_protected_heads_keep_their_unit_and_their_layer_open():
    space = GateSpace(TINY["reference"](), Budget("flops", 0.5), 16, ffn=True, layers=True, protect=((2, 0),))
    heads, neurons, layers = space.parts(space.protected)
    assert heads.sum() == 1 and not neurons.any() and layers.tolist() == [False, False, True]
    nothing = Selection("budget", {}, [])
    assert space.closed(nothing).all()


def test_per_kind_counts_query_heads_neurons_and_layers():
    """llama-gqa: 3 layers of 8 query heads in 2 KV groups (a head unit is a group of 4 query
    heads) and 48 FFN neurons; layer 0 has lost KV group 0 before the gates are made."""
    from headprune_cli.model.surgery import apply_plan

    model = TINY["llama-gqa"]()
    apply_plan(model, {0: [0, 1, 2, 3]}, [])
    space = GateSpace(model, Budget("flops", 0.5), 8, ffn=True, layers=True)
    assert space.sizes == {"heads": 5, "neurons": 144, "layers": 3}
    assert space.per_kind(torch.ones(space.size)) == {"heads": 20.0, "neurons": 144.0, "layers": 3.0}
    closed = torch.zeros(space.size)
    closed[[0, 1]] = 1.0  # layer 0's only unit (4 heads) and layer 1's first (4 heads)
    closed[[5, 6, 7]] = 1.0  # three neurons
    closed[-1] = 1.0  # the last layer
    assert space.per_kind(closed) == {"heads": 8.0, "neurons": 3.0, "layers": 1.0}
    half = torch.full((space.size,), 0.5)  # expected counts: each unit's count times its share closed
    assert space.per_kind(half) == {"heads": 10.0, "neurons": 72.0, "layers": 1.5}
    heads_only = GateSpace(model, Budget("heads", 0.5), 8)
    assert heads_only.per_kind(torch.ones(heads_only.size)) == {"heads": 20.0}


def test_gates_under_a_block_params_budget_close_on_the_blocks_share():
    from headprune_cli.model.surgery import apply_plan

    model = TINY["reference"]()
    blocks = lambda m: sum(p.numel() for p in m.layers.parameters())  # noqa: E731
    gates = make_gates(
        model, Budget("block_params", 0.5), Constraints(ffn_multiple_of=1), seed=0, seq_len=16, lr=0.3, warmup=0.5,
        closed_share=0.4, ffn=True, layers=True,
    )  # fmt: skip
    selection = gates.close(gates.table())
    cut = TINY["reference"]()
    apply_plan(cut, selection.remove_heads, selection.remove_layers, selection.remove_ffn)
    # The closing meets 0.5 of the blocks (not of all params, which would leave ~0.4 of them).
    assert 0.45 < blocks(cut) / blocks(model) <= 0.5 + 1e-9
    assert gates.removed_share(selection) == pytest.approx(1 - blocks(cut) / blocks(model), abs=1e-6)
    assert gates.report(selection)["budget"] == "block_params"


def _exact_expectation(space: GateSpace, base: torch.Tensor, free: list[int], probs: list[float]) -> float:
    """The share removed averaged over every draw of the `free` gates (open with `probs`,
    independently), the others fixed at `base`: the expectation by enumeration."""
    total = 0.0
    for bits in itertools.product([0.0, 1.0], repeat=len(free)):
        mask = base.clone()
        mask[free] = torch.tensor(bits, dtype=torch.float64)
        weight = math.prod(q if on else 1.0 - q for on, q in zip(bits, probs))
        total += weight * removed_by_mask(space, mask)
    return total


@pytest.mark.parametrize("ffn, layers", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("kind", ["flops", "params"])
def test_the_expected_share_is_exact_for_every_mix_of_gates(ffn, layers, kind):
    """One head unit, one neuron and one layer gate of layer 0 left open at 0.3 / 0.6 / 0.8
    (those the space has), every other gate drawn 0/1: the expected share equals the
    enumerated mean of the cost table's price of each cut, to float precision."""
    space = GateSpace(TINY["llama-gqa"](), Budget(kind, 0.5), 16, ffn=ffn, layers=layers)
    base = (torch.rand(space.size, generator=torch.Generator().manual_seed(3)) < 0.7).double()
    free = [1] + ([space.sizes["heads"] + 2] if ffn else []) + ([space.size - 3] if layers else [])
    probs = [0.3, 0.6, 0.8][: len(free)]
    p = base.clone()
    p[free] = torch.tensor(probs, dtype=torch.float64)
    assert float(space.expected_removed(p)) == pytest.approx(_exact_expectation(space, base, free, probs), abs=1e-12)


def test_a_heads_budget_prices_each_unit_by_its_query_heads():
    """llama-gqa: 3 layers of 2 KV groups of 4 query heads, 24 heads in 6 units of 4/24 each."""
    space = GateSpace(TINY["llama-gqa"](), Budget("heads", 0.5), 8)
    p = torch.tensor([1.0, 0.0, 0.5, 1.0, 0.25, 1.0])
    assert float(space.expected_removed(p)) == pytest.approx((4 + 0.5 * 4 + 0.75 * 4) / 24, abs=1e-12)
    # A unit goes when all its heads go: layer 1 keeps a head of its second group.
    one_unit = Selection("budget", {0: [0, 1, 2, 3], 1: [4, 5, 6]}, [])
    assert space.removed_share(one_unit) == round(4 / 24, 6) == 0.166667
    assert space.removed_share(Selection("budget", {0: [0, 1, 2, 3]}, [2])) == 0.5  # and a dropped layer's 8


def test_a_cost_share_is_rounded_to_six_places():
    space = GateSpace(TINY["reference"](), Budget("flops", 0.5), 16, ffn=True)
    selection = Selection("budget", {0: [1], 2: [3]}, [], remove_ffn={1: [0, 5, 7, 9]})
    share = space.removed_share(selection)  # 0.12085836909871239 unrounded
    assert share == 0.120858
    mask = space.closed(selection)
    assert share == pytest.approx(removed_by_mask(space, mask), abs=5e-7)


def test_split_gives_each_hook_its_columns_of_a_row_of_gates_per_example():
    space = GateSpace(TINY["llama-gqa"](), Budget("flops", 0.5), 8, ffn=True, layers=True)
    z = torch.arange(5 * space.size, dtype=torch.float32).reshape(5, space.size)
    heads, neurons, layers = space.parts(z)
    assert (heads.shape, neurons.shape, layers.shape) == ((5, 6), (5, 144), (5, 3))
    out = space.split(z)
    assert torch.equal(out["head.0"], z[:, [0, 0, 0, 0, 1, 1, 1, 1]])  # layer 0's 8 query heads in 2 units
    assert torch.equal(out["head.2"], z[:, [4, 4, 4, 4, 5, 5, 5, 5]])
    assert torch.equal(out["ffn.1"], z[:, 6 + 48 : 6 + 96])
    assert torch.equal(out["layer"], z[:, -3:])


def test_without_layer_gates_protection_and_closings_cover_heads_and_neurons_only():
    """reference: heads [4, 3, 4] (units 0-3, 4-6, 7-10), 48 neurons per layer, no layer gates."""
    space = GateSpace(TINY["reference"](), Budget("flops", 0.5), 16, ffn=True, protect=((2, 0),))
    assert space.protected.shape == (space.size,) == (11 + 144,) and space.protected.dtype == torch.bool
    assert space.protected.nonzero().flatten().tolist() == [7]
    closed = space.closed(Selection("budget", {0: [1]}, [1], remove_ffn={2: [0, 5]}))
    assert closed.shape == (space.size,)
    heads, neurons, _ = space.parts(closed)
    assert heads.tolist() == [1, 0, 1, 1, 0, 0, 0, 1, 1, 1, 1]
    assert (neurons == 0).nonzero().flatten().tolist() == list(range(48, 96)) + [96, 101]


@pytest.mark.parametrize("ffn, layers", [(False, False), (True, True)])
def test_the_table_carries_the_probabilities_and_where_they_came_from(ffn, layers):
    """Heads alone: every query head scores its unit's open probability. With neuron gates a
    score is P times the cost one closing saves (a head's share of its unit's), checked against
    the cost table's price of closing that unit or neuron alone."""
    space = GateSpace(TINY["llama-gqa"](), Budget("flops", 0.5), 8, ffn=ffn, layers=layers)
    p = torch.linspace(0.05, 0.95, space.size, dtype=torch.float64)
    table = space.table(p, "kd", 12, {"lr": 0.3})
    assert (table.method, table.objective, table.samples) == ("learned", "kd", 12)
    assert table.layer_method == ("learned" if layers else None)
    assert table.config == ({"lr": 0.3, "layers": "learned"} if layers else {"lr": 0.3})
    assert (table.num_heads, table.num_kv_heads, table.cost) == ([8, 8, 8], [2, 2, 2], space.cost)
    if not ffn:
        assert table.layers is None and table.ffn is None and table.num_ffn is None
        assert table.heads[1] == {h: float(p[2 + h // 4]) for h in range(8)}
        return

    def alone(index: int) -> float:
        mask = torch.ones(space.size)
        mask[index] = 0.0
        return removed_by_mask(space, mask)

    assert table.heads[1][5] == pytest.approx(float(p[3]) * alone(3) / 4, rel=1e-9)
    assert table.ffn[2][7] == pytest.approx(float(p[6 + 96 + 7]) * alone(6 + 96 + 7), rel=1e-9)
    assert table.num_ffn == [48, 48, 48] and table.ffn_kept == {layer: list(range(48)) for layer in range(3)}
    assert table.layers == {layer: float(p[-3 + layer]) for layer in range(3)}
