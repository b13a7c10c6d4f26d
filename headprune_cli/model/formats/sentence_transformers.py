"""The sentence-transformers files of an exported embedding model.

A model imported from a sentence-transformers folder keeps its pooling in the
checkpoint (mode, normalisation, max_seq_length; see importer.py). Exporting it writes
back what `SentenceTransformer(folder)` reads: modules.json (Transformer -> Pooling ->
Normalize), sentence_bert_config.json and 1_Pooling/config.json. With onnx/model.onnx
beside them, `SentenceTransformer(folder, backend="onnx")` serves the pruned model
without headprune, whatever its per-layer head counts (the ONNX graph has the exact
shapes; config.json only tells the runtime the model type).
"""

from __future__ import annotations

import json
from pathlib import Path

from headprune_cli.errors import HeadpruneError
from headprune_cli.model.layout import ModelInfo

POOLING_DIR = "1_Pooling"
NORMALIZE_DIR = "2_Normalize"
_MODES = ("cls", "mean", "max")


def is_sentence_transformer(info: ModelInfo) -> bool:
    return bool(info.pooling) and info.task == "embedding"


def write_sentence_transformer(info: ModelInfo, folder: Path) -> None:
    """modules.json, sentence_bert_config.json and the pooling config, into `folder`."""
    pooling = info.pooling
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": POOLING_DIR, "type": "sentence_transformers.models.Pooling"},
    ]
    if pooling.get("normalize"):
        modules.append({"idx": 2, "name": "2", "path": NORMALIZE_DIR, "type": "sentence_transformers.models.Normalize"})
    _write(folder / "modules.json", modules)
    _write(folder / "sentence_bert_config.json", {"max_seq_length": _max_seq_length(info), "do_lower_case": False})
    (folder / POOLING_DIR).mkdir()
    _write(folder / POOLING_DIR / "config.json", _pooling_config(info))


def _pooling_config(info: ModelInfo) -> dict:
    mode = info.pooling.get("mode", "mean")
    config = {
        "word_embedding_dimension": info.config.get("hidden_size") or info.config.get("dim"),
        "pooling_mode_cls_token": mode == "cls",
        "pooling_mode_mean_tokens": mode == "mean",
        "pooling_mode_max_tokens": mode == "max",
        "pooling_mode_mean_sqrt_len_tokens": False,
    }
    if mode not in _MODES:  # the importer records only these; refuse to guess another
        raise HeadpruneError(f"cannot write a sentence-transformers pooling config for mode {mode!r}")
    return config


def _max_seq_length(info: ModelInfo) -> int:
    """The importer's value, else the tokenizer's limit, else the position table."""
    limits = [
        info.pooling.get("max_seq_length"),
        info.tokenizer_config.get("model_max_length"),
        info.config.get("max_position_embeddings"),
    ]
    return next(int(v) for v in limits + [512] if isinstance(v, int) and 0 < v < 10**6)


def _write(path: Path, value) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n", encoding="utf-8")
