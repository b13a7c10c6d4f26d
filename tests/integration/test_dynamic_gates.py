"""The dynamic-heads benchmark's machinery (scripts/benchmarks/dynamic_gates.py) on a tiny random
BERT classifier: the functional forward is the model's, skipping heads reproduces masking them,
nested widths share storage and reproduce the pruned checkpoints, and the gates learn."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers as T

from headprune_cli.model.surgery import apply_plan
from scripts.benchmarks import dynamic_gates as dg

HEADS, LAYERS = 4, 3


def tiny() -> T.BertForSequenceClassification:
    torch.manual_seed(0)
    config = T.BertConfig(
        vocab_size=50,
        hidden_size=32,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=48,
        num_labels=3,
    )
    model = T.BertForSequenceClassification(config).eval()
    with torch.no_grad():  # BERT's 0.02 init makes every head nearly irrelevant; heads should matter here
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.4)
    return model


def batch(rows: int, seq: int = 7, seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(rows, seq, dtype=torch.long)
    mask[0, seq - 2 :] = 0  # one padded row: the masks must matter
    return {"input_ids": torch.randint(1, 50, (rows, seq), generator=g), "attention_mask": mask}


def scores() -> list[list[float]]:
    return [[float((layer * 7 + h * 3) % 5) for h in range(HEADS)] for layer in range(LAYERS)]


def test_functional_forward_is_the_model():
    model = tiny()
    b = batch(3)
    with torch.no_grad():
        assert torch.allclose(dg.encode(dg.encoder_of(model), b), model(**b).logits, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 5])
def test_skipping_heads_equals_masking_them(rows):
    model = tiny()
    enc = dg.encoder_of(model)
    gates = dg.Gates(scores(), 32)
    with torch.no_grad():
        for net in gates.nets:  # input-dependent picks, so rows of one batch pick different subsets
            net.weight.normal_()
        comp = dg.compensation_vectors(enc, [batch(4, seed=2)])
        b = batch(rows)
        skip, masked = dg.gated_skip(enc, gates, comp, b, 2), dg.gated_masked(enc, gates, comp, b, 2)
        assert torch.allclose(skip, masked, atol=1e-5)
        # keeping every head is the full model (nothing skipped, nothing compensated)
        assert torch.allclose(dg.gated_skip(enc, gates, comp, b, HEADS), dg.encode(enc, b), atol=1e-5)
        assert not torch.allclose(skip, dg.encode(enc, b), atol=1e-3)


def test_untrained_gates_pick_the_static_top_k():
    enc = dg.encoder_of(tiny())
    gates = dg.Gates(scores(), 32)
    with torch.no_grad():
        x = dg.embed(enc, batch(2))
        for pos in range(LAYERS):
            picked = dg.top_k(gates(pos, x, batch(2)["attention_mask"]), 2)
            expected = sorted(sorted(range(HEADS), key=lambda h: -scores()[pos][h])[:2])
            assert picked.tolist() == [expected, expected]


def test_nested_width_views_share_storage_and_reproduce_pruned_models():
    model = tiny()
    kept = [[[1], [0, 2], [3]], [[1, 3], [0, 2, 3], [0, 3]], [list(range(HEADS))] * LAYERS]
    orders = dg.nested_orders(kept, HEADS)
    assert orders is not None
    assert all(set(order[: len(k)]) == set(k) for width in kept for order, k in zip(orders, width, strict=True))
    base = dg.reorder(dg.encoder_of(model), orders)
    b = batch(3)
    with torch.no_grad():
        assert torch.allclose(dg.encode(base, b), model(**b).logits, atol=1e-5)
        for width in kept[:-1]:
            small = copy.deepcopy(model)
            apply_plan(small, {i: sorted(set(range(HEADS)) - set(k)) for i, k in enumerate(width)}, [])
            view = dg.width_view(base, orders, dg.encoder_of(small))
            assert torch.allclose(dg.encode(view, b), small(**b).logits, atol=1e-5)
            assert all(v.qkv.data_ptr() == f.qkv.data_ptr() for v, f in zip(view.layers, base.layers, strict=True))


def test_widths_that_are_not_nested_have_no_order():
    assert dg.nested_orders([[[0]], [[1, 2]], [[0, 1, 2]]], 3) is None


def test_training_moves_the_gates_and_lowers_the_kd_loss():
    enc = dg.encoder_of(tiny())
    data = [batch(4, seed=s) for s in range(6)]
    with torch.no_grad():
        teacher = [dg.encode(enc, b) for b in data]
        comp = dg.compensation_vectors(enc, data)
    gates = dg.Gates(scores(), 32)
    start = copy.deepcopy(gates.state_dict())
    history = dg.train_gates(enc, gates, comp, data, teacher, 2, 8, 5e-2, 0)
    assert history[-1] < history[0]
    assert any(not torch.equal(start[k], v) for k, v in gates.state_dict().items())


@pytest.mark.parametrize("keep", [5, 4.5, 0])
def test_a_gate_budget_outside_the_head_count_is_refused(keep):
    with pytest.raises(ValueError, match="gate budget"):
        dg.check_budget(keep, HEADS)


def test_router_threshold_meets_the_budget():
    p = torch.tensor([[0.9, 0.95, 1.0], [0.2, 0.6, 1.0], [0.1, 0.3, 1.0], [0.8, 0.9, 1.0]])
    cost = [2, 4, 8]
    for budget in (2.0, 3.0, 5.0, 8.0):
        t = dg.threshold_for(p, cost, budget)
        assert float(torch.tensor(cost, dtype=torch.float)[dg.choose(p, t)].mean()) <= budget
    assert dg.choose(p, dg.threshold_for(p, cost, 8.0)).tolist() == [2, 2, 2, 2]  # budget for all: the widest
