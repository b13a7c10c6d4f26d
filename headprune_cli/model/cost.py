"""Parameters and FLOPs per token: counted on a model, and predicted for a plan.

FLOPs are 2 x multiply-accumulates of every Linear/Conv1D a token passes through, plus
the attention term (QK^T and AV: 4 x head_dim x keys per head). Keys per token are the
sequence length for an encoder and (L + 1) / 2 on average for a causal model. Layers
that run once per sequence (pooler, classifier) are divided by the sequence length.

The cost is linear in heads, so a `CostTable` (fixed parts + a price per query head and
per key/value head of each layer, in cost_table.py) predicts any plan exactly without
touching the model.
"""

from __future__ import annotations

from torch import nn

from headprune_cli.model.arch import adapter_for
from headprune_cli.model.arch.base import is_conv1d
from headprune_cli.model.cost_table import CostTable, LayerCost
from headprune_cli.model.layout import info_of

PER_SEQUENCE_MODULES = ("pooler", "classifier", "pre_classifier", "score")


def _is_linear(module: nn.Module) -> bool:
    return isinstance(module, nn.Linear) or is_conv1d(module)


def _macs(module: nn.Module) -> int:
    return module.weight.numel()


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def keys_per_token(model: nn.Module, seq_len: int) -> float:
    return (seq_len + 1) / 2 if info_of(model).task == "causal-lm" else float(seq_len)


def linear_flops(model: nn.Module, seq_len: int, skip: set[int] = frozenset()) -> float:
    """2 x MACs per token of every linear layer not in `skip` (ids of modules)."""
    total = 0.0
    for name, module in model.named_modules():
        if not _is_linear(module) or id(module) in skip:
            continue
        per_sequence = any(part in PER_SEQUENCE_MODULES for part in name.split("."))
        total += 2 * _macs(module) / (seq_len if per_sequence else 1)
    return total


def flops_per_token(model: nn.Module, seq_len: int) -> float:
    adapter = adapter_for(model)
    keys = keys_per_token(model, seq_len)
    attention = 0.0
    for layer in adapter.layer_list(model):
        view = adapter.attention(layer)
        attention += 4 * view.num_heads * view.head_dim * keys
    return linear_flops(model, seq_len) + attention


def cost_table(model: nn.Module, seq_len: int) -> CostTable:
    adapter = adapter_for(model)
    layout = info_of(model).layout
    keys = keys_per_token(model, seq_len)
    layers, inside_params, inside_flops = [], 0, 0.0
    for pos, block in enumerate(adapter.layer_list(model)):
        view = adapter.attention(block)
        block_params = count_params(block)
        block_flops = linear_flops(block, seq_len)
        q_parts = [view.fused_qkv] if view.fused_qkv is not None else [view.q]
        kv_parts = [] if view.fused_qkv is not None else [view.k, view.v]
        q_params = (sum(count_params(m) for m in q_parts) + view.o.weight.numel()) / view.num_heads
        q_flops = 2 * (sum(_macs(m) for m in q_parts) + _macs(view.o)) / view.num_heads + 4 * view.head_dim * keys
        kv_params = sum(count_params(m) for m in kv_parts) / view.num_kv_heads
        kv_flops = 2 * sum(_macs(m) for m in kv_parts) / view.num_kv_heads
        attn_params = q_params * view.num_heads + kv_params * view.num_kv_heads
        attn_flops = q_flops * view.num_heads + kv_flops * view.num_kv_heads
        layer = layout.layers[pos]
        layers.append(
            LayerCost(
                layer=layer,
                fixed_params=int(round(block_params - attn_params)),
                fixed_flops=block_flops + 4 * view.num_heads * view.head_dim * keys - attn_flops,
                q_head_params=q_params,
                q_head_flops=q_flops,
                kv_head_params=kv_params,
                kv_head_flops=kv_flops,
                group_size=layout.num_heads[layer] // layout.num_kv_heads[layer],
            )
        )
        inside_params += block_params
        inside_flops += block_flops
    return CostTable(
        seq_len=seq_len,
        outside_params=count_params(model) - inside_params,
        outside_flops=linear_flops(model, seq_len) - inside_flops,
        layers=layers,
    )
