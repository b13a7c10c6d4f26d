"""`headprune import`: a Hugging Face model folder (or a checkpoint) -> one checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import transformers
from torch import nn

from headprune_cli.errors import CheckpointError, HeadpruneError, first_line
from headprune_cli.files.watcher import note_read
from headprune_cli.model.arch import adapter_for_model_type
from headprune_cli.model.layout import info_of

# Tokenizer settings worth carrying; tokenizer.json holds the vocabulary and rules.
_TOKENIZER_KEYS = (
    "pad_token",
    "unk_token",
    "cls_token",
    "sep_token",
    "mask_token",
    "bos_token",
    "eos_token",
    "model_max_length",
)


def import_folder(folder: str | Path) -> nn.Module:
    """Load a Hugging Face folder with transformers itself (safetensors only, no remote code)."""
    folder = Path(folder)
    config = read_config(folder)
    model_type = config.get("model_type")
    adapter_for_model_type(str(model_type))  # refuse an unsupported family before loading weights
    weights = sorted(folder.glob("*.safetensors"))
    if not weights:
        raise CheckpointError(f"{folder}: no *.safetensors weights (pickled weights are never loaded)")
    for path in weights:  # transformers memory-maps them: see watcher.py for one truncated meanwhile
        note_read(path)
    model = _from_pretrained(folder, config)
    info = info_of(model)
    info.tokenizer = _read_text(folder / "tokenizer.json")
    info.tokenizer_config = _tokenizer_config(folder)
    info.pooling = _pooling(folder)
    if info.pooling:
        info.task = "embedding"
    return model


def _from_pretrained(folder: Path, config: dict) -> nn.Module:

    names = config.get("architectures") or []
    cls = getattr(transformers, names[0], None) if names else None
    if cls is None or not isinstance(cls, type) or not issubclass(cls, transformers.PreTrainedModel):
        cls = transformers.AutoModel
    try:
        model = cls.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False, use_safetensors=True)
    except HeadpruneError:
        raise
    except Exception as exc:
        raise CheckpointError(f"{folder}: transformers could not load this model ({first_line(exc)})") from None
    model.eval()
    return model


def read_config(folder: Path) -> dict:
    """A Hugging Face folder's config.json; refused when missing, not JSON or not an object."""
    return _read_json(folder / "config.json", required=True)


def _read_json(path: Path, required: bool = False) -> dict:
    if not path.is_file():
        if required:
            raise CheckpointError(f"{path.parent}: not a model folder (no config.json)")
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:  # ValueError: bad UTF-8 or JSON
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return value


def _read_text(path: Path) -> str | None:
    return path.read_text(encoding="utf-8") if path.is_file() else None


def _tokenizer_config(folder: Path) -> dict:
    merged = {**_read_json(folder / "special_tokens_map.json"), **_read_json(folder / "tokenizer_config.json")}
    picked = {}
    for key in _TOKENIZER_KEYS:
        value = merged.get(key)
        if isinstance(value, dict):  # AddedToken form
            value = value.get("content")
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            picked[key] = value
    return picked


def _pooling(folder: Path) -> dict:
    """Sentence-transformers folders: the pooling mode, whether embeddings are normalised,
    and the max_seq_length that export writes back (formats/sentence_transformers.py)."""
    modules = folder / "modules.json"
    if not modules.is_file():
        return {}
    try:
        entries = json.loads(modules.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        raise CheckpointError(f"{modules}: not valid JSON") from None
    pooling = {"mode": "mean", "normalize": False}
    for entry in entries if isinstance(entries, list) else []:
        kind = str(entry.get("type", ""))
        if kind.endswith("Pooling"):
            cfg = _read_json(folder / str(entry.get("path", "")) / "config.json")
            for mode in ("cls", "mean", "max"):
                if cfg.get(f"pooling_mode_{mode}_token" if mode == "cls" else f"pooling_mode_{mode}_tokens"):
                    pooling["mode"] = mode
        if kind.endswith("Normalize"):
            pooling["normalize"] = True
    # The sentence-transformers truncation length (often below the tokenizer's limit).
    length = _read_json(folder / "sentence_bert_config.json").get("max_seq_length")
    if isinstance(length, int) and not isinstance(length, bool) and length > 0:
        pooling["max_seq_length"] = length
    return pooling
