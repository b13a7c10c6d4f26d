"""The single-file checkpoint: safetensors weights plus self-describing string metadata.

Metadata keys (all strings, JSON where structured):
  headprune.format        "headprune-checkpoint"
  headprune.version       format version
  headprune.family        adapter family (bert, gpt2, llama, ...)
  headprune.architecture  class that rebuilds the unpruned model
  headprune.config        the unpruned model's config (JSON)
  headprune.layout        original indices of kept layers and heads, and of the FFN
                          neurons of layers whose FFN was cut (JSON)
  headprune.task          classification | causal-lm | embedding
  headprune.tokenizer     tokenizer.json text (absent for tokenizer-less models)
  headprune.tokenizer_config  special tokens and limits (JSON)
  headprune.pooling       sentence-transformers pooling (JSON)
  headprune.provenance    sha256 (and relative path) of parent, plan and root, and of the
                          pre-trained base a fine-tuned model came from when recorded (JSON)

Loading builds the unpruned architecture on the meta device (no memory, no random
initialisation; see materialize.py), cuts it to the stored layout with the same code that
pruning uses, and gives it the memory-mapped tensors of the file strictly: names, shapes
and dtypes are checked from the header before a weight is read, finiteness as each is
placed, and nothing is ever unpickled. The stored dtype is kept, and so are the float32
buffers transformers computes (RoPE inv_freq): `load` equals `from_pretrained` bit for bit.
Writing goes through tensorfile.write_file: sorted header, tensors streamed one by one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from headprune_cli.errors import ArchitectureError, CheckpointError, HeadpruneError, UsageError, first_line
from headprune_cli.files.io import atomic_write, check_regular, hash_ahead, remember_sha256, sha256_bytes, sha256_file
from headprune_cli.files.outputs import CHECKPOINT_FORMAT
from headprune_cli.model.arch import adapter_for_family
from headprune_cli.model.config_check import check_against_header, check_declared
from headprune_cli.model.filebacked import track
from headprune_cli.model.layout import Layout, ModelInfo, info_of
from headprune_cli.model.materialize import build_empty, check_entries, fill, stored_dtype, tied_groups
from headprune_cli.model.optional_imports import leave_out_scipy
from headprune_cli.model.surgery import apply_plan
from headprune_cli.model.tensorfile import Entry, Spec, read_entries, read_header, read_tensor, write_file

FORMAT = CHECKPOINT_FORMAT  # defined beside the output rule, which recognises our files without torch
FORMAT_VERSION = "1"
_KEYS = ("format", "version", "family", "architecture", "config", "layout", "task")


def save(model: nn.Module, path: str | os.PathLike, plan_sha: str | None = None, *, overwrite: bool = False) -> str:
    """Write `model` as a headprune checkpoint atomically; returns the file's sha256.

    An existing file is replaced only with `overwrite=True`, the rule every command keeps
    with --force. Provenance: the parent is the checkpoint the model was loaded from, the
    root the parent's root (or the parent itself when it was the root).
    """
    if not overwrite and os.path.lexists(path):
        raise UsageError(f"{path} exists; pass overwrite=True to replace it")
    info = info_of(model)
    # A checkpoint that read_info would refuse must never be written (import of a config
    # with negative head counts): the same checks, before any byte.
    check_declared(info.config, info.layout.num_heads, info.layout.num_kv_heads, f"not writing {path}")
    info.layout.validate()
    return write_checkpoint(path, model_specs(model), checkpoint_metadata(model, path, plan_sha))


def checkpoint_metadata(model: nn.Module, path: str | os.PathLike, plan_sha: str | None = None) -> dict[str, str]:
    info = info_of(model)
    return _metadata(info, _provenance(info, Path(path), plan_sha))


def write_checkpoint(path: str | os.PathLike, specs: list[Spec], metadata: dict[str, str]) -> str:
    """The one writer of checkpoint files (in-memory and streamed stages alike); returns
    the file's sha256 (hashed while writing; later sha256_file calls reuse it)."""
    digest = atomic_write(path, lambda tmp: write_file(tmp, specs, metadata))
    remember_sha256(path, digest)
    return digest


