"""What `inspect` shows: a plain dict describing a checkpoint's model."""

from __future__ import annotations

from torch import nn

from headprune_cli.model.cost import count_params, flops_per_token, kv_cache_bytes
from headprune_cli.model.layout import info_of


def describe(model: nn.Module, seq_len: int = 128) -> dict:
    info = info_of(model)
    layout = info.layout
    return {
        "family": info.family,
        "architecture": info.architecture,
        "model_type": info.config.get("model_type"),
        "task": info.task,
        "num_layers": len(layout.layers),
        "original_num_layers": layout.num_layers,
        "layers": list(layout.layers),
        "heads": {str(layer): heads for layer, heads in zip(layout.layers, layout.heads)},
        "kv_heads": {str(layer): kv for layer, kv in zip(layout.layers, layout.kv_heads)},
        "original_heads": sum(layout.num_heads),
        "kept_heads": sum(len(h) for h in layout.heads),
        "ffn": {str(layer): layout.ffn_width(layer) for layer in layout.layers},
        "original_ffn": {str(layer): width for layer, width in enumerate(layout.num_ffn)},
        "params": count_params(model),
        "seq_len": seq_len,
        "flops_per_token": flops_per_token(model, seq_len),
        "kv_cache": _kv_cache(model),
        "tokenizer": info.tokenizer is not None,
        "pooling": info.pooling or None,
        "provenance": info.provenance,
    }


def _kv_cache(model: nn.Module) -> dict | None:
    """KV-cache bytes per token (per kept layer, total, dtype); None for an encoder."""
    kv = kv_cache_bytes(model)
    if kv is None:
        return None
    return {
        "dtype": kv["dtype"],
        "per_layer": {str(layer): n for layer, n in kv["per_layer"].items()},
        "total": kv["total"],
    }
