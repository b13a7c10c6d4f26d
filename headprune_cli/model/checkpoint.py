"""The single-file checkpoint: safetensors weights plus self-describing string metadata.

Metadata keys (all strings, JSON where structured):
  headprune.format        "headprune-checkpoint"
  headprune.version       format version
  headprune.family        adapter family (bert, gpt2, llama, ...)
  headprune.architecture  class that rebuilds the unpruned model
  headprune.config        the unpruned model's config (JSON)
  headprune.layout        original indices of kept layers and heads (JSON)
  headprune.task          classification | causal-lm | embedding
  headprune.tokenizer     tokenizer.json text (absent for tokenizer-less models)
  headprune.tokenizer_config  special tokens and limits (JSON)
  headprune.pooling       sentence-transformers pooling (JSON)
  headprune.provenance    sha256 (and relative path) of parent, plan and root (JSON)

Loading builds the unpruned architecture, cuts it to the stored layout with the same
code that pruning uses, and loads the weights strictly: shapes, dtypes and finiteness
are checked, and nothing is ever unpickled.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_model
from torch import nn

from headprune_cli.model.arch import adapter_for_family
from headprune_cli.errors import CheckpointError, HeadpruneError, first_line
from headprune_cli.fileio import atomic_write, sha256_file
from headprune_cli.model.layout import Layout, ModelInfo, info_of
from headprune_cli.model.surgery import apply_plan

FORMAT = "headprune-checkpoint"
FORMAT_VERSION = "1"
MAX_HEADER_BYTES = 100 * 1024 * 1024  # safetensors' own limit; refuse before parsing
_KEYS = ("format", "version", "family", "architecture", "config", "layout", "task")


def save(model: nn.Module, path: str | os.PathLike, plan_sha: str | None = None) -> str:
    """Write `model` as a headprune checkpoint atomically; returns the file's sha256.

    Provenance: the parent is the checkpoint the model was loaded from, the root the
    parent's root (or the parent itself when it was the root).
    """
    info = info_of(model)
    metadata = _metadata(info, _provenance(info, Path(path), plan_sha))

    def write(tmp: str) -> None:
        # save_model de-duplicates tied weights (GPT-2 lm_head/wte) deterministically.
        save_model(model, tmp, metadata=metadata)
        _canonical_header(tmp)

    atomic_write(path, write)
    return sha256_file(path)


def _canonical_header(path: str) -> None:
    """Rewrite the JSON header with sorted keys: safetensors writes it in hash order,
    which would make identical models give different bytes (DESIGN invariant 4)."""
    with open(path, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
        data = handle.read()
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # keep the data buffer 8-byte aligned
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(text)) + text + data)


def _provenance(info: ModelInfo, out: Path, plan_sha: str | None) -> dict:
    loaded = info.loaded_from
    if loaded is None:  # a model that never came from a file keeps what it had
        return {**info.provenance, "plan": plan_sha or info.provenance.get("plan")}
    parent_path, parent_sha = loaded
    root_sha = info.provenance.get("root") or parent_sha
    root_path = info.provenance.get("root_path")
    if info.provenance.get("root") is None:
        root_path = _relative(parent_path, out)
    elif root_path is not None:
        root_path = _relative(Path(parent_path).parent / root_path, out)
    return {
        "parent": parent_sha,
        "parent_path": _relative(parent_path, out),
        "plan": plan_sha,
        "root": root_sha,
        "root_path": root_path,
    }


def _relative(target: str | os.PathLike, out: Path) -> str:
    """A path to `target` relative to the folder of `out`, so artifacts move together."""
    return os.path.relpath(Path(target).resolve(), (out.parent if str(out.parent) else Path(".")).resolve())


def _metadata(info: ModelInfo, provenance: dict) -> dict[str, str]:
    meta = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "family": info.family,
        "architecture": info.architecture,
        "config": _dumps(info.config),
        "layout": _dumps(info.layout.to_dict()),
        "task": info.task,
        "tokenizer_config": _dumps(info.tokenizer_config),
        "pooling": _dumps(info.pooling),
        "build_options": _dumps(info.build_options),
        "provenance": _dumps(provenance),
    }
    if info.tokenizer is not None:
        meta["tokenizer"] = info.tokenizer
    return {f"headprune.{k}": v for k, v in meta.items()}


def _dumps(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


# --- reading ------------------------------------------------------------------------
def read_metadata(path: str | os.PathLike) -> dict[str, str]:
    """The headprune metadata of a checkpoint, checked before anything is built."""
    path = Path(path)
    if path.is_dir():
        raise CheckpointError(f"{path}: a folder, not a checkpoint (make one with `headprune import {path}`)")
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    size = path.stat().st_size
    with open(path, "rb") as handle:
        head = handle.read(8)
    if len(head) < 8:
        raise CheckpointError(f"{path}: not a safetensors file (too short)")
    (header_len,) = struct.unpack("<Q", head)
    if header_len > MAX_HEADER_BYTES or 8 + header_len > size:
        raise CheckpointError(f"{path}: not a safetensors file, or truncated (bad header length)")
    try:
        with safe_open(str(path), framework="pt") as handle:
            raw = handle.metadata() or {}
    except Exception as exc:  # safetensors raises its own error types for corrupt files
        raise CheckpointError(f"{path}: corrupt safetensors file ({first_line(exc)})") from None
    meta = {k[len("headprune.") :]: v for k, v in raw.items() if k.startswith("headprune.")}
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{path}: a safetensors file without headprune metadata; use `headprune import` first")
    _check_version_and_keys(meta, path, "checkpoint")
    return meta


def _check_version_and_keys(meta: dict, where, what: str) -> None:
    if meta.get("version") != FORMAT_VERSION:
        raise CheckpointError(f"{where}: {what} format version {meta.get('version')!r} is not supported (need {FORMAT_VERSION})")
    missing = [k for k in _KEYS if k not in meta]
    if missing:
        raise CheckpointError(f"{where}: {what} metadata lacks {', '.join(missing)}")


def read_info(path: str | os.PathLike) -> ModelInfo:
    """Metadata only (cheap): of a checkpoint file, or of a folder from `headprune export --hf`."""
    meta = read_folder_metadata(path) if is_export_folder(path) else read_metadata(path)
    return ModelInfo(
        family=meta["family"],
        architecture=meta["architecture"],
        config=_loads(meta["config"], "config", path, dict),
        layout=Layout.from_dict(_loads(meta["layout"], "layout", path, dict)),
        task=meta["task"],
        tokenizer=meta.get("tokenizer"),
        tokenizer_config=_loads(meta.get("tokenizer_config", "{}"), "tokenizer_config", path, dict),
        pooling=_loads(meta.get("pooling", "{}"), "pooling", path, dict),
        build_options=_loads(meta.get("build_options", "{}"), "build_options", path, dict),
        provenance=_loads(meta.get("provenance", "{}"), "provenance", path, dict),
    )


def _loads(text: str, key: str, path, kind: type):
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        raise CheckpointError(f"{path}: metadata {key!r} is not valid JSON") from None
    if not isinstance(value, kind):
        raise CheckpointError(f"{path}: metadata {key!r} has the wrong type")
    return value


def load(path: str | os.PathLike) -> nn.Module:
    """Rebuild the model stored in a headprune checkpoint (or an exported HF-style folder),
    at exactly its stored shapes."""
    info = read_info(path)
    weights = folder_weights(path) if is_export_folder(path) else path
    adapter = adapter_for_family(info.family)
    try:
        model = adapter.build(info.config, info.architecture, info.build_options)
    except HeadpruneError:
        raise
    except Exception as exc:
        raise CheckpointError(f"{path}: cannot build {info.architecture} from the stored config ({first_line(exc)})") from None
    _cut_to_layout(model, info)
    _load_weights(model, weights)
    model.eval()
    info_of(model).loaded_from = (str(path), sha256_file(weights))
    return model


# --- exported HF-style folders (written by export.py) ----------------------------------
FOLDER_FORMAT = "headprune-folder"
FOLDER_INFO = "headprune.json"  # the layout and everything else transformers' config.json cannot say
FOLDER_WEIGHTS = "model.safetensors"
# headprune.json's "weights" names the file: model.safetensors when transformers can load the
# folder, headprune.safetensors when it cannot (hf_config.py); older folders have no key.
FOLDER_WEIGHT_NAMES = (FOLDER_WEIGHTS, "headprune.safetensors")


def is_export_folder(path: str | os.PathLike) -> bool:
    return Path(path).is_dir() and (Path(path) / FOLDER_INFO).is_file()


def read_folder_metadata(path: str | os.PathLike) -> dict[str, str]:
    """headprune.json (+ tokenizer.json) as the same string metadata a checkpoint carries."""
    folder = Path(path)
    try:
        data = json.loads((folder / FOLDER_INFO).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise CheckpointError(f"{folder / FOLDER_INFO}: not valid JSON ({first_line(exc)})") from None
    if not isinstance(data, dict) or data.get("format") != FOLDER_FORMAT:
        raise CheckpointError(f"{folder / FOLDER_INFO}: not a headprune export (format is not {FOLDER_FORMAT!r})")
    _check_version_and_keys(data, folder / FOLDER_INFO, "export")
    weights = data.get("weights", FOLDER_WEIGHTS)
    if weights not in FOLDER_WEIGHT_NAMES:  # a name, never a path out of the folder
        raise CheckpointError(f"{folder / FOLDER_INFO}: weights {weights!r} is not one of {', '.join(FOLDER_WEIGHT_NAMES)}")
    if not (folder / weights).is_file():
        raise CheckpointError(f"{folder}: no {weights}")
    meta = {k: v if isinstance(v, str) else _dumps(v) for k, v in data.items()}
    tokenizer = folder / "tokenizer.json"
    if tokenizer.is_file():
        meta["tokenizer"] = tokenizer.read_text(encoding="utf-8")
    return meta


def folder_weights(path: str | os.PathLike) -> Path:
    """The weights file of an exported folder (checked by read_folder_metadata)."""
    data = json.loads((Path(path) / FOLDER_INFO).read_text(encoding="utf-8"))
    return Path(path) / data.get("weights", FOLDER_WEIGHTS)


def _cut_to_layout(model: nn.Module, stored: ModelInfo) -> None:
    fresh = info_of(model).layout
    if fresh.num_heads != stored.layout.num_heads or fresh.num_kv_heads != stored.layout.num_kv_heads:
        raise CheckpointError("checkpoint layout does not match its config (head counts differ)")
    remove_heads = {
        layer: [h for h in range(stored.layout.num_heads[layer]) if h not in heads]
        for layer, heads in zip(stored.layout.layers, stored.layout.heads)
    }
    remove_layers = [i for i in range(stored.layout.num_layers) if i not in stored.layout.layers]
    try:
        apply_plan(model, remove_heads, remove_layers)
    except HeadpruneError as exc:
        raise CheckpointError(f"checkpoint layout cannot be applied: {exc}") from None
    if info_of(model).layout.kv_heads != stored.layout.kv_heads:
        raise CheckpointError("checkpoint layout's key/value heads do not match its query heads")
    model.headprune = ModelInfo(**{**stored.__dict__, "layout": info_of(model).layout})


def _load_weights(model: nn.Module, path) -> None:
    try:
        tensors = load_file(str(path))
    except Exception as exc:
        raise CheckpointError(f"{path}: cannot read tensors ({first_line(exc)})") from None
    expected = model.state_dict()
    unknown = sorted(set(tensors) - set(expected))
    if unknown:
        raise CheckpointError(f"{path}: unexpected tensor {unknown[0]!r} for {type(model).__name__}")
    _match_dtype(model, tensors)
    expected = model.state_dict()
    for name, tensor in tensors.items():
        want = expected[name]
        if tensor.shape != want.shape:
            raise CheckpointError(f"{path}: tensor {name!r} has shape {list(tensor.shape)}, the layout needs {list(want.shape)}")
        if tensor.dtype != want.dtype:
            raise CheckpointError(f"{path}: tensor {name!r} has dtype {tensor.dtype}, expected {want.dtype}")
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise CheckpointError(f"{path}: tensor {name!r} contains NaN or inf")
    missing = _missing_tensors(model, tensors)
    if missing:
        raise CheckpointError(f"{path}: tensor {missing[0]!r} is missing")
    model.load_state_dict(tensors, strict=False)


def _match_dtype(model: nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Build the model in the dtype its stored floating-point weights use."""
    dtypes = {t.dtype for t in tensors.values() if t.is_floating_point()}
    if len(dtypes) == 1:
        model.to(dtypes.pop())


def _missing_tensors(model: nn.Module, tensors: dict) -> list[str]:
    """State-dict entries absent from the file, allowing for tied (shared) weights."""
    by_storage: dict[int, list[str]] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        by_storage.setdefault(tensor.data_ptr(), []).append(name)
    return sorted(names[0] for names in by_storage.values() if not any(n in tensors for n in names))
