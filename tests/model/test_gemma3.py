"""Gemma 3 (text) on a tiny random config: query heads inside its single KV group, FFN
neurons and layers (sliding-window and full) cut exactly, saved and reloaded."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import transformers

from headprune_cli import load, save
from headprune_cli.model.arch import adapter_for
from headprune_cli.model.arch.base import hidden_states_in
from headprune_cli.model.layout import info_of
from headprune_cli.model.surgery import HeadGates, apply_plan, removal_gates


@pytest.fixture
def gemma() -> transformers.Gemma3ForCausalLM:
    torch.manual_seed(0)
    config = transformers.Gemma3TextConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=16,
        sliding_window=4,  # shorter than the inputs: the sliding layers' mask matters
        max_position_embeddings=64,
        layer_types=["sliding_attention"] * 2 + ["full_attention"] + ["sliding_attention"] * 2 + ["full_attention"],
    )
    model = transformers.Gemma3ForCausalLM(config).eval()
    with torch.no_grad():  # random q/k norm weights, so a cut that touched them would show
        for layer in model.model.layers:
            layer.self_attn.q_norm.weight.normal_()
            layer.self_attn.k_norm.weight.normal_()
    return model


INPUTS = {"input_ids": torch.randint(0, 128, (2, 10), generator=torch.Generator().manual_seed(1))}


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(**INPUTS, use_cache=False).logits


def test_adapter_sees_one_kv_group_of_four_heads(gemma) -> None:
    view = adapter_for(gemma).attention(gemma.model.layers[0])
    assert (view.num_heads, view.num_kv_heads, view.head_dim) == (4, 1, 16)
    assert info_of(gemma).family == "gemma3" and info_of(gemma).task == "causal-lm"


def test_query_heads_within_the_group_cut_exactly(gemma) -> None:
    remove = {0: [1, 3], 2: [0]}  # 2 of 4 in a sliding layer, 1 of 4 in a full layer
    with HeadGates(gemma, removal_gates(gemma, remove)):
        gated = _logits(gemma)
    apply_plan(gemma, remove, [])
    torch.testing.assert_close(_logits(gemma), gated, atol=1e-5, rtol=1e-5)
    assert gemma.model.layers[0].self_attn.q_proj.out_features == 2 * 16
    assert gemma.model.layers[0].self_attn.num_key_value_groups == 2


def test_ffn_neurons_cut_exactly(gemma) -> None:
    keep = list(range(0, 64, 3))
    reference = copy.deepcopy(gemma)
    with torch.no_grad():  # a neuron whose down-projection column is zero contributes nothing
        dropped = [i for i in range(64) if i not in keep]
        reference.model.layers[4].mlp.down_proj.weight[:, dropped] = 0
    apply_plan(gemma, {}, [], {4: dropped})
    torch.testing.assert_close(_logits(gemma), _logits(reference), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("drop", [[2], [0, 5], [1, 2, 3]])
def test_layers_drop_with_each_keeping_its_window(gemma, drop: list[int]) -> None:
    reference = copy.deepcopy(gemma)
    for index in drop:  # the dropped block passes its input through
        reference.model.layers[index].register_forward_hook(lambda module, args, out: args[0])
    kinds = [t for i, t in enumerate(gemma.config.layer_types) if i not in drop]
    apply_plan(gemma, {}, drop)
    assert gemma.config.layer_types == kinds
    torch.testing.assert_close(_logits(gemma), _logits(reference), atol=1e-5, rtol=1e-5)


def test_a_mixed_cut_saves_and_reloads_bit_identical(gemma, tmp_path: Path) -> None:
    apply_plan(gemma, {1: [0, 1, 2], 5: [2]}, [3], {0: list(range(32))})
    save(gemma, tmp_path / "cut.safetensors")
    again = load(tmp_path / "cut.safetensors")
    assert type(again).__name__ == "Gemma3ForCausalLM" and again.config.num_hidden_layers == 5
    assert again.config.layer_types == gemma.config.layer_types
    assert torch.equal(_logits(again), _logits(gemma))


def test_no_residual_stream_is_named_for_compensation(gemma) -> None:
    """Gemma 3 normalises each projection's output (post_attention_layernorm,
    post_feedforward_layernorm) before adding it, so residual + projection output is not the
    stream the next stage reads: compensation must fit the projection's output alone."""
    layer = gemma.model.layers[1]
    adapter = adapter_for(gemma)
    assert adapter.residual_input(layer, "attention") is None and adapter.residual_input(layer, "ffn") is None
    seen: dict = {}

    def keep(key: str, tensor: torch.Tensor) -> None:
        seen.setdefault(key, tensor.detach())

    hooks = [
        layer.register_forward_pre_hook(lambda m, a, kw: keep("r", hidden_states_in(a, kw)), with_kwargs=True),
        layer.self_attn.o_proj.register_forward_hook(lambda m, a, out: keep("o", out)),
        layer.pre_feedforward_layernorm.register_forward_pre_hook(lambda m, a: keep("sum", a[0])),
    ]
    _logits(gemma)
    for hook in hooks:
        hook.remove()
    assert not torch.allclose(seen["r"] + seen["o"], seen["sum"], atol=1e-3)
    with torch.no_grad():
        torch.testing.assert_close(seen["r"] + layer.post_attention_layernorm(seen["o"]), seen["sum"])
