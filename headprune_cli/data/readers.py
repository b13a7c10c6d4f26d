"""Dataset readers -> padded tensors -> model-ready batches.

Formats (chosen by file suffix):
- `.jsonl` / `.json`: one JSON object a line with `text` (optionally `text_pair`) and,
  for classification, `label` (an int, or a label name the model's config knows);
- `.csv`: the same columns, with a header row;
- `.safetensors`: an already tokenized set: `input_ids` [N, L], optional
  `attention_mask` [N, L] (ones when absent), optional `labels` [N];
- anything else (`.txt`, ...): plain text, one example per non-empty line.

The tokenizer travels inside the checkpoint (`info_of(model).tokenizer`). Sequences are
truncated to `max_length` and right-padded to the longest one in the dataset;
`batches()` trims trailing all-padding columns per batch. `samples=N` keeps the FIRST N
examples in file order (not a random subset), so a subset never depends on the seed.
"""

from __future__ import annotations

import csv
import inspect
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import PreTrainedTokenizerFast

from headprune_cli.data.tokenizer_guard import encode_rows, probe
from headprune_cli.errors import DataError, shorten
from headprune_cli.files.io import check_regular
from headprune_cli.model.arch import adapter_for
from headprune_cli.model.layout import info_of

TEXT_SUFFIXES = (".jsonl", ".json", ".csv")
# Characters of text kept per token of --max-length before tokenizing: truncation keeps
# max_length tokens, and no tokenizer we carry averages more than this many characters a
# token over a prefix, so the cut never changes what truncation keeps, while a 50 MB line
# costs the tokenizer 8 KB instead of gigabytes.
CHARS_PER_TOKEN = 64
# Labels are class indices; anything above this is a typo or an attack, not a class.
MAX_LABEL = 1 << 31
_SPECIAL = ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token", "bos_token", "eos_token")


@dataclass
class Dataset:
    input_ids: torch.Tensor  # [N, L] long
    attention_mask: torch.Tensor  # [N, L] long, 1 = real token
    labels: torch.Tensor | None = None  # [N] long; None for causal LM / fidelity
    token_type_ids: torch.Tensor | None = None  # [N, L] for sentence pairs, when the model takes them

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def select(self, start: int, stop: int) -> Dataset:
        """Rows [start, stop): a contiguous slice (batches, shards)."""
        pick = slice(start, stop)
        return Dataset(
            self.input_ids[pick],
            self.attention_mask[pick],
            None if self.labels is None else self.labels[pick],
            None if self.token_type_ids is None else self.token_type_ids[pick],
        )

    def batches(self, batch_size: int) -> Iterator[dict[str, torch.Tensor]]:
        """batches(self, batch_size), for code below data/ (model/) that is handed a Dataset."""
        return batches(self, batch_size)


def batches(dataset: Dataset, batch_size: int) -> Iterator[dict[str, torch.Tensor]]:
    """Model-ready dicts in dataset order; trailing all-padding columns are trimmed."""
    if batch_size < 1:
        raise DataError(f"batch size must be at least 1 (got {batch_size})")
    for start in range(0, len(dataset), batch_size):
        yield as_batch(dataset.select(start, start + batch_size))


def num_batches(dataset: Dataset, batch_size: int) -> int:
    return (len(dataset) + batch_size - 1) // batch_size


def used_width(mask: torch.Tensor) -> int:
    """Columns up to the last one holding a real token in any row (at least 1)."""
    used = mask.any(dim=0).nonzero()
    return int(used.max()) + 1 if len(used) else 1


def as_batch(part: Dataset) -> dict[str, torch.Tensor]:
    width = used_width(part.attention_mask)
    batch = {"input_ids": part.input_ids[:, :width], "attention_mask": part.attention_mask[:, :width]}
    if part.token_type_ids is not None:
        batch["token_type_ids"] = part.token_type_ids[:, :width]
    if part.labels is not None:
        batch["labels"] = part.labels
    return batch


# --- reading ----------------------------------------------------------------------------
def read_data(
    path: str | Path,
    model: nn.Module,
    *,
    max_length: int = 128,
    samples: int | None = None,
    seed: int = 0,  # reserved: subsets are the first N rows, so the seed does not change them
    need_labels: bool | None = None,
) -> Dataset:
    """Read, tokenize and pad a dataset for `model`.

    need_labels: True requires a label on every row, False ignores labels, None requires
    them exactly when the model is a classifier.
    """
    path = Path(path)
    if samples is not None and samples <= 0:
        raise DataError(f"--samples must be a positive number of examples (got {samples})")
    if max_length < 1:
        raise DataError(f"max length must be at least 1 (got {max_length})")
    if not path.exists():
        raise DataError(f"{path}: no such data file")
    check_regular(path, "data file", DataError)
    max_length = min(max_length, position_limit(model) or max_length)
    info = info_of(model)
    if need_labels is None:
        need_labels = info.task == "classification"
    if path.suffix == ".safetensors":
        dataset = _read_tensors(path, max_length, samples)
    else:
        rows = _read_rows(path, samples)
        dataset = _tokenize(rows, model, max_length, path)
        dataset.labels = _labels(rows, info.config, path) if need_labels else None
    if len(dataset) == 0:
        raise DataError(f"{path}: no examples")
    _check_vocab(dataset.input_ids, info.config, path)
    if not need_labels:
        dataset.labels = None
    elif dataset.labels is None:
        raise DataError(f"{path}: classification needs a `label` for every example")
    else:
        _check_range(dataset.labels, _num_labels(info.config), path)
    if dataset.token_type_ids is not None and not _accepts(model, "token_type_ids"):
        dataset.token_type_ids = None
    return dataset


