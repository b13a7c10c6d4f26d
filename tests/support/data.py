"""Tiny tokenizers and data files for tests (no downloads): a WordLevel vocabulary of 60."""

from __future__ import annotations

import json
import random
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers, processors

from headprune_cli.model.layout import info_of

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
WORDS = [f"w{i}" for i in range(56)]  # ids 4..59, inside the tiny models' vocab of 60


def word_tokenizer(encoder: bool = True) -> Tokenizer:
    vocab = {tok: i for i, tok in enumerate(SPECIAL + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if encoder:
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
        )
    return tok


def give_tokenizer(model, encoder: bool = True):
    """Attach the tiny tokenizer to a model (before `save`), as import does for HF folders."""
    info = info_of(model)
    info.tokenizer = word_tokenizer(encoder).to_str()
    info.tokenizer_config = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]"}
    return model


def sentences(n: int, seed: int = 0, low: int = 2, high: int = 9) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high))) for _ in range(n)]


def write_jsonl(path: Path, n: int, num_labels: int | None = 2, seed: int = 0) -> Path:
    rows = []
    for i, text in enumerate(sentences(n, seed)):
        row = {"text": text}
        if num_labels:
            row["label"] = i % num_labels
        rows.append(json.dumps(row))
    path.write_text("\n".join(rows) + "\n")
    return path


def write_text(path: Path, n: int, seed: int = 0) -> Path:
    path.write_text("\n".join(sentences(n, seed)) + "\n")
    return path
