"""Tiny LLaMA-family checkpoints with a byte-level BPE tokenizer, for the GGUF export tests.

The tokenizer is trained by `tokenizers` on the shipped example text (the kind of tokenizer
llama.cpp reproduces: GPT-2's byte-level BPE, with a BOS template like the trained LM's). Widths
are multiples of 32 where a quantized type needs whole blocks; the non-uniform cut leaves one FFN
width off that grid on purpose.
"""

from __future__ import annotations

from pathlib import Path

import torch
import transformers as T

import headprune_cli
from headprune_cli.model.layout import info_of
from headprune_cli.model.surgery import apply_plan

ROOT = Path(__file__).resolve().parents[2]
TEXT = ROOT / "examples" / "minilm_text.txt"
SPECIALS = ["<pad>", "<s>", "</s>"]
VOCAB = 320
# Non-uniform: layer 0 keeps 2 of 4 KV groups (4 query heads), layer 1 is dropped, layer 2 keeps
# its heads but 64 of 128 FFN neurons, layer 3 keeps 3 KV groups (6 query heads) and 83 neurons
# (not a multiple of 32: a quantized type keeps those matrices in f16).
NON_UNIFORM = (
    {0: [0, 1, 2, 3], 3: [6, 7]},
    [1],
    {2: list(range(0, 128, 2)), 3: list(range(3, 48))},
)
# NON_UNIFORM with layer 3 at 96 FFN neurons: every width on the 32-grid, so q8_0/q4_0 exports take it
# (83 neurons are refused by a quantized export: gguf_grid.py).
NON_UNIFORM_GRID = (NON_UNIFORM[0], NON_UNIFORM[1], {**NON_UNIFORM[2], 3: list(range(3, 35))})
# Uniform: every layer keeps 3 of 4 KV groups and 96 FFN neurons; layer 2 is dropped.
UNIFORM = (
    {layer: [2, 3] for layer in (0, 1, 3)},
    [2],
    {layer: list(range(96, 128)) for layer in (0, 1, 3)},
)

# One RoPE setting of each type the exports write, for tests against transformers' own frequencies.
ROPES = {
    "default": {"rope_type": "default", "rope_theta": 5000.0},
    "linear": {"rope_type": "linear", "rope_theta": 5000.0, "factor": 4.0},
    # original_max_position_embeddings 64 puts head_dim 16's wavelengths on all three llama3 branches
    # (kept: 6.3, smoothed: 19.9 and 62.8, divided by the factor: 199 and beyond).
    "llama3": {
        "rope_type": "llama3",
        "rope_theta": 10000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    },
}


def bpe_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(TEXT.read_text(encoding="utf-8").splitlines(), trainer=trainer)
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return tokenizer


def tiny_llama(cls=T.LlamaForCausalLM, config_cls=T.LlamaConfig, **config) -> torch.nn.Module:
    """4 layers, 8 query heads in 4 KV groups of head_dim 16, FFN 128, weights of a trained scale and
    the BPE tokenizer; `config` adds to the config's fields or replaces them (vllm_models' widths)."""
    torch.manual_seed(0)
    shape = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=16,
        intermediate_size=128,
        max_position_embeddings=256,
        rope_theta=10000.0,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    model = cls(config_cls(**(shape | config))).eval()
    with torch.no_grad():  # weights of a trained scale, so logits differ visibly between tokens
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0, 0.08)
            elif name.endswith("bias"):  # Qwen2's q/k/v biases: nonzero, so their permutation shows
                p.normal_(0, 0.05)
    info = info_of(model)
    info.tokenizer = bpe_tokenizer().to_str()
    info.tokenizer_config = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}
    return model


def write_checkpoint(path: Path, plan=None, model=None) -> Path:
    """The tiny LLaMA (or `model`) cut by `plan` (heads, layers, FFN neurons), saved at `path`."""
    model = tiny_llama() if model is None else model
    if plan is not None:
        apply_plan(model, *plan)
    headprune_cli.save(model, path)
    return path
