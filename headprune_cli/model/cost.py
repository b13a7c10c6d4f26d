"""Parameters and FLOPs per token: counted on a model, and predicted for a plan.

FLOPs are 2 x multiply-accumulates of every Linear/Conv1D a token passes through, plus
the attention term (QK^T and AV: 4 x head_dim x keys per head). Keys per token are the
sequence length for an encoder and (L + 1) / 2 on average for a causal model. Layers
that run once per sequence (pooler, classifier) are divided by the sequence length.

The cost is linear in heads and FFN neurons, so a `CostTable` (fixed parts + a price per
query head, per key/value head and, when asked, per FFN neuron of each layer, in
cost_table.py) predicts any plan exactly without touching the model.

Serving a causal LM has two phases with different costs (bottom of this file): prefill
(the prompt, compute-bound: FLOPs) and decode (one token per step, bound by the bytes
it reads: every weight once per step, shared by the batch, plus each sequence's KV cache).
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet

from torch import nn

from headprune_cli.model.arch import adapter_for
from headprune_cli.model.arch.base import AttentionView, HFModule, is_conv1d
from headprune_cli.model.cost_table import CostTable, LayerCost
from headprune_cli.model.layout import info_of

PER_SEQUENCE_MODULES = ("pooler", "classifier", "pre_classifier", "score")


def _is_linear(module: nn.Module) -> bool:
    return isinstance(module, nn.Linear) or is_conv1d(module)


def _macs(module: HFModule) -> int:
    return module.weight.numel()


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def keys_per_token(model: nn.Module, seq_len: int) -> float:
    return (seq_len + 1) / 2 if info_of(model).task == "causal-lm" else float(seq_len)


def linear_flops(model: nn.Module, seq_len: int, skip: AbstractSet[int] = frozenset()) -> float:
    """2 x MACs per token of every linear layer not in `skip` (ids of modules)."""
    total = 0.0
    for name, module in model.named_modules():
        if not _is_linear(module) or id(module) in skip:
            continue
        per_sequence = any(part in PER_SEQUENCE_MODULES for part in name.split("."))
        total += 2 * _macs(module) / (seq_len if per_sequence else 1)
    return total


def attention_flops(model: nn.Module, keys: float) -> float:
    """QK^T and AV of one query token against `keys` keys, summed over the kept heads."""
    adapter = adapter_for(model)
    return sum(4 * view.num_heads * view.head_dim * keys for view in map(adapter.attention, adapter.layer_list(model)))


def flops_per_token(model: nn.Module, seq_len: int) -> float:
    return linear_flops(model, seq_len) + attention_flops(model, keys_per_token(model, seq_len))


def cost_table(model: nn.Module, seq_len: int, ffn: bool = False) -> CostTable:
    """The model's cost table; `ffn` also prices each layer's FFN neurons (otherwise the
    FFN is part of the layer's fixed cost, and the table's dict is what it always was)."""
    adapter = adapter_for(model)
    layout = info_of(model).layout
    keys = keys_per_token(model, seq_len)
    layers, inside_params, inside_flops = [], 0, 0.0
    for pos, block in enumerate(adapter.layer_list(model)):
        view = adapter.attention(block)
        block_params = count_params(block)
        block_flops = linear_flops(block, seq_len)
        q_parts, kv_parts = _projections(view)
        q_params = (sum(count_params(m) for m in q_parts) + view.o.weight.numel()) / view.num_heads
        q_flops = 2 * (sum(_macs(m) for m in q_parts) + _macs(view.o)) / view.num_heads + 4 * view.head_dim * keys
        kv_params = sum(count_params(m) for m in kv_parts) / view.num_kv_heads
        kv_flops = 2 * sum(_macs(m) for m in kv_parts) / view.num_kv_heads
        attn_params = q_params * view.num_heads + kv_params * view.num_kv_heads
        attn_flops = q_flops * view.num_heads + kv_flops * view.num_kv_heads
        layer = layout.layers[pos]
        prices = _ffn_prices(adapter.ffn(block)) if ffn else {}
        ffn_params = prices.get("ffn_width", 0) * prices.get("ffn_neuron_params", 0.0)
        ffn_flops = prices.get("ffn_width", 0) * prices.get("ffn_neuron_flops", 0.0)
        layers.append(
            LayerCost(
                layer=layer,
                fixed_params=int(round(block_params - attn_params - ffn_params)),
                fixed_flops=block_flops + 4 * view.num_heads * view.head_dim * keys - attn_flops - ffn_flops,
                q_head_params=q_params,
                q_head_flops=q_flops,
                kv_head_params=kv_params,
                kv_head_flops=kv_flops,
                group_size=layout.num_heads[layer] // layout.num_kv_heads[layer],
                **prices,
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


def _ffn_prices(view) -> dict:
    """One neuron: a row (and bias entry) of every up/gate projection, a column of down."""
    params = sum(count_params(up) for up in view.ups) + view.down.weight.numel()
    flops = 2 * (sum(_macs(up) for up in view.ups) + _macs(view.down))
    return {"ffn_width": view.width, "ffn_neuron_params": params / view.width, "ffn_neuron_flops": flops / view.width}


# --- serving a causal LM: KV cache, prefill, decode ----------------------------------
# transformers' DynamicCache appends a step's keys/values with torch.cat, which reads the
# whole cache and writes it anew; attention then reads it once more: three passes.
KV_CACHE_PASSES = 3


def kv_cache_bytes(model: nn.Module) -> dict | None:
    """KV-cache bytes per token of a causal LM, per kept layer (original index) and in total.

    A layer caches one key and one value vector per kept key/value head for every token:
    kv_heads x head_dim x 2 x bytes of the model's dtype (GQA: the K/V heads, not the
    query heads). Encoders keep no cache: None.
    """
    if info_of(model).task != "causal-lm":
        return None
    adapter = adapter_for(model)
    per_layer = {}
    for layer, block in zip(info_of(model).layout.layers, adapter.layer_list(model)):
        view = adapter.attention(block)
        per_layer[layer] = view.num_kv_heads * view.head_dim * 2 * view.o.weight.element_size()
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    return {"dtype": dtype, "per_layer": per_layer, "total": sum(per_layer.values())}


def _output_head(model: nn.Module) -> nn.Module | None:
    getter = getattr(model, "get_output_embeddings", None)
    head = getter() if getter is not None else None
    return head if head is not None and _is_linear(head) else None


def prefill_flops(model: nn.Module, prompt: int) -> float:
    """FLOPs of one sequence's prefill: every layer for each of the `prompt` tokens (causal
    attention over (prompt + 1) / 2 keys on average), the output head once (a server keeps
    only the last position's logits)."""
    head = _output_head(model)
    skip = {id(head)} if head is not None else set()
    per_token = linear_flops(model, prompt, skip) + attention_flops(model, keys_per_token(model, prompt))
    return prompt * per_token + (2 * _macs(head) if head is not None else 0.0)


def weight_bytes(model: nn.Module) -> int:
    """Bytes of every Linear/Conv1D parameter: what one decode step reads whatever the batch
    (embedding tables are only indexed, a few rows per step, and left out)."""
    params = {}
    for module in model.modules():
        if _is_linear(module):
            params.update({id(p): p for p in module.parameters(recurse=False)})
    return sum(p.numel() * p.element_size() for p in params.values())


def _projections(view: AttentionView) -> tuple[list[HFModule], list[HFModule]]:
    """The query-side and the key/value-side projections of a layer (a fused QKV counts as query-side)."""
    if view.fused_qkv is not None:
        return [view.fused_qkv], []
    assert view.q is not None and view.k is not None and view.v is not None  # unfused: the adapter sets all three
    return [view.q], [view.k, view.v]


def decode_cost(model: nn.Module, prompt: int, tokens: int, batch: int) -> dict:
    """Cost per generated token of `tokens` decode steps after a `prompt`-token prefill, batch `batch`.

    Step i (0-based) feeds one token per sequence and attends to prompt + i + 1 keys, so the
    mean context is prompt + (tokens + 1) / 2. Bytes per token = weight bytes / batch (the
    weights are read once per step for the whole batch) + KV_CACHE_PASSES x KV bytes per
    token x mean context (each sequence's cache). The decode prediction is the ratio of
    these bytes: decode on a CPU or GPU at small batch waits on memory, not arithmetic.
    """
    kv = kv_cache_bytes(model)
    assert kv is not None, "decode cost is a causal LM's (report asks it of no encoder)"
    keys = prompt + (tokens + 1) / 2
    weights = weight_bytes(model)
    kv_read = KV_CACHE_PASSES * kv["total"] * keys
    return {
        "flops_per_token": linear_flops(model, 1) + attention_flops(model, keys),
        "weight_bytes_per_step": weights,
        "kv_bytes_per_token": kv_read,
        "bytes_per_token": weights / batch + kv_read,
    }
