"""`learn --lora`: the gates train beside LoRA adapters on a frozen base; the adapters are merged
into the base before the closed units are cut, so the output is the cut of the adapted model."""

from __future__ import annotations

import re

import pytest
import torch

from headprune_cli import load
from headprune_cli.stages.learn import stage
from headprune_cli.stages.training import run as training
from headprune_cli.stages.unit import Context
from tests.support import assert_refused, snapshot
from tests.support import saved_root as root


def _layer_index(name: str) -> int:
    return int(re.search(r"layers\.(\d+)\.", name).group(1))


@pytest.fixture
def learned(tmp_path, monkeypatch):
    """One `learn --lora` run on the tiny LLaMA: its options, result, and what was seen at the merge."""
    ckpt, data = root(tmp_path, "llama-gqa")
    seen = {}
    real_merge = training.merge_lora

    def merge(adapted, keep, output, ctx):
        base = adapted.get_base_model()
        seen["base"] = {n: p.detach().clone() for n, p in base.named_parameters() if "lora_" not in n}
        seen["delta"] = {n: m.get_delta_weight("default").detach().clone() for n, m in _lora_layers(base)}
        return real_merge(adapted, keep, output, ctx)

    monkeypatch.setattr(training, "merge_lora", merge)
    opts = stage.LearnOptions(
        checkpoint=ckpt,
        data=data,
        output=tmp_path / "out.safetensors",
        steps=60,
        lr=1e-2,
        batch_size=8,
        ratio=0.5,
        lora=True,
        lora_rank=2,
        gate_warmup=0.5,
        closed_share=0.25,
    )
    result = stage.run(opts, Context(progress=False))
    return opts, result, seen


def _lora_layers(model):
    from peft.tuners.lora import LoraLayer

    return [(name, m) for name, m in model.named_modules() if isinstance(m, LoraLayer)]


def test_the_gates_learn_beside_the_adapters(learned):
    _, result, seen = learned
    report = result.value.gates
    assert abs(report["expected_at_close"] - report["target"]) < 0.1  # the gates moved to the target
    assert report["units"]["heads"]["closed"] > 0
    assert seen["delta"] and all(d.abs().max() > 0 for d in seen["delta"].values())  # the adapters trained


def test_the_base_weights_are_bit_identical_after_training(learned):
    opts, _, seen = learned
    original = dict(load(opts.checkpoint).named_parameters())
    names = {n.replace(".base_layer.", "."): n for n in seen["base"]}
    assert set(names) == set(original)
    for name, tensor in original.items():
        assert torch.equal(seen["base"][names[name]], tensor), name


def test_the_adapters_are_merged_into_the_cut_output(learned):
    """Each kept projection of the output is the cut of base + adapter delta, not of the base alone."""
    opts, _, seen = learned
    original, out = load(opts.checkpoint), load(opts.output)
    kept = dict(zip(out.headprune.layout.layers, out.headprune.layout.heads))
    head_dim = original.config.head_dim
    checked = 0
    for name, delta in seen["delta"].items():
        if not name.endswith("self_attn.q_proj"):
            continue
        layer = _layer_index(name)
        if layer not in kept:
            continue
        rows = torch.cat([torch.arange(h * head_dim, (h + 1) * head_dim) for h in kept[layer]])
        position = out.headprune.layout.layers.index(layer)
        got = out.model.layers[position].self_attn.q_proj.weight
        base = original.get_submodule(name).weight
        torch.testing.assert_close(got, (base + delta)[rows], rtol=1e-6, atol=1e-7)
        assert not torch.allclose(got, base[rows])  # the adapter moved it
        checked += 1
    assert checked > 0


def test_contradictory_lora_options_are_refused_and_nothing_is_written(cli, tmp_path):
    ckpt, data = root(tmp_path, "llama-gqa")
    before = snapshot(tmp_path)
    out = tmp_path / "out.safetensors"
    cases = {
        "--keep-adapter: learn cuts the model after training": ["--lora", "--keep-adapter", tmp_path / "ad"],
        "--lora-rank: LoRA settings need --lora": ["--lora-rank", "4"],
        "--lora-targets no_such matches none": ["--lora", "--lora-targets", "no_such"],
        "--lora-rank 500 is outside": ["--lora", "--lora-rank", "500"],
    }
    for message, extra in cases.items():
        res = cli("learn", ckpt, "--data", data, "--ratio", "0.5", "--steps", "2", "-o", out, *extra)
        assert_refused(res, 2, message)
        assert snapshot(tmp_path) == before
