"""Tiny LLaMA-family checkpoints for the vLLM export tests (`export --vllm`).

vLLM's CPU attention takes head sizes from 32 up, so these models have head_dim 32 (the GGUF
tests' models have 16); the tokenizer is theirs (byte-level BPE from tests/support/gguf_models.py).
"""

from __future__ import annotations

import torch
import transformers as T

from headprune_cli.model.layout import info_of
from tests.support.gguf_models import VOCAB, bpe_tokenizer

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


def tiny_llama32(cls=T.LlamaForCausalLM, config_cls=T.LlamaConfig, **extra) -> torch.nn.Module:
    torch.manual_seed(0)
    config = config_cls(
        vocab_size=VOCAB,
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=32,
        intermediate_size=256,
        max_position_embeddings=256,
        rope_theta=10000.0,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
        **extra,
    )
    model = cls(config).eval()
    with torch.no_grad():  # weights of a trained scale, so logits differ visibly between tokens
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0, 0.08)
            elif name.endswith("bias"):
                p.normal_(0, 0.05)
    info = info_of(model)
    info.tokenizer = bpe_tokenizer().to_str()
    info.tokenizer_config = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}
    return model
