"""The analytic FLOP model against a direct count on a real forward pass.

Forward hooks on every nn.Linear / Conv1D count multiply-accumulates as
in_features x out_features x rows actually processed; the attention score term
(QK^T and AV) is added analytically. Both must agree with cost.flops_per_token, for
every family, unpruned and after heads and a layer were removed.
"""

import pytest
import torch
from torch import nn

from headprune_cli.model.arch import adapter_for
from headprune_cli.model.cost import cost_table, flops_per_token
from headprune_cli.model.cost_table import predict
from headprune_cli.model.layout import info_of
from headprune_cli.model.surgery import apply_plan
from tests.support import CAUSAL, TINY, VOCAB, counted_macs

SEQ = 6


def _direct_flops_per_token(name: str, model: nn.Module) -> tuple[float, int]:
    if name == "vit":
        inputs = {"pixel_values": torch.randn(1, 3, 16, 16)}
        seq = (16 // 8) ** 2 + 1  # patches + [CLS]
    else:
        inputs = {"input_ids": torch.randint(2, VOCAB, (1, SEQ))}
        seq = SEQ
    macs = counted_macs(model, inputs)
    # Attention scores and the weighted sum: 2 x head_dim MACs per (query, key) pair and
    # head; a causal query t sees t keys, (L + 1) / 2 on average.
    keys = (seq + 1) / 2 if name in CAUSAL else seq
    adapter = adapter_for(model)
    attention = sum(
        2 * adapter.attention(layer).num_heads * adapter.attention(layer).head_dim * keys
        for layer in adapter.layer_list(model)
    )
    return (2 * macs / seq) + 2 * attention, seq


@pytest.mark.parametrize("name", sorted(TINY))
def test_flops_match_a_direct_count(name):
    model = TINY[name]()
    direct, seq = _direct_flops_per_token(name, model)
    assert flops_per_token(model, seq) == pytest.approx(direct, rel=1e-9)


@pytest.mark.parametrize("name", sorted(TINY))
def test_flops_of_a_pruned_model_match_a_direct_count_and_the_prediction(name):
    model = TINY[name]()
    layout = info_of(model).layout
    group = layout.num_heads[0] // layout.num_kv_heads[0]
    remove_heads = {0: list(range(group)), 2: list(range(group))}  # one whole KV group each
    seq = (16 // 8) ** 2 + 1 if name == "vit" else SEQ
    table = cost_table(model, seq)
    kept = dict(zip(layout.layers, layout.heads))
    predicted = predict(table, kept, remove_heads, [1])
    apply_plan(model, remove_heads, [1])
    direct, _ = _direct_flops_per_token(name, model)
    assert flops_per_token(model, seq) == pytest.approx(direct, rel=1e-9)
    assert predicted["flops_per_token"] == pytest.approx(direct, rel=1e-9)
