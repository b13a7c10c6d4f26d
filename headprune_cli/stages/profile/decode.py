"""The decode profile of a causal LM: one new token per sequence against a KV cache of
`context` tokens, as a server's decode step runs.

The block inputs are captured from a real decode step after a real prefill, so masks,
positions and rotary embeddings are the model's own. Each timed block variant then gets a
`FrozenCache` of its own shape: `context` cached keys and values for its kept KV heads,
which every call reads (the cached tensors joined with the new token's, as transformers'
DynamicCache does) and none grows, so the thousandth call costs what the first did.
"""

from __future__ import annotations

import torch
from torch import nn

from headprune_cli.model.arch import adapter_for
from headprune_cli.model.arch.base import hidden_states_in
from headprune_cli.stages.model_latency import cache_name, prefill, prompt_ids


class FrozenCache:
    """A one-layer KV cache that answers `update` as DynamicCache does, without storing."""

    is_compileable = False

    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        self.keys, self.values = keys, values

    def update(self, key_states, value_states, layer_idx=None, *args, **kwargs):
        return torch.cat([self.keys, key_states], dim=-2), torch.cat([self.values, value_states], dim=-2)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.keys.shape[-2]


def _is_cache(value) -> bool:
    return hasattr(value, "update") and hasattr(value, "get_seq_length")


def decode_inputs(model: nn.Module, batch: int, context: int, device) -> tuple[dict, dict]:
    """(the decode step's model inputs, the same for the rest: no cache, one token).

    The prefill's cache rides in the step's inputs; block_inputs then captures what the
    first block is given on that step."""
    ids = prompt_ids(model, batch, context + 1).to(device)
    with torch.inference_mode():
        cache, _ = prefill(model, ids[:, :context])
    step = {"input_ids": ids[:, context:], "use_cache": True, cache_name(model): cache}
    rest = {"input_ids": ids[:, context:], "use_cache": False}
    return step, rest


def frozen_call(model: nn.Module, context: int):
    """`call_args_for` of profile_phase for decode: every variant reads its own frozen cache."""
    adapter = adapter_for(model)

    def call_args_for(args: tuple, kwargs: dict):
        hidden = hidden_states_in(args, kwargs)

        def call(block: nn.Module):
            view = adapter.attention(block)
            shape = (hidden.shape[0], view.num_kv_heads, context, view.head_dim)
            gen = torch.Generator(device="cpu").manual_seed(0)
            cache = FrozenCache(*(torch.randn(shape, generator=gen).to(hidden.device, hidden.dtype) for _ in range(2)))
            a = tuple(cache if _is_cache(x) else x for x in args)
            k = {name: cache if _is_cache(x) else x for name, x in kwargs.items()}
            return lambda: block(*a, **k)

        return call

    return call_args_for