def position_limit(model: nn.Module) -> int | None:
    """The most tokens the model can take (its position table), when its config says."""

    return adapter_for(model).max_positions(model)


def _read_rows(path: Path, samples: int | None) -> list[Row]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise DataError(f"{path}: not UTF-8 text") from None
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        rows = _jsonl(text, path, samples)
    elif suffix == ".csv":
        rows = _csv(text, path, samples)
    else:
        lines = [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1)]
        rows = [Row({"text": line}, f"{path}:{n}") for n, line in lines if line][:samples]
    if not rows:
        raise DataError(f"{path}: no examples (the file is empty)")
    return rows


def _jsonl(text: str, path: Path, samples: int | None) -> list[Row]:
    rows: list[Row] = []
    for number, line in enumerate(text.splitlines(), 1):
        if samples is not None and len(rows) >= samples:
            break
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
        except (ValueError, RecursionError) as exc:  # a 5000-digit number, or nesting 100,000 deep
            raise DataError(
                f"{path}:{number}: not valid JSON ({shorten(str(exc) or type(exc).__name__, 120)})"
            ) from None
        rows.append(_checked_row(row, f"{path}:{number}"))
    return rows


def _csv(text: str, path: Path, samples: int | None) -> list[Row]:
    reader = csv.DictReader(text.splitlines())
    if reader.fieldnames is None or "text" not in reader.fieldnames:
        raise DataError(f"{path}: a CSV needs a header row with a `text` column")
    rows: list[Row] = []
    for number, row in enumerate(reader, 2):
        if samples is not None and len(rows) >= samples:
            break
        row = {k: v for k, v in row.items() if v not in (None, "")}
        rows.append(_checked_row(row, f"{path}:{number}"))
    return rows


class Row(dict):
    """One example as read, and where it was read (`file:line`), for errors about it."""

    def __init__(self, fields: dict, where: str):
        super().__init__(fields)
        self.where = where


def _checked_row(row, where: str) -> Row:
    if not isinstance(row, dict) or not isinstance(row.get("text"), str):
        raise DataError(f"{where}: expected an object with a string `text` field")
    if "text_pair" in row and not isinstance(row["text_pair"], str):
        raise DataError(f"{where}: `text_pair` must be a string")
    return Row(row, where)


