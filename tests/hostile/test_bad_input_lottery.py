"""Bad input for lottery tickets (`finetune --rewind-to/--reinit`, `select --strategy random`),
part of the bad-input matrix (its contract, workspace and runner: test_bad_input_matrix.py).

A rewind checkpoint of another architecture or shape (hidden size, layer count, head count,
vocabulary, family; a headprune checkpoint or a Hugging Face folder), one that lacks a head
the model keeps, one that is missing or not a model folder, an output onto the rewind
checkpoint, and options that exclude each other: each one `Error:` line, nothing written.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import transformers as T

from headprune_cli import save
from headprune_cli.model.arch import ReferenceConfig, ReferenceEncoder
from tests.hostile import test_bad_input_matrix as matrix

Case, M, run_case = matrix.Case, matrix.M, matrix.run_case
workspace = matrix.workspace  # the matrix's workspace fixture (module-scoped), used here as it is there
FT = ["--data", "data.jsonl", "--steps", "1"]
DEMO = dict(
    vocab_size=16,
    max_position=64,
    hidden_size=64,
    heads_per_layer=[4, 4, 4, 4],
    head_dim=16,
    intermediate_size=128,
    num_labels=4,
)  # examples/demo/model.safetensors' config


def _reference(**change) -> Callable[[Path], None]:
    """base.safetensors: a reference encoder like the demo model but for `change`."""

    def prepare(folder: Path) -> None:
        save(ReferenceEncoder(ReferenceConfig(**{**DEMO, **change})), folder / "base.safetensors")

    return prepare


def _bert(folder: Path) -> None:
    bert = T.BertForSequenceClassification(
        T.BertConfig(vocab_size=16, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, intermediate_size=128)
    )
    save(bert, folder / "base.safetensors")
    bert.save_pretrained(str(folder / "hf"))


def _finetune(rewind: str, *extra: str) -> Callable[[Path], list]:
    return lambda f: [
        "finetune",
        f / M,
        *[f / a if a.endswith("jsonl") else a for a in FT],
        "--rewind-to",
        f / rewind,
        *extra,
        "-o",
        f / "out.safetensors",
    ]


LOTTERY_CASES = [
    Case("rewind: hidden size", _finetune("base.safetensors"), 2, "hidden_size 32 vs 64", _reference(hidden_size=32)),
    Case(
        "rewind: layer count", _finetune("base.safetensors"), 2, "heads_per_layer", _reference(heads_per_layer=[4] * 3)
    ),
    Case(
        "rewind: head count",
        _finetune("base.safetensors"),
        2,
        "heads_per_layer [4, 4, 4, 2]",
        _reference(heads_per_layer=[4, 4, 4, 2]),
    ),
    Case("rewind: vocabulary", _finetune("base.safetensors"), 2, "vocab_size 20 vs 16", _reference(vocab_size=20)),
    Case(
        "rewind: FFN width", _finetune("base.safetensors"), 2, "intermediate_size 96", _reference(intermediate_size=96)
    ),
    Case("rewind: another family", _finetune("base.safetensors"), 2, "is a bert model", _bert),
    Case("rewind: another family (HF folder)", _finetune("hf"), 2, "is a bert model", _bert),
    Case(
        "rewind: lacks a kept head", _finetune("other.safetensors"), 2, "lacks what the model keeps (layer 0 heads [0])"
    ),
    Case("rewind: missing checkpoint", _finetune("nope.safetensors"), 1, "no such checkpoint"),
    Case(
        "rewind: folder without config.json",
        _finetune("empty"),
        1,
        "not a model folder",
        lambda f: (f / "empty").mkdir(),
    ),
    Case("rewind and reinit together", _finetune(M, "--reinit", "1"), 2, "give one of them"),
    Case(
        "output onto the rewind checkpoint",
        lambda f: [
            "finetune",
            f / M,
            "--data",
            f / "data.jsonl",
            "--steps",
            "1",
            "--rewind-to",
            f / "base.safetensors",
            "-o",
            f / "base.safetensors",
            "--force",
        ],
        2,
        "is also an input",
        _reference(),
    ),
    Case(
        "select --strategy random with a threshold",
        lambda f: ["select", f / "scores.json", "--strategy", "random", "--threshold", "0.1", "--seed", "1"],
        2,
        "takes --ratio",
    ),
]


@pytest.mark.parametrize("case", LOTTERY_CASES, ids=[c.name for c in LOTTERY_CASES])
def test_lottery_refusals(case: Case, workspace: Path, tmp_path: Path, cli):
    run_case(case, workspace, tmp_path, cli)
