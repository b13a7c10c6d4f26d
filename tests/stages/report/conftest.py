"""The report tests' shared workspace: a baseline, its pruned descendant and data labelled by the baseline."""

from __future__ import annotations

import json

import pytest
import torch

from headprune_cli import load, save
from headprune_cli.data.readers import read_data
from headprune_cli.model.surgery import apply_plan
from headprune_cli.stages.objectives import embed
from tests.support import TINY, give_tokenizer, sentences

PLAN = {0: [0, 1, 2], 1: [0, 1], 2: [1, 2, 3]}  # the reference encoder keeps 1 head per layer


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A baseline, a pruned descendant, and eval data labelled by the baseline itself,
    so the baseline scores 100% and the pruned model (which flips some) scores less."""
    folder = tmp_path_factory.mktemp("report")
    base = give_tokenizer(TINY["reference"]())
    texts = sentences(40, seed=3)
    (folder / "unlabelled.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    dataset = read_data(folder / "unlabelled.jsonl", base, max_length=16, need_labels=False)
    batch = {"input_ids": dataset.input_ids, "attention_mask": dataset.attention_mask}
    with torch.no_grad():
        # A random classifier predicts one class for everything; centre its margin so
        # that the baseline predicts both classes and pruning flips some of them.
        base.classifier.weight.mul_(20)
        logits = embed(base, batch)
        # quantile, not median: with an even count the median IS one example, whose margin
        # would sit exactly on the boundary and flip with any change of batch composition.
        base.classifier.bias[1] -= torch.quantile(logits[:, 1] - logits[:, 0], 0.5)
        gold = embed(base, batch).argmax(-1)
    save(base, folder / "base.safetensors")
    pruned = load(folder / "base.safetensors")
    apply_plan(pruned, PLAN, [])
    save(pruned, folder / "pruned.safetensors")
    with torch.no_grad():
        flipped = embed(pruned, batch).argmax(-1) != gold
    assert flipped.any(), "the fixture needs the pruned model to lose accuracy"
    rows = [json.dumps({"text": t, "label": int(y)}) for t, y in zip(texts, gold)]
    (folder / "dev.jsonl").write_text("\n".join(rows) + "\n")
    return folder, 1.0 - float(flipped.double().mean())
