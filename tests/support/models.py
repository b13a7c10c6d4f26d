"""Tiny random models of every family, built from configs (no downloads), and what tests do with them."""

from __future__ import annotations

import functools

import torch
import transformers as T
from torch import nn

from headprune_cli.model.arch import ReferenceConfig, ReferenceEncoder, adapter_for
from headprune_cli.model.layout import info_of
from headprune_cli.model.surgery import apply_plan

VOCAB = 60


def _seeded(build):
    def make():
        torch.manual_seed(0)
        model = build()
        model.eval()
        return model

    return make


# name -> factory. Causal LMs and GQA variants included; every config is tiny.
TINY = {
    "reference": _seeded(
        lambda: ReferenceEncoder(
            ReferenceConfig(
                vocab_size=VOCAB, heads_per_layer=[4, 3, 4], hidden_size=32, head_dim=8, intermediate_size=48
            )
        )
    ),
    "bert": _seeded(
        lambda: T.BertForSequenceClassification(
            T.BertConfig(
                vocab_size=VOCAB,
                hidden_size=32,
                num_hidden_layers=3,
                num_attention_heads=4,
                intermediate_size=48,
                num_labels=3,
            )
        )
    ),
    "roberta": _seeded(
        lambda: T.RobertaModel(
            T.RobertaConfig(
                vocab_size=VOCAB,
                hidden_size=32,
                num_hidden_layers=3,
                num_attention_heads=4,
                intermediate_size=48,
                pad_token_id=1,
            )
        )
    ),
    "electra": _seeded(
        lambda: T.ElectraModel(
            T.ElectraConfig(
                vocab_size=VOCAB,
                embedding_size=32,
                hidden_size=32,
                num_hidden_layers=3,
                num_attention_heads=4,
                intermediate_size=48,
            )
        )
    ),
    "distilbert": _seeded(
        lambda: T.DistilBertForSequenceClassification(
            T.DistilBertConfig(vocab_size=VOCAB, dim=32, n_layers=3, n_heads=4, hidden_dim=48)
        )
    ),
    "gpt2": _seeded(
        lambda: T.GPT2LMHeadModel(
            T.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=3, n_head=4, bos_token_id=0, eos_token_id=0)
        )
    ),
    "llama": _seeded(
        lambda: T.LlamaForCausalLM(
            T.LlamaConfig(
                vocab_size=VOCAB,
                hidden_size=32,
                num_hidden_layers=3,
                num_attention_heads=4,
                num_key_value_heads=4,
                intermediate_size=48,
                bos_token_id=0,
                eos_token_id=0,
                pad_token_id=0,
            )
        )
    ),
    "llama-gqa": _seeded(
        lambda: T.LlamaForCausalLM(
            T.LlamaConfig(
                vocab_size=VOCAB,
                hidden_size=32,
                num_hidden_layers=3,
                num_attention_heads=8,
                num_key_value_heads=2,
                head_dim=4,
                intermediate_size=48,
                bos_token_id=0,
                eos_token_id=0,
                pad_token_id=0,
            )
        )
    ),
    "mistral": _seeded(
        lambda: T.MistralForCausalLM(
            T.MistralConfig(
                vocab_size=VOCAB,
                hidden_size=32,
                num_hidden_layers=3,
                num_attention_heads=4,
                num_key_value_heads=2,
                intermediate_size=48,
                bos_token_id=0,
                eos_token_id=0,
                pad_token_id=0,
            )
        )
    ),
    "qwen2": _seeded(
        lambda: T.Qwen2ForCausalLM(
            T.Qwen2Config(
                vocab_size=VOCAB,
                hidden_size=32,
                num_hidden_layers=3,
                num_attention_heads=4,
                num_key_value_heads=2,
                intermediate_size=48,
                bos_token_id=0,
                eos_token_id=0,
                pad_token_id=0,
            )
        )
    ),
    "qwen3": _seeded(
        lambda: T.Qwen3ForCausalLM(
            T.Qwen3Config(
                vocab_size=VOCAB,
                hidden_size=32,
                num_hidden_layers=3,
                num_attention_heads=8,
                num_key_value_heads=2,
                head_dim=8,
                intermediate_size=48,
                bos_token_id=0,
                eos_token_id=0,
                pad_token_id=0,
            )
        )
    ),
    "vit": _seeded(
        lambda: T.ViTModel(
            T.ViTConfig(
                hidden_size=32,
                num_hidden_layers=3,
                num_attention_heads=4,
                intermediate_size=48,
                image_size=16,
                patch_size=8,
            )
        )
    ),
}
CAUSAL = ("gpt2", "llama", "llama-gqa", "mistral", "qwen2", "qwen3")


