"""Streaming compensation: the same weights as the old whole-model algorithm, in O(L) block forwards."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers as T

from headprune_cli.model.arch import adapter_for
from headprune_cli.stages.prune.compensation import compensate
from tests.support import TINY, calibration, compensate_old, count_computed

# Plans every family accepts: GQA models remove whole KV groups, and one plan drops a layer.
PLANS = {
    "mha": ({0: [1], 1: [0, 2], 2: [0, 2]}, []),
    "mha-drop": ({0: [1, 3], 2: [0]}, [1]),
    "gqa-drop": ({0: [0, 1], 2: [2, 3]}, [1]),
    "gqa8-drop": ({0: [0, 1, 2, 3], 2: [4, 5, 6, 7]}, [1]),
}
FAMILY_PLANS = {"llama-gqa": "gqa8-drop", "qwen3": "gqa8-drop", "mistral": "gqa-drop", "qwen2": "gqa-drop"}


def _sliding_qwen2():
    # Per-layer attention masks (sliding vs full): each block must get its own arguments.
    torch.manual_seed(0)
    config = T.Qwen2Config(
        vocab_size=60,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=48,
        use_sliding_window=True,
        sliding_window=4,
        max_window_layers=1,
        layer_types=["full_attention", "sliding_attention", "sliding_attention"],
        pad_token_id=0,
    )
    return T.Qwen2ForCausalLM(config).eval()


def _vit_calibration(n: int) -> list[dict]:
    gen = torch.Generator().manual_seed(3)
    return [{"pixel_values": torch.randn(4, 3, 16, 16, generator=gen)} for _ in range(n)]


# Every family once (with a dropped layer), bias on two families that have an o-projection bias,
# and a model whose blocks get different masks.
CASES = [(f, FAMILY_PLANS.get(f, "mha-drop"), "lstsq") for f in sorted(TINY)]
CASES += [
    ("bert", "mha", "bias"),
    ("gpt2", "mha", "bias"),
    ("reference", "mha", "lstsq"),
    ("qwen2-sliding", "gqa-drop", "lstsq"),
]


@pytest.mark.parametrize(("family", "plan", "method"), CASES)
def test_streaming_equals_the_old_algorithm(family, plan, method):
    base = _sliding_qwen2() if family == "qwen2-sliding" else TINY[family]()
    remove, drop = PLANS[plan]
    data = _vit_calibration(3) if family == "vit" else calibration(3, seed=1)
    old, new = copy.deepcopy(base), copy.deepcopy(base)
    expected = compensate_old(old, remove, drop, data, method=method)
    got = compensate(new, remove, drop, data, method=method)
    assert (got.layers, got.skipped, got.tokens) == (expected.layers, expected.skipped, expected.tokens)
    assert got.error_after == pytest.approx(expected.error_after, rel=1e-9, abs=1e-12)
    for (name, a), b in zip(old.named_parameters(), new.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-7, msg=name)
    changed = [n for (n, a), b in zip(base.named_parameters(), new.parameters()) if not torch.equal(a, b)]
    assert bool(changed) == bool(expected.layers)  # the comparison is not between two untouched models


def _deep_llama(layers: int):
    torch.manual_seed(0)
    config = T.LlamaConfig(
        vocab_size=60,
        hidden_size=32,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=48,
        pad_token_id=0,
    )
    return T.LlamaForCausalLM(config).eval()


def _block_calls(model, run) -> tuple[int, int]:
    """(completed block forwards, started whole-model forwards) while `run()` compensates `model`."""
    counts = {"block": 0, "model": 0}
    blocks = adapter_for(model).layer_list(model)
    hooks = [b.register_forward_hook(lambda m, *_: count_computed(counts, m)) for b in blocks]
    hooks.append(model.register_forward_pre_hook(lambda *_: counts.__setitem__("model", counts["model"] + 1)))
    try:
        run()
    finally:
        for h in hooks:
            h.remove()
    return counts["block"], counts["model"]


@pytest.mark.parametrize("layers", [4, 12])
def test_forward_count_grows_linearly_with_depth(layers):
    batches = calibration(2, seed=0, batch=4, seq=6)
    remove = {layer: [1] for layer in range(layers)}  # every layer pruned: the worst case
    model = _deep_llama(layers)
    blocks, models = _block_calls(model, lambda: compensate(model, remove, [], batches))
    # The recording forward computes block 0 only; then per layer: the unpruned stream and the
    # pruned stream through the new weights (the pruned run for the statistics stops at the
    # output projection's input, so it does not complete).
    assert blocks == (1 + 2 * layers) * len(batches)
    assert models == len(batches)
    old = _deep_llama(layers)
    old_blocks, _ = _block_calls(old, lambda: compensate_old(old, remove, [], batches))
    assert old_blocks == layers * (layers - 1) * len(batches)  # two forwards up to each pruned layer: O(L^2)


def test_only_layers_up_to_the_last_pruned_one_run():
    model = _deep_llama(6)
    batches = calibration(1, seed=0, batch=4, seq=6)
    blocks, _ = _block_calls(model, lambda: compensate(model, {1: [0]}, [], batches))
    assert blocks == 1 + 2 + 2  # record: block 0 only; block 0 on both streams; block 1 twice