def model_specs(model: nn.Module) -> list[Spec]:
    """What a model's file holds: its state dict, each tied group once under its first name."""
    tensors = model.state_dict(keep_vars=True)
    return [
        Spec(names[0], tensors[names[0]].dtype, tuple(tensors[names[0]].shape), _producer(tensors[names[0]]))
        for names in tied_groups(model)
    ]


def _producer(tensor: torch.Tensor) -> Callable[[], torch.Tensor]:
    return lambda: tensor


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
        **_base(info.provenance, parent_path, out),
        **_source(info.provenance),
    }


def _source(provenance: dict) -> dict:
    """The file the root was imported from (a GGUF: name, sha256, quantization), carried down."""
    source = provenance.get("source")
    return {"source": source} if isinstance(source, dict) else {}


def _base(provenance: dict, parent_path: str, out: Path) -> dict:
    """The pre-trained model a fine-tuned checkpoint came from (`base`, its sha256), carried
    down every chain unchanged: tasks fine-tuned from one base keep naming it when pruned."""
    if not isinstance(provenance.get("base"), str) or not provenance["base"]:
        return {}
    path = provenance.get("base_path")
    return {
        "base": provenance["base"],
        "base_path": _relative(Path(parent_path).parent / path, out) if isinstance(path, str) else None,
    }


def _relative(target: str | os.PathLike, out: Path) -> str:
    """A path to `target` relative to the folder of `out`, so artifacts move together."""
    return os.path.relpath(Path(target).resolve(), out.parent.resolve())


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
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint file")
    check_regular(path, "checkpoint file", CheckpointError)  # a FIFO, a device, /proc: said so, never opened
    raw = read_header(path)[0]
    meta = {k[len("headprune.") :]: v for k, v in raw.items() if k.startswith("headprune.")}
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{path}: a safetensors file without headprune metadata; use `headprune import` first")
    _check_version_and_keys(meta, path, "checkpoint")
    return meta


def _check_version_and_keys(meta: dict, where, what: str) -> None:
    if meta.get("version") != FORMAT_VERSION:
        raise CheckpointError(
            f"{where}: {what} format version {meta.get('version')!r} is not supported (need {FORMAT_VERSION})"
        )
    missing = [k for k in _KEYS if k not in meta]
    if missing:
        raise CheckpointError(f"{where}: {what} metadata lacks {', '.join(missing)}")


def read_info(path: str | os.PathLike) -> ModelInfo:
    """Metadata only (cheap): of a checkpoint file, or of a folder from `headprune export --hf`."""
    meta = read_folder_metadata(path) if is_export_folder(path) else read_metadata(path)
    info = _info(meta, path)
    check_declared(info.config, info.layout.num_heads, info.layout.num_kv_heads, path)  # before anything is built
    return info


def _info(meta: dict[str, str], path) -> ModelInfo:
    return ModelInfo(
        family=meta["family"],
        architecture=meta["architecture"],
        config=_without_gguf_mark(_loads(meta["config"], "config", path, dict)),
        layout=Layout.from_dict(_loads(meta["layout"], "layout", path, dict)),
        task=meta["task"],
        tokenizer=meta.get("tokenizer"),
        tokenizer_config=_loads(meta.get("tokenizer_config", "{}"), "tokenizer_config", path, dict),
        pooling=_loads(meta.get("pooling", "{}"), "pooling", path, dict),
        build_options=_loads(meta.get("build_options", "{}"), "build_options", path, dict),
        provenance=_loads(meta.get("provenance", "{}"), "provenance", path, dict),
    )


def _without_gguf_mark(config: dict) -> dict:
    """A checkpoint's tensors are plain floats: a GGUF `quantization_config` in its config is the
    mark transformers put on a model it read from a GGUF, which imports before 2026-12-04 kept
    (an exported folder would name a .gguf it does not hold)."""
    mark = config.get("quantization_config")
    if isinstance(mark, dict) and mark.get("quant_method") == "gguf":
        return {k: v for k, v in config.items() if k != "quantization_config"}
    return config