@functools.cache
def _example_model(name: str):
    """One tiny `name` model to ask for inputs; built without moving the global RNG."""
    with torch.random.fork_rng(devices=[]):
        return TINY[name]()


def model_inputs(name: str, batch: int = 2, seq: int = 7) -> dict:
    """The family adapter's example inputs for the tiny `name` models: token ids from 2 up
    (below them: padding and special tokens), and padding in one row so the mask path runs."""
    model = _example_model(name)
    return adapter_for(model).example_inputs(model, batch, seq, seed=1, first_token=2, pad_first_row=True)


def model_output(model, inputs: dict) -> torch.Tensor:
    with torch.no_grad():
        out = model(**inputs)
    return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state


# Uneven heads per layer and a dropped layer, in original indices, per family.
PLANS = {
    "reference": ({0: [1], 2: [0, 3]}, [1]),
    "bert": ({0: [0, 2], 2: [3]}, [1]),
    "distilbert": ({0: [1, 2, 3], 1: [0]}, [2]),
    "vit": ({1: [2], 2: [0, 1]}, [0]),
    "gpt2": ({0: [3], 2: [0, 1]}, [1]),
    "llama-gqa": ({0: [0, 1, 2, 3], 2: [0, 4]}, [1]),  # a whole GQA group; one query head per group
}


def pruned(name: str):
    """The tiny `name` model with PLANS[name] removed physically."""
    model = TINY[name]()
    remove_heads, remove_layers = PLANS[name]
    return apply_plan(model, remove_heads, remove_layers)


def with_biases(model):
    """`model` with every Linear bias drawn at random: a trained model's biases are not the zeros
    a fresh BERT starts from, and compensation must carry them."""
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Linear) and module.bias is not None:
                module.bias.copy_(0.2 * torch.randn(module.bias.shape, generator=generator))
    return model


def calibration(n_batches: int, seed: int, batch: int = 16, seq: int = 12) -> list[dict]:
    """Token batches for compensation, with padding in every fourth row."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_batches):
        ids = torch.randint(2, VOCAB, (batch, seq), generator=gen)
        mask = torch.ones_like(ids)
        mask[::4, -4:] = 0
        out.append({"input_ids": ids, "attention_mask": mask})
    return out


def counted_macs(model: nn.Module, inputs: dict) -> int:
    """Multiply-accumulates of every nn.Linear / Conv1D in one forward pass of `inputs`."""
    total = 0

    def hook(module, args, output):
        nonlocal total
        x = args[0]
        if type(module).__name__ == "Conv1D":
            fan_in, fan_out = module.weight.shape
        else:
            fan_out, fan_in = module.weight.shape
        total += fan_in * fan_out * (x.numel() // fan_in)

    handles = [
        m.register_forward_hook(hook)
        for m in model.modules()
        if isinstance(m, nn.Linear) or type(m).__name__ == "Conv1D"
    ]
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        for handle in handles:
            handle.remove()
    return total


def plan_for(name: str) -> dict[int, list[int]]:
    """Heads to remove that respect each family's rules (whole KV groups for GQA)."""
    if name == "llama-gqa":
        return {0: [0, 1, 2, 3], 2: [4, 5, 6, 7]}
    if name in ("mistral", "qwen2"):
        return {0: [2, 3]}
    if name == "qwen3":
        return {1: [0, 1, 2, 3]}
    return {0: [1], 2: [0, 2]}


FFN_WIDTH = 48  # every TINY model's FFN width, but GPT-2's (4 x 32)


def width_of(family: str) -> int:
    return 128 if family == "gpt2" else FFN_WIDTH


def ffn_plan(family: str) -> dict[int, list[int]]:
    """Uneven cuts: layer 0 loses a scattered third, layer 2 a block and the last neuron."""
    w = width_of(family)
    return {0: list(range(1, w, 3)), 2: [*range(5, 17), w - 1]}


def gqa_plan(model) -> tuple[dict, list]:
    """Remove the first KV group of layer 0 and the last of layer 2, and drop layer 1."""
    layout = info_of(model).layout
    group = layout.num_heads[0] // layout.num_kv_heads[0]
    return {0: list(range(group)), 2: list(range(layout.num_heads[2] - group, layout.num_heads[2]))}, [1]
