"""What each family's adapter says about its models, checked against what the models do:
example inputs run, the positions a forward covers, head size, KV cache, explicit head_dim."""

from __future__ import annotations

import pytest
import torch
import transformers as T

from headprune_cli.model.arch import ADAPTERS, adapter_for
from headprune_cli.model.arch.base import hidden_states_in
from tests.support import TINY


def _attention_positions(model, inputs: dict) -> tuple[int, int]:
    """(rows, positions) that the first layer's attention output projection really saw."""
    adapter = adapter_for(model)
    seen = []
    o = adapter.attention(adapter.layer_list(model)[0]).o
    handle = o.register_forward_pre_hook(lambda module, args: seen.append(tuple(args[0].shape[:2])))
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        handle.remove()
    return seen[0]


@pytest.mark.parametrize("name", sorted(TINY))
def test_example_inputs_run_and_cover_the_stated_positions(name):
    model = TINY[name]()
    adapter = adapter_for(model)
    inputs = adapter.example_inputs(model, 3, 6, seed=4, first_token=2, pad_first_row=True)
    assert _attention_positions(model, inputs) == (3, adapter.sequence_length(model, 6))
    again = adapter.example_inputs(model, 3, 6, seed=4, first_token=2, pad_first_row=True)
    assert all(torch.equal(inputs[k], again[k]) for k in inputs)  # seeded: the same inputs twice
    if "input_ids" in inputs:
        assert int(inputs["input_ids"].min()) >= 2 and int(inputs["input_ids"].max()) < model.config.vocab_size
        assert inputs["attention_mask"].sum(-1).tolist() == [4, 6, 6]  # the first row's last two are padding


def test_vit_positions_are_the_patches_and_cls_whatever_was_asked():
    model = TINY["vit"]()
    adapter = adapter_for(model)
    assert adapter.sequence_length(model, 999) == (16 // 8) ** 2 + 1
    assert adapter.max_positions(model) is None


@pytest.mark.parametrize("name", sorted(TINY))
def test_head_dim_is_the_width_of_one_head_in_the_weights(name):
    model = TINY[name]()
    adapter = adapter_for(model)
    view = adapter.attention(adapter.layer_list(model)[0])
    width = view.o.weight.shape[0] if type(view.o).__name__ == "Conv1D" else view.o.weight.shape[1]
    assert adapter.head_dim(model) * view.num_heads == width


@pytest.mark.parametrize("name", sorted(TINY))
def test_keeps_kv_cache_is_whether_the_forward_returns_one(name):
    model = TINY[name]()
    adapter = adapter_for(model)
    with torch.no_grad():
        out = model(**adapter.example_inputs(model, 1, 4), use_cache=True)
    assert adapter.keeps_kv_cache == (getattr(out, "past_key_values", None) is not None)


# The family's transformers config, asked for heads narrower than hidden / heads. Not ViT:
# transformers 5's ViT attention reads an undeclared `head_dim` through getattr, which
# headprune does not rely on (its ViT exports keep headprune's weights file when heads go).
CONFIGS = {
    "bert": lambda: T.BertModel(
        T.BertConfig(
            vocab_size=60, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=48, head_dim=4
        )
    ),
    "distilbert": lambda: T.DistilBertModel(
        T.DistilBertConfig(vocab_size=60, dim=32, n_layers=1, n_heads=4, hidden_dim=48, head_dim=4)
    ),
    "gpt2": lambda: T.GPT2Model(T.GPT2Config(vocab_size=60, n_embd=32, n_layer=1, n_head=4, head_dim=4)),
    "llama": lambda: T.LlamaModel(
        T.LlamaConfig(
            vocab_size=60,
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=4,
            intermediate_size=48,
            head_dim=4,
        )
    ),
    "gemma3": lambda: T.Gemma3ForCausalLM(
        T.Gemma3TextConfig(
            vocab_size=60,
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=1,
            intermediate_size=48,
            head_dim=4,
        )
    ),
}


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_explicit_head_dim_is_whether_the_config_can_state_it(family):
    model = CONFIGS[family]()
    adapter = ADAPTERS[family]
    assert adapter.explicit_head_dim == (adapter.head_dim(model) == 4), adapter.head_dim(model)
    assert CONFIGS.keys() == set(ADAPTERS) - {"reference", "vit"}  # every other transformers family is asked


# Post-norm families add each projection's output to its residual inside a LayerNorm's input.
_POST_NORM_SUMS = {
    "bert": ("attention.output.LayerNorm", "output.LayerNorm"),
    "roberta": ("attention.output.LayerNorm", "output.LayerNorm"),
    "electra": ("attention.output.LayerNorm", "output.LayerNorm"),
    "distilbert": ("sa_layer_norm", "output_layer_norm"),
}


def _first_input(module, seen: list):
    return module.register_forward_pre_hook(
        lambda m, args, kw: seen.append(hidden_states_in(args, kw).detach()), with_kwargs=True
    )


@pytest.mark.parametrize("name", sorted(TINY))
def test_residual_input_reads_the_stream_each_projection_is_added_to(name):
    """Compensation fits residual + projection output (Streams.statistics): in every family the
    module residual_input names must hold, as its input, exactly the stream that the projection's
    output is added to. Pre-norm: the FFN's residual is the attention's sum, the block's output the
    FFN's sum; post-norm: each sum is the input of the LayerNorm that follows the addition."""
    model = TINY[name]()
    adapter = adapter_for(model)
    block = adapter.layer_list(model)[1]
    seen: dict[str, list] = {k: [] for k in ("r_attn", "r_ffn", "o", "down", "out", "sum_attn", "sum_ffn")}
    hooks = [
        _first_input(adapter.residual_input(block, "attention"), seen["r_attn"]),
        _first_input(adapter.residual_input(block, "ffn"), seen["r_ffn"]),
        adapter.attention(block).o.register_forward_hook(lambda m, a, out: seen["o"].append(out)),
        adapter.ffn(block).down.register_forward_hook(lambda m, a, out: seen["down"].append(out)),
        block.register_forward_hook(lambda m, a, out: seen["out"].append(out[0] if isinstance(out, tuple) else out)),
    ]
    if name in _POST_NORM_SUMS:
        for key, path in zip(("sum_attn", "sum_ffn"), _POST_NORM_SUMS[name]):
            hooks.append(_first_input(block.get_submodule(path), seen[key]))
    inputs = adapter.example_inputs(model, 2, 6, seed=1, first_token=2)
    with torch.no_grad():
        model(**inputs)
    for hook in hooks:
        hook.remove()
    one = {k: v[0] for k, v in seen.items() if v}
    sum_attn, sum_ffn = (one["sum_attn"], one["sum_ffn"]) if name in _POST_NORM_SUMS else (one["r_ffn"], one["out"])
    torch.testing.assert_close(one["r_attn"] + one["o"], sum_attn)
    torch.testing.assert_close(one["r_ffn"] + one["down"], sum_ffn)
    assert name in _POST_NORM_SUMS or not torch.equal(one["r_ffn"], one["r_attn"])  # a distinct point of the block