def _loads(text: str, key: str, path, kind: type):
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):  # ValueError: also a number of more than 4300 digits
        raise CheckpointError(f"{path}: metadata {key!r} is not valid JSON") from None
    if not isinstance(value, kind):
        raise CheckpointError(f"{path}: metadata {key!r} has the wrong type")
    return value


def load(path: str | os.PathLike, per_tensor: bool = False) -> nn.Module:
    """Rebuild the model stored in a headprune checkpoint (or an exported HF-style folder),
    at exactly its stored shapes, in its stored dtype, from the memory-mapped file.

    `per_tensor`: each tensor mapped on its own and none of it resident after loading, so
    that a stage walking the model can give each block's pages back (model/filebacked.py)."""
    info = read_info(path)
    entries = read_entries(weights_path(path))
    _check_header(info, entries, path)
    _hash_weights_ahead(path, entries)
    model = build_layout(info, stored_dtype(entries), path)
    if per_tensor:
        fill(model, entries, read_tensor, path)
        track(model, entries, path)
    else:
        handles: dict[str, object] = {}
        try:
            fill(model, entries, lambda entry: _mapped(handles, entry), path)
        finally:
            handles.clear()  # the tensors keep their mappings alive; the handles are not needed
    model.eval()
    info_of(model).loaded_from = (str(path), weights_sha(path))
    return model


def build_layout(info: ModelInfo, dtype: torch.dtype, where) -> nn.Module:
    """The stored model at its stored layout, parameters on the meta device (no weights)."""
    leave_out_scipy()  # before transformers' model code is imported (model/optional_imports.py)
    try:
        adapter = adapter_for_family(info.family)
    except ArchitectureError as exc:  # a family this version does not know: name the file that claims it
        raise CheckpointError(f"{where}: {exc}") from None
    try:
        model = build_empty(lambda: adapter.build(info.config, info.architecture, info.build_options), dtype)
    except HeadpruneError:
        raise
    except Exception as exc:
        raise CheckpointError(
            f"{where}: cannot build {info.architecture} from the stored config ({first_line(exc)})"
        ) from None
    _cut_to_layout(model, info, where)
    return model


def read_layout_only(path: str | os.PathLike, hashed: bool = False) -> nn.Module:
    """The model at its stored shapes with meta parameters, checked against the file's
    header; no weight is read (what `inspect` and the streamed stages need). `hashed`
    records the weights' sha256 for provenance, as `load` does."""
    info = read_info(path)
    entries = read_entries(weights_path(path))
    _check_header(info, entries, path)
    if hashed:
        _hash_weights_ahead(path, entries)
    model = build_layout(info, stored_dtype(entries), path)
    check_entries(model, entries, path)
    model.eval()
    if hashed:
        info_of(model).loaded_from = (str(path), weights_sha(path))
    return model


def _check_header(info: ModelInfo, entries: dict[str, Entry], path) -> None:
    layout = info.layout
    every_ffn_cut = bool(layout.ffn) and set(layout.ffn) == set(layout.layers)
    shapes = {n: e.shape for n, e in entries.items()}
    check_against_header(info.config, shapes, sum(e.nbytes for e in entries.values()), path, every_ffn_cut)


def _mapped(handles: dict, entry: Entry) -> torch.Tensor:
    from safetensors import safe_open  # noqa: PLC0415 (looked up when called: tests replace it)

    if entry.path not in handles:
        try:
            handles[entry.path] = safe_open(entry.path, framework="pt")
        except Exception as exc:  # safetensors raises its own error types for corrupt files
            raise CheckpointError(f"{entry.path}: corrupt safetensors file ({first_line(exc)})") from None
    return handles[entry.path].get_tensor(entry.name)


