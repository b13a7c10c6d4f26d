"""Deployment: a pruned model as an HF-style folder (ONNX files: onnx.py).

The HF-style folder holds what transformers expects (config.json, weights,
tokenizer.json, tokenizer_config.json) plus headprune.json, where the layout, family,
architecture, task, pooling and provenance travel, so that `headprune_cli.load(folder)`
rebuilds the model at its exact shapes (see checkpoint.py). When a transformers config
can state the pruned layout (a uniform LLaMA-family layout), config.json does, and
transformers loads the folder without headprune; otherwise transformers is kept from
loading wrong shapes (hf_config.py). Sentence-transformers models also get their
modules and pooling (sentence_transformers.py), and on request onnx/model.onnx serves any layout.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from torch import nn

from headprune_cli.errors import HeadpruneError, UsageError
from headprune_cli.files.io import remember_sha256
from headprune_cli.files.outputs import check_folder, check_parent
from headprune_cli.files.temps import publish_folder, temp_folder
from headprune_cli.model.checkpoint import FOLDER_FORMAT, FOLDER_INFO, FORMAT_VERSION, model_specs
from headprune_cli.model.formats.hf_config import FolderConfig, folder_config
from headprune_cli.model.formats.onnx import export_onnx, require_onnx
from headprune_cli.model.formats.sentence_transformers import is_sentence_transformer, write_sentence_transformer
from headprune_cli.model.layout import ModelInfo, info_of
from headprune_cli.model.tensorfile import DEFAULT_MAX_SHARD, Spec, parse_size, write_folder_weights


# --- HF-style folder --------------------------------------------------------------------
def export_hf(
    model: nn.Module,
    folder: str | os.PathLike,
    force: bool = False,
    inputs=(),
    max_shard_size: str = DEFAULT_MAX_SHARD,
    specs: list[Spec] | None = None,
    with_onnx: bool | None = None,
    layout: FolderConfig | None = None,
    extra_files: dict[str, str] | None = None,
) -> Path:
    """Write `model` as an HF-style folder atomically (built beside it, then renamed).

    `specs` gives the weights when they do not live in `model` (a streamed export passes
    a model with meta parameters and specs that read the source file tensor by tensor).
    `with_onnx` also writes onnx/model.onnx (default: for sentence-transformers models),
    which needs the real weights in `model`. `layout` replaces the config transformers would
    get (vllm_export: a nemotron-nas config) and `extra_files` (name -> text) go beside it.
    """
    out = check_folder_output(folder, force, inputs)
    max_bytes = parse_size(max_shard_size)
    info = info_of(model)
    if with_onnx is None:
        with_onnx = is_sentence_transformer(info)
    if with_onnx:
        require_onnx()  # before the weights are written
    with temp_folder(out) as tmp:
        try:
            specs = model_specs(model) if specs is None else specs
            weights = _write_folder(model, tmp, specs, max_bytes, layout or folder_config(info))
            for name, text in (extra_files or {}).items():
                (tmp / name).write_text(text, encoding="utf-8")
            _write_serving_files(model, tmp, with_onnx)
            publish_folder(tmp, out)
        except OSError as exc:
            raise HeadpruneError(f"could not write {out}: {exc.strerror or exc}") from exc
    for name, digest in weights.items():  # hashed as written: not read back by `run`'s bookkeeping
        remember_sha256(out / name, digest)
    return out


def weights_written(folder: Path, weights: str) -> str:
    """How a folder's weights were written, for the `wrote` line: one file, or shards with an index."""
    if (folder / weights).is_file():
        return weights
    return f"{weights.removesuffix('.safetensors')}-*.safetensors shards with an index"


def check_folder_output(folder: str | os.PathLike, force: bool, inputs=(), what: str = "--hf folder") -> Path:
    """Refuse an output folder that overlaps an input, exists without --force, or is not ours to replace."""
    out = check_folder(folder, inputs, what, force)
    if os.path.lexists(out) and not force:
        raise UsageError(f"{out} exists; pass --force to overwrite it")
    check_parent(out)
    return out


def _write_folder(
    model: nn.Module, folder: Path, specs: list[Spec], max_bytes: int, layout: FolderConfig
) -> dict[str, str]:
    """Weights, configs and tokenizer into `folder`; returns the weight files' sha256."""
    info = info_of(model)
    # Tied weights appear once; the sorted header makes the bytes reproducible. A folder
    # transformers cannot load keeps its weights under a name it never looks for.
    weights = write_folder_weights(
        folder, specs, {"format": "pt"}, max_bytes, stem=layout.weights.removesuffix(".safetensors")
    )
    _write_json(folder / "config.json", layout.config)
    _write_json(folder / FOLDER_INFO, {**_folder_info(info), "weights": layout.weights})
    if info.tokenizer is not None:
        (folder / "tokenizer.json").write_text(info.tokenizer, encoding="utf-8")
        _write_json(
            folder / "tokenizer_config.json", {"tokenizer_class": "PreTrainedTokenizerFast", **info.tokenizer_config}
        )
    return weights


def _write_serving_files(model: nn.Module, folder: Path, with_onnx: bool) -> None:
    """sentence-transformers modules and onnx/model.onnx: what serves without headprune."""
    info = info_of(model)
    if is_sentence_transformer(info):
        write_sentence_transformer(info, folder)
    if with_onnx:
        (folder / "onnx").mkdir()
        export_onnx(model, folder / "onnx" / "model.onnx")
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())


def _folder_info(info: ModelInfo) -> dict:
    provenance = dict(info.provenance)
    if info.loaded_from is not None:  # the checkpoint this folder was exported from
        provenance["exported_from"] = info.loaded_from[1]
    return {
        "format": FOLDER_FORMAT,
        "version": FORMAT_VERSION,
        "family": info.family,
        "architecture": info.architecture,
        "config": info.config,  # the unpruned config: load() builds it, then cuts to the layout
        "layout": info.layout.to_dict(),
        "task": info.task,
        "tokenizer_config": info.tokenizer_config,
        "pooling": info.pooling,
        "build_options": info.build_options,
        "provenance": provenance,
    }


def _write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
