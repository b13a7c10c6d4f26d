"""The trained-LM fixture maker, on its `tiny` recipe (seconds): the path, not the numbers.

The benchmark model (scripts/tools/make_trained_lm.py, recipe `small`/`full`) is built by
the same code from Debian's descriptions; here a bundled text file stands in for them.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import pytest

import headprune_cli
from headprune_cli.data.readers import read_data, tokenizer_of
from headprune_cli.model.layout import info_of
from scripts.tools.lm_corpus import Document, _descriptions, split_documents, split_of, text_file_documents
from scripts.tools.make_trained_lm import RECIPES, build, with_paths
from tests.support import ROOT

TEXT = ROOT / "examples" / "minilm_text.txt"


def sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def make(cache: Path, seed: int = 0) -> dict:
    summary = build(text_file_documents(TEXT), RECIPES["tiny"], seed, 1, cache, log=lambda line: None)
    return with_paths(summary, cache / summary["key"])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict:
    return make(tmp_path_factory.mktemp("lm-a"))


def test_rebuild_in_another_folder_is_byte_identical(tiny, tmp_path):
    again = make(tmp_path / "b")
    assert sha(again["checkpoint"]) == sha(tiny["checkpoint"]) == tiny["checkpoint_sha256"]
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert sha(Path(again["hf_folder"]) / name) == sha(Path(tiny["hf_folder"]) / name)
    other = make(tmp_path / "c", seed=1)  # the seed is what decides the weights
    assert other["key"] != tiny["key"] and sha(other["checkpoint"]) != sha(tiny["checkpoint"])


def test_a_built_recipe_is_reused_from_the_cache(tiny):
    before = Path(tiny["checkpoint"]).stat().st_mtime_ns
    again = make(Path(tiny["folder"]).parent)
    assert again["key"] == tiny["key"] and Path(again["checkpoint"]).stat().st_mtime_ns == before


def test_training_lowers_the_loss_and_the_checkpoint_scores_text(tiny):
    assert tiny["final_train_loss"] < tiny["first_train_loss"]
    model = headprune_cli.load(tiny["checkpoint"])
    config = model.config
    assert (config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads) == (2, 4, 2)
    assert config.hidden_act == "silu" and type(model).__name__ == "LlamaForCausalLM"
    assert math.isfinite(tiny["valid_perplexity"]) and tiny["valid_perplexity"] > 1
    assert math.isfinite(tiny["unigram_perplexity"]) and tiny["unigram_perplexity"] > 1
    ids = tokenizer_of(model)("a test sentence")["input_ids"]
    assert ids[0] == 1 and 1 not in ids[1:]  # documents start with <s>, as in training
    assert read_data(Path(tiny["valid"]), model, max_length=16).input_ids[:, 0].eq(1).all()


def test_headprune_prunes_the_trained_model(tiny, tmp_path, cli):
    scores, small = tmp_path / "scores.json", tmp_path / "small.safetensors"
    assert cli("score", tiny["checkpoint"], "--data", tiny["calib"], "--method", "taylor", "-o", scores).code == 0
    result = cli(
        "prune",
        "--scores",
        scores,
        "--ratio",
        "0.5",
        "--uniform",
        "-o",
        small,
        "--compensate",
        "lstsq",
        "--data",
        tiny["calib"],
    )
    assert result.code == 0, result.err
    assert [len(kept) for kept in info_of(headprune_cli.load(small)).layout.kv_heads] == [
        1,
        1,
    ]  # 1 of 2 groups, every layer


def test_splits_follow_the_source_hash(tiny):
    texts = {name: Path(tiny[name]).read_text(encoding="utf-8").splitlines() for name in ("train", "calib", "valid")}
    for name, lines in texts.items():
        assert lines and all(split_of(line) == name for line in lines)
    assert not set(texts["train"]) & (set(texts["valid"]) | set(texts["calib"]))


def test_binary_packages_of_one_source_land_in_one_split():
    docs = [Document("src-a", f"text {i}") for i in range(40)] + [Document("src-b", f"other {i}") for i in range(40)]
    splits = split_documents(docs)
    assert sorted(len(v) for v in splits.values() if v) in ([40, 40], [80])
    assert {len(v) for v in splits.values()} <= {0, 40, 80}


def test_translation_stanzas_become_one_line_documents():
    index = (
        "Package: foo\nDescription-md5: 0\nDescription-en: Short line\n first paragraph\n"
        " continues here.\n .\n Second paragraph.\n\n"
        "Package: bar\nDescription-md5: 1\nDescription-en: Only a short line\n"
    )
    assert list(_descriptions(index)) == [
        ("foo", "Short line first paragraph continues here. Second paragraph."),
        ("bar", "Only a short line"),
    ]