def weights_path(path: str | os.PathLike) -> Path:
    """The weights of a checkpoint file or export folder (its file, or its shard index)."""
    if not is_export_folder(path):
        return Path(path)
    data = json.loads((Path(path) / FOLDER_INFO).read_text(encoding="utf-8"))  # checked by read_info
    single = Path(path) / data.get("weights", FOLDER_WEIGHTS)
    return single if single.is_file() else single.with_name(_index_of(single.name))


def _hash_weights_ahead(path: str | os.PathLike, entries: dict[str, Entry]) -> None:
    """Hash the weight files (for provenance, needed last) while the model is built."""
    hash_ahead(weights_path(path))
    for file in sorted({e.path for e in entries.values()}):
        hash_ahead(file)


def weights_sha(path: str | os.PathLike) -> str:
    """sha256 of the weights; of a sharded folder, of its index and every shard's sha256."""
    weights = weights_path(path)
    if not weights.name.endswith(".index.json"):
        return sha256_file(weights)
    shards = sorted({e.path for e in read_entries(weights).values()})
    listing = [f"{weights.name} {sha256_file(weights)}", *(f"{Path(s).name} {sha256_file(s)}" for s in shards)]
    return sha256_bytes("\n".join(listing).encode())


# --- exported HF-style folders (written by export.py) ----------------------------------
FOLDER_FORMAT = "headprune-folder"
FOLDER_INFO = "headprune.json"  # the layout and everything else transformers' config.json cannot say
FOLDER_WEIGHTS = "model.safetensors"
# headprune.json's "weights" names the file: model.safetensors when transformers can load the
# folder, headprune.safetensors when it cannot (formats/hf_config.py); older folders have no key.
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
        raise CheckpointError(
            f"{folder / FOLDER_INFO}: weights {weights!r} is not one of {', '.join(FOLDER_WEIGHT_NAMES)}"
        )
    if not (folder / weights).is_file() and not (folder / _index_of(weights)).is_file():
        raise CheckpointError(f"{folder}: no {weights} (or {_index_of(weights)})")
    meta = {k: v if isinstance(v, str) else _dumps(v) for k, v in data.items()}
    tokenizer = folder / "tokenizer.json"
    if tokenizer.is_file():
        meta["tokenizer"] = tokenizer.read_text(encoding="utf-8")
    return meta


def _index_of(weights: str) -> str:
    """The shard index that stands for a weights file name when the weights are sharded."""
    return f"{weights}.index.json"


def _cut_to_layout(model: nn.Module, stored: ModelInfo, where) -> None:
    """Remove what the stored layout lacks. The model was built from the stored config,
    whose head counts read_info has checked against the layout's (check_declared)."""
    layout = stored.layout
    remove_heads = {
        layer: [h for h in range(layout.num_heads[layer]) if h not in heads]
        for layer, heads in zip(layout.layers, layout.heads)
    }
    remove_layers = [i for i in range(layout.num_layers) if i not in layout.layers]
    built = info_of(model).layout.num_ffn
    if layout.num_ffn and layout.num_ffn != built:
        raise CheckpointError(
            f"{where}: its layout's FFN widths {_short(layout.num_ffn)} differ from the config's {_short(built)}"
        )
    remove_ffn = {layer: _missing(kept, layout.num_ffn[layer]) for layer, kept in layout.ffn.items()}
    try:
        apply_plan(model, remove_heads, remove_layers, remove_ffn)
    except HeadpruneError as exc:
        raise CheckpointError(f"{where}: its layout cannot be applied: {exc}") from None
    if info_of(model).layout.kv_heads != layout.kv_heads:
        raise CheckpointError(f"{where}: its layout's key/value heads do not match its query heads")
    # nn.Module.__setattr__ is typed for Tensor | Module values; a plain attribute is what this is
    model.headprune = ModelInfo(**{**stored.__dict__, "layout": info_of(model).layout})  # type: ignore[assignment]


def _missing(kept: list[int], width: int) -> list[int]:
    present = set(kept)
    return [n for n in range(width) if n not in present]


def _short(values: list[int]) -> str:
    return str(values) if len(values) <= 8 else f"[{', '.join(map(str, values[:8]))}, ...]"
