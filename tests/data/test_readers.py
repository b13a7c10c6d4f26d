"""data.py and objectives.py: readers, labels, padding, losses, metrics."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import save_file

from headprune_cli.data.readers import batches, read_data, tokenizer_of
from headprune_cli.errors import DataError, UsageError
from headprune_cli.model.layout import info_of
from headprune_cli.stages.objectives import (
    check_objective,
    default_objective,
    embed,
    evaluate,
    per_example_loss,
    token_nll,
)
from tests.support import TINY, give_tokenizer, write_jsonl, write_text


@pytest.fixture
def classifier():
    return give_tokenizer(TINY["reference"]())


def test_jsonl_tokenized_padded_and_labelled(tmp_path, classifier):
    data = read_data(write_jsonl(tmp_path / "d.jsonl", 5, num_labels=2), classifier)
    assert len(data) == 5 and data.labels.tolist() == [0, 1, 0, 1, 0]
    lengths = data.attention_mask.sum(1)
    assert data.input_ids.shape[1] == int(lengths.max())
    assert (data.input_ids[:, 0] == 2).all()  # [CLS] from the checkpoint's tokenizer
    first = tokenizer_of(classifier)("w1 w2")["input_ids"]
    assert first == [2, 5, 6, 3]
    padded = data.input_ids[data.attention_mask == 0]
    assert (padded == 0).all()  # [PAD]


def test_label_names_csv_pairs_and_first_n(tmp_path, classifier):
    info_of(classifier).config["id2label"] = {"0": "neg", "1": "pos"}
    path = tmp_path / "d.csv"
    path.write_text("text,text_pair,label\nw1 w2,w3,pos\nw4,w5 w6,neg\nw7,w8,1\n")
    data = read_data(path, classifier, samples=2)
    assert data.labels.tolist() == [1, 0]
    assert data.token_type_ids is not None and data.token_type_ids[0].tolist()[:6] == [0, 0, 0, 0, 1, 1]


def test_batches_trim_padding_and_keep_order(tmp_path, classifier):
    data = read_data(write_jsonl(tmp_path / "d.jsonl", 7), classifier)
    parts = list(batches(data, 3))
    assert [len(b["input_ids"]) for b in parts] == [3, 3, 1]
    assert torch.equal(torch.cat([b["labels"] for b in parts]), data.labels)
    for b in parts:
        assert b["attention_mask"][:, -1].any()  # no all-padding trailing column


def test_plain_text_and_tensor_sets_for_causal_lm(tmp_path):
    model = give_tokenizer(TINY["gpt2"](), encoder=False)
    assert default_objective(model) == "causal-lm"
    data = read_data(write_text(tmp_path / "t.txt", 4), model)
    assert len(data) == 4 and data.labels is None
    save_file({"input_ids": data.input_ids, "attention_mask": data.attention_mask}, tmp_path / "t.safetensors")
    again = read_data(tmp_path / "t.safetensors", model, samples=3)
    assert torch.equal(again.input_ids, data.input_ids[:3])


@pytest.mark.parametrize(
    "content, message",
    [
        ("", "no examples"),
        ('{"text": "w1", "label": 7}\n', "out of range"),
        ('{"text": "w1"}\n', "needs a `label`"),
        ('{"text": "w1", "label": "maybe"}\n', "unknown label name"),
        ('{"text": 3}\n', "string `text`"),
        ("{oops\n", "not valid JSON"),
    ],
)
def test_bad_data_is_a_clear_error(tmp_path, classifier, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(DataError, match=message):
        read_data(path, classifier)


def test_samples_zero_and_missing_tokenizer(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", 3)
    with pytest.raises(DataError, match="positive"):
        read_data(path, give_tokenizer(TINY["reference"]()), samples=0)
    with pytest.raises(DataError, match="no tokenizer"):
        read_data(path, TINY["reference"]())


def test_causal_loss_ignores_padding(tmp_path):
    model = TINY["gpt2"]()
    ids = torch.randint(2, 60, (1, 6))
    full = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    padded_ids = torch.cat([ids, torch.zeros(1, 3, dtype=torch.long)], 1)
    padded = {"input_ids": padded_ids, "attention_mask": torch.cat([torch.ones(1, 6), torch.zeros(1, 3)], 1).long()}
    with torch.no_grad():
        a = per_example_loss(model(**full).logits, full, "causal-lm")
        b = per_example_loss(model(**padded).logits, padded, "causal-lm")
        logits = model(**full).logits
    torch.testing.assert_close(a, b)
    manual = torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:])
    torch.testing.assert_close(a[0], manual)
    assert token_nll(logits, full)[1].item() == 5


def test_metrics(tmp_path, classifier):
    data = read_data(write_jsonl(tmp_path / "d.jsonl", 6), classifier)
    metrics = {m.name: m for m in evaluate(classifier, data, "classification", batch_size=4)}
    with torch.no_grad():
        pred = classifier(input_ids=data.input_ids, attention_mask=data.attention_mask).logits.argmax(-1)
    assert metrics["accuracy"].value == pytest.approx(float((pred == data.labels).float().mean()))
    assert metrics["accuracy"].higher_is_better and 0 <= metrics["macro_f1"].value <= 1
    fid = evaluate(classifier, data, "fidelity")
    assert fid[0].name == "fidelity" and fid[0].value == pytest.approx(1.0, abs=1e-6)

    lm = give_tokenizer(TINY["gpt2"](), encoder=False)
    text = read_data(write_text(tmp_path / "t.txt", 5), lm)
    (ppl,) = evaluate(lm, text, "causal-lm", batch_size=2)
    assert ppl.name == "perplexity" and not ppl.higher_is_better
    assert 1 < ppl.value < 200 and math.isfinite(ppl.value)


def test_embedding_pooling_and_objective_checks():
    model = TINY["roberta"]()
    info_of(model).pooling = {"mode": "mean", "normalize": True}
    assert default_objective(model) == "fidelity"
    batch = {"input_ids": torch.randint(2, 60, (2, 5)), "attention_mask": torch.ones(2, 5, dtype=torch.long)}
    with torch.no_grad():
        out = embed(model, batch)
    assert out.shape == (2, 32)
    torch.testing.assert_close(out.norm(dim=-1), torch.ones(2))
    with pytest.raises(UsageError, match="did you mean 'fidelity'"):
        check_objective("fidelty", model)
    with pytest.raises(UsageError, match="classifier"):
        check_objective("classification", model)
