"""Tiny LLaMA-family checkpoints for the vLLM export tests (`export --vllm`).

vLLM's CPU attention takes head sizes from 32 up, so these models have head_dim 32 (the GGUF
tests' models have 16); otherwise they are those (tests/support/gguf_models.py's tiny_llama:
its layers, weights and byte-level BPE tokenizer).
"""

from __future__ import annotations

import torch
import transformers as T

from tests.support.gguf_models import tiny_llama

# vLLM's nemotron-nas shape: every kept layer 4 query heads; layer 0 keeps KV groups 0 and 1
# (2 KV heads, 256 FFN neurons), layer 1 is dropped, layer 2 keeps one query head of each of its
# 4 groups (4 KV heads) and 128 neurons, layer 3 keeps groups 0 and 2 and 173 neurons (a width
# DeciLM's ffn_mult could not state).
NAS = (
    {0: [4, 5, 6, 7], 2: [1, 3, 5, 7], 3: [2, 3, 6, 7]},
    [1],
    {2: list(range(0, 256, 2)), 3: list(range(3, 86))},
)
# Query heads differ per layer (layer 0 keeps 4, layer 2 all 8): llama.cpp's deci loads it, vLLM cannot.
UNEVEN_QUERY = ({0: [4, 5, 6, 7]}, [], {})


def tiny_llama32(cls=T.LlamaForCausalLM, config_cls=T.LlamaConfig, **config) -> torch.nn.Module:
    """The GGUF tests' tiny LLaMA at head_dim 32 (hidden 128, FFN 256)."""
    return tiny_llama(cls, config_cls, hidden_size=128, head_dim=32, intermediate_size=256, **config)
