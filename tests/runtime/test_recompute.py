"""`score --recompute`: each block recomputed in the backward keeps the scores exactly and
keeps less for the backward."""

from __future__ import annotations

import pytest
import torch

from headprune_cli import save
from headprune_cli.data.readers import read_data
from headprune_cli.model.surgery import HeadGates
from headprune_cli.runtime import recompute
from headprune_cli.stages.score.importance import score_model
from headprune_cli.stages.score.importance.context import ScoreContext
from headprune_cli.stages.score.importance.gradients import batch_losses
from headprune_cli.stages.score.importance.neurons import NeuronTaps
from tests.support import TINY, give_tokenizer, write_jsonl, write_text

FAMILIES = [
    ("reference", "jsonl"),
    ("bert", "jsonl"),
    ("distilbert", "jsonl"),
    ("gpt2", "text"),
    ("llama-gqa", "text"),
    ("qwen3", "text"),
]


def _setup(tmp_path, name: str, kind: str):
    model = give_tokenizer(TINY[name](), encoder=kind == "jsonl")
    labels = 3 if name == "bert" else 2
    path = (
        write_jsonl(tmp_path / "d.jsonl", 10, num_labels=labels)
        if kind == "jsonl"
        else write_text(tmp_path / "d.txt", 10)
    )
    return model, read_data(path, model), path


@pytest.mark.parametrize(("name", "kind"), FAMILIES)
@pytest.mark.parametrize("method", ["fisher", "taylor", "taylor-weight"])
def test_recomputed_blocks_give_the_same_head_and_neuron_scores(tmp_path, name, kind, method):
    model, data, _ = _setup(tmp_path, name, kind)
    kept = score_model(model, data, method, batch_size=4, ffn=True, recompute=False)
    again = score_model(model, data, method, batch_size=4, ffn=True, recompute=True)
    assert again.heads == kept.heads
    assert again.ffn == kept.ffn  # bit for bit: the same arithmetic, each neuron counted once
    assert all(s != 0 for layer in kept.ffn.values() for s in layer[:3])  # the taps saw gradients at all


def _saved_bytes(model, data, enabled: bool) -> int:
    """Bytes autograd keeps outside the checkpointed blocks, for one gated batch with neuron taps."""
    ctx = ScoreContext(model, data, "causal-lm", batch_size=10, ffn=True)
    batch = {"input_ids": data.input_ids, "attention_mask": data.attention_mask}
    gates = [torch.ones(*batch["input_ids"].shape, n, requires_grad=True) for n in ctx.head_counts()]
    kept = []

    def pack(t):
        kept.append(t.numel() * t.element_size())
        return t

    with (
        recompute.recomputed_blocks(model, enabled),
        HeadGates(model, gates),
        NeuronTaps(ctx).attached(batch["attention_mask"]),
    ):
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = batch_losses(ctx, batch, 0).sum()
        torch.autograd.grad(loss, gates)
    return sum(kept)


def test_recomputation_keeps_less_for_the_backward(tmp_path):
    model, data, _ = _setup(tmp_path, "llama-gqa", "text")
    plain, recomputed = _saved_bytes(model, data, False), _saved_bytes(model, data, True)
    assert recomputed < plain / 2, (plain, recomputed)


def test_the_blocks_forward_is_restored_after_scoring(tmp_path):
    model, data, _ = _setup(tmp_path, "gpt2", "text")
    blocks = list(model.transformer.h)
    score_model(model, data, "fisher", batch_size=4, ffn=True, recompute=True)
    assert all("forward" not in vars(block) for block in blocks)


def test_recomputation_is_on_by_default_from_the_parameter_threshold(tmp_path, monkeypatch):
    model, data, _ = _setup(tmp_path, "llama-gqa", "text")
    size = sum(p.numel() for p in model.parameters())
    assert not recompute.wants_recompute(model, None)  # tiny: off
    assert recompute.wants_recompute(model, True) and not recompute.wants_recompute(model, False)
    monkeypatch.setattr(recompute, "RECOMPUTE_FROM_PARAMETERS", size)
    assert recompute.wants_recompute(model, None)
    seen = []
    real = recompute.recomputed_blocks

    def spy(model, enabled=True):
        seen.append(enabled)
        return real(model, enabled)

    monkeypatch.setattr("headprune_cli.stages.score.importance.gradients.recomputed_blocks", spy)
    score_model(model, data, "fisher", batch_size=4)
    assert seen == [True]


def test_score_writes_the_same_bytes_with_and_without_recompute(tmp_path, cli, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "0")
    model, _, path = _setup(tmp_path, "llama-gqa", "text")
    save(model, tmp_path / "m.safetensors")
    outs = []
    for flag in ("--recompute", "--no-recompute"):
        out = tmp_path / f"s{flag}.json"
        assert (
            cli(
                "score", tmp_path / "m.safetensors", "--data", path, "--method", "fisher", "--ffn", flag, "-o", out
            ).code
            == 0
        )
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