def tokenizer_of(model: nn.Module):
    """The checkpoint's tokenizer as a transformers PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer  # noqa: PLC0415 (keeps tokenizers out of this module's import)

    info = info_of(model)
    if not info.tokenizer:
        raise DataError(
            "this checkpoint has no tokenizer, so it cannot read text data; import the model "
            "folder with its tokenizer.json, or give a tokenized .safetensors set (input_ids, attention_mask, labels)"
        )
    try:
        backend = Tokenizer.from_str(info.tokenizer)
    except Exception as exc:  # the tokenizers library raises its own exception types
        raise DataError(f"the checkpoint's tokenizer cannot be read: {exc}") from None
    probe(backend, info.loaded_from[0] if info.loaded_from else "the model")
    special = {k: v for k, v in info.tokenizer_config.items() if k in _SPECIAL and isinstance(v, str)}
    return PreTrainedTokenizerFast(tokenizer_object=backend, **special)


def _tokenize(rows: list[Row], model: nn.Module, max_length: int, path: Path) -> Dataset:
    tokenizer = tokenizer_of(model)
    cut = max_length * CHARS_PER_TOKEN
    texts = [row["text"][:cut] for row in rows]
    pairs = [row["text_pair"][:cut] if "text_pair" in row else None for row in rows]
    if any(p is not None for p in pairs) and not all(p is not None for p in pairs):
        raise DataError(f"{path}: `text_pair` must be given on every row or on none")
    encoded = encode_rows(
        lambda some, their_pairs: tokenizer(
            some,
            their_pairs,
            truncation=True,
            max_length=max_length,
            return_token_type_ids=True,
            return_attention_mask=False,
        ),
        texts,
        pairs if pairs[0] is not None else None,
        [getattr(row, "where", f"{path}: row {i + 1}") for i, row in enumerate(rows)],
    )
    ids = encoded["input_ids"]
    empty = [i for i, seq in enumerate(ids) if not seq]
    if empty:
        raise DataError(f"{path}: example {empty[0] + 1} has no tokens (empty text)")
    width = max(len(seq) for seq in ids)
    pad = _pad_id(tokenizer, info_of(model).config)
    input_ids = torch.full((len(ids), width), pad, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    types = torch.zeros((len(ids), width), dtype=torch.long)
    for i, seq in enumerate(ids):
        input_ids[i, : len(seq)] = torch.tensor(seq)
        mask[i, : len(seq)] = 1
        types[i, : len(seq)] = torch.tensor(encoded["token_type_ids"][i])
    return Dataset(input_ids, mask, None, types if pairs[0] is not None else None)


def _pad_id(tokenizer, config: dict) -> int:
    for token in (tokenizer.pad_token, tokenizer.eos_token, tokenizer.unk_token):
        if token is not None and tokenizer.convert_tokens_to_ids(token) is not None:
            return int(tokenizer.convert_tokens_to_ids(token))
    value = config.get("pad_token_id")
    return int(value) if isinstance(value, int) else 0


def _check_vocab(ids: torch.Tensor, config: dict, path: Path) -> None:
    vocab = config.get("vocab_size")
    if int(ids.min()) < 0 or (isinstance(vocab, int) and int(ids.max()) >= vocab):
        raise DataError(f"{path}: token ids must lie in [0, {vocab}) for this model")


def _accepts(model: nn.Module, name: str) -> bool:
    params = inspect.signature(model.forward).parameters
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


# --- labels ---------------------------------------------------------------------------------
def _label_names(config: dict) -> dict[str, int]:
    names = {str(k): int(v) for k, v in (config.get("label2id") or {}).items()}
    for key, name in (config.get("id2label") or {}).items():
        names.setdefault(str(name), int(key))
    return names


def _num_labels(config: dict) -> int:
    if isinstance(config.get("num_labels"), int):
        return config["num_labels"]
    return len(config.get("id2label") or {}) or 2


def _labels(rows: list[Row], config: dict, path: Path) -> torch.Tensor | None:
    if not any("label" in row for row in rows):
        return None
    names = _label_names(config)
    values = []
    for number, row in enumerate(rows, 1):
        if "label" not in row:
            raise DataError(f"{path}: example {number} has no `label` (classification needs one on every row)")
        values.append(_label_value(row["label"], names, f"{path}: example {number}"))
    return torch.tensor(values, dtype=torch.long)


def _label_value(label, names: dict[str, int], where: str) -> int:
    if isinstance(label, bool):
        raise DataError(f"{where}: label {shorten(label)} is not an int or a label name")
    if isinstance(label, int):
        if abs(label) > MAX_LABEL:
            raise DataError(f"{where}: label {shorten(label)} is not a class index")
        return label
    if isinstance(label, str):
        if label in names:
            return names[label]
        if re.fullmatch(r"-?[0-9]{1,10}", label.strip()):  # CSV cells are strings; ASCII digits only ("²" is no digit)
            return _label_value(int(label), names, where)
        known = ", ".join(sorted(names)) or "none (the model has no label names)"
        raise DataError(f"{where}: unknown label name {shorten(label)} (known: {shorten(known, 200)})")
    raise DataError(f"{where}: label {shorten(label)} is not an int or a label name")


def _check_range(labels: torch.Tensor, num_labels: int, path: Path) -> None:
    bad = ((labels < 0) | (labels >= num_labels)).nonzero()
    if len(bad):
        i = int(bad[0])
        raise DataError(f"{path}: example {i + 1} has label {int(labels[i])}, out of range for {num_labels} classes")


# --- tokenized tensor sets ---------------------------------------------------------------
def _read_tensors(path: Path, max_length: int, samples: int | None) -> Dataset:
    from safetensors import SafetensorError  # noqa: PLC0415 (keeps safetensors out of this module's import)
    from safetensors.torch import load_file  # noqa: PLC0415 (looked up when called: tests replace it)

    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise DataError(f"{path}: not a readable safetensors file ({exc})") from None
    ids = tensors.get("input_ids")
    if ids is None or ids.dim() != 2 or ids.is_floating_point():
        raise DataError(f"{path}: needs an integer `input_ids` tensor of shape [examples, length]")
    mask = tensors.get("attention_mask", torch.ones_like(ids))
    labels = tensors.get("labels")
    if mask.shape != ids.shape:
        raise DataError(f"{path}: `attention_mask` shape {list(mask.shape)} differs from `input_ids` {list(ids.shape)}")
    if labels is not None and (labels.dim() != 1 or len(labels) != len(ids) or labels.is_floating_point()):
        raise DataError(f"{path}: `labels` must be integers of shape [{len(ids)}]")
    keep = slice(0, samples)
    dataset = Dataset(ids[keep, :max_length].long(), mask[keep, :max_length].long(), None)
    if len(dataset) and dataset.input_ids.shape[1] == 0:
        raise DataError(f"{path}: `input_ids` has no columns (no tokens at all)")
    if bool(((dataset.attention_mask != 0) & (dataset.attention_mask != 1)).any()):
        raise DataError(f"{path}: `attention_mask` may hold only 0 and 1")
    empty = (dataset.attention_mask.sum(dim=1) == 0).nonzero()
    if len(empty):
        raise DataError(f"{path}: example {int(empty[0]) + 1} has no tokens (its attention mask is all 0)")
    dataset.labels = None if labels is None else labels[keep].long()
    return dataset
