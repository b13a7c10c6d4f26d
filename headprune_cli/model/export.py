"""Deployment: a pruned model as an HF-style folder or as one ONNX file.

The HF-style folder holds what transformers expects (config.json, model.safetensors,
tokenizer.json, tokenizer_config.json) plus headprune.json: transformers v5 configs
cannot say how many heads each layer keeps, so the layout, family, architecture, task,
pooling and provenance travel there, and `headprune_cli.load(folder)` rebuilds the model
at its exact shapes from it (see checkpoint.py).

The ONNX file is traced with torch's TorchScript exporter (`dynamo=False`): on every
family, pruned or not, it exports in about a second and matches PyTorch to 1e-6, while
the dynamo exporter takes 5-40 s per tiny model and needs onnxscript. Each file is run
in onnxruntime against PyTorch before it is moved into place, at two shapes, so a file
that would not reproduce the model (or whose dynamic axes do not work) is never written.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from headprune_cli.model.checkpoint import FOLDER_FORMAT, FOLDER_INFO, FORMAT_VERSION, model_specs
from headprune_cli.model.tensorfile import DEFAULT_MAX_SHARD, Spec, parse_size, write_folder_weights
from headprune_cli.errors import HeadpruneError, NumericalError, UsageError, first_line
from headprune_cli.fileio import atomic_write
from headprune_cli.outputs import check_folder, check_parent
from headprune_cli.stages.report.latency import max_sequence
from headprune_cli.model.layout import ModelInfo, info_of

ONNX_ATOL = 1e-4  # largest |onnxruntime - pytorch| accepted for an fp32 model
MAX_ONNX_BYTES = 2 * 1024**3  # protobuf's limit for a single-file model


# --- HF-style folder --------------------------------------------------------------------
def export_hf(
    model: nn.Module, folder: str | os.PathLike, force: bool = False, inputs=(), max_shard_size: str = DEFAULT_MAX_SHARD,
    specs: list[Spec] | None = None,
) -> Path:
    """Write `model` as an HF-style folder atomically (built beside it, then renamed).

    `specs` gives the weights when they do not live in `model` (a streamed export passes
    a model with meta parameters and specs that read the source file tensor by tensor).
    """
    out = check_folder_output(folder, force, inputs)
    max_bytes = parse_size(max_shard_size)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; a model folder is for sharing
        _write_folder(model, tmp, model_specs(model) if specs is None else specs, max_bytes)
        _replace_folder(tmp, out)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise HeadpruneError(f"could not write {out}: {exc.strerror or exc}") from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def check_folder_output(folder: str | os.PathLike, force: bool, inputs=()) -> Path:
    """Refuse an output folder that overlaps an input, exists without --force, or is not ours to replace."""
    out = check_folder(folder, inputs, "--hf folder")
    if os.path.lexists(out) and not force:
        raise UsageError(f"{out} exists; pass --force to overwrite it")
    check_parent(out)
    return out


def _write_folder(model: nn.Module, folder: Path, specs: list[Spec], max_bytes: int) -> None:
    info = info_of(model)
    # Tied weights appear once; the sorted header makes the bytes reproducible.
    write_folder_weights(folder, specs, {"format": "pt"}, max_bytes)
    _write_json(folder / "config.json", _hf_config(model, info))
    _write_json(folder / FOLDER_INFO, _folder_info(info))
    if info.tokenizer is not None:
        (folder / "tokenizer.json").write_text(info.tokenizer, encoding="utf-8")
        _write_json(folder / "tokenizer_config.json", {"tokenizer_class": "PreTrainedTokenizerFast", **info.tokenizer_config})
    for path in folder.iterdir():
        with open(path, "rb") as handle:
            os.fsync(handle.fileno())


def _hf_config(model: nn.Module, info: ModelInfo) -> dict:
    """The model's current config: right layer count; per-layer heads live in headprune.json."""
    config = model.config.to_dict()
    config["architectures"] = [info.architecture]
    return config


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


def _replace_folder(tmp: Path, out: Path) -> None:
    if not out.exists():
        os.replace(tmp, out)
        return
    old = out.with_name(f".{out.name}.old-{uuid.uuid4().hex[:8]}")
    os.replace(out, old)
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)


# --- ONNX -----------------------------------------------------------------------------
@dataclass
class OnnxExport:
    path: str
    inputs: list[str]
    outputs: list[str]
    opset: int
    max_abs_diff: float  # onnxruntime vs PyTorch on the verification inputs


class _Forward(nn.Module):
    """Positional tensors in, one tensor out: what the tracer and onnxruntime need."""

    def __init__(self, model: nn.Module, names: list[str], output: str, causal: bool):
        super().__init__()
        self.model, self.names, self.output, self.causal = model, names, output, causal

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        kwargs = dict(zip(self.names, tensors))
        if self.causal:
            kwargs["use_cache"] = False  # a KV cache would become extra graph outputs
        return getattr(self.model(**kwargs), self.output)


def export_onnx(model: nn.Module, path: str | os.PathLike, seq_len: int = 16, opset: int = 17) -> OnnxExport:
    """Export `model` to ONNX with dynamic batch (and sequence) axes, verified in onnxruntime."""
    _require_onnx()
    if sum(p.numel() * p.element_size() for p in model.parameters()) >= MAX_ONNX_BYTES:
        raise UsageError("models of 2 GB or more need ONNX external data, which export does not write yet")
    model.eval()
    sample = example_inputs(model, batch=2, seq_len=seq_len)
    names = list(sample)
    with torch.no_grad():
        out = model(**sample)
    output = "logits" if getattr(out, "logits", None) is not None else "last_hidden_state"
    wrapper = _Forward(model, names, output, info_of(model).task == "causal-lm").eval()
    result = OnnxExport(str(path), names, [output], opset, 0.0)

    def write(tmp: str) -> None:
        _trace(wrapper, sample, tmp, names, output, opset)
        checks = [sample, example_inputs(model, batch=3, seq_len=max(1, seq_len // 2 + 1), seed=1)]
        result.max_abs_diff = max(_ort_diff(tmp, wrapper, inputs) for inputs in checks)
        if not result.max_abs_diff <= ONNX_ATOL:
            raise NumericalError(f"ONNX output differs from PyTorch by {result.max_abs_diff:.3g} (> {ONNX_ATOL}); not written")

    atomic_write(path, write)
    return result


def example_inputs(model: nn.Module, batch: int, seq_len: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random inputs of the model's kind; one row padded so the mask path gets traced."""
    gen = torch.Generator().manual_seed(seed)
    config = model.config
    if info_of(model).family == "vit":
        size = config.image_size
        return {"pixel_values": torch.randn(batch, config.num_channels, size, size, generator=gen)}
    limit = max_sequence(model)
    if limit is not None and seq_len > limit:
        raise UsageError(f"--seq-len {seq_len} exceeds the model's {limit} positions")
    ids = torch.randint(0, config.vocab_size, (batch, seq_len), generator=gen)
    mask = torch.ones_like(ids)
    if seq_len > 2:
        mask[0, -2:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _trace(wrapper: nn.Module, sample: dict, path: str, names: list[str], output: str, opset: int) -> None:
    axes = {n: {0: "batch"} if n == "pixel_values" else {0: "batch", 1: "sequence"} for n in names}
    # A token-level output follows the input's sequence axis; a classifier's logits and
    # ViT's patch axis (fixed by the image size) do not.
    with torch.no_grad():
        token_level = "input_ids" in names and wrapper(*sample.values()).dim() == 3
    axes[output] = {0: "batch", 1: "sequence"} if token_level else {0: "batch"}
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # tracer warnings about Python control flow
            torch.onnx.export(
                wrapper, tuple(sample.values()), path, dynamo=False, input_names=names,
                output_names=[output], dynamic_axes=axes, opset_version=opset,
            )
    except HeadpruneError:
        raise
    except Exception as exc:
        raise HeadpruneError(f"ONNX export failed: {first_line(exc)}") from None


def _ort_diff(path: str, wrapper: nn.Module, inputs: dict) -> float:
    import onnxruntime as ort

    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    got = session.run(None, {k: v.numpy() for k, v in inputs.items()})[0]
    with torch.no_grad():
        want = wrapper(*inputs.values())
    if tuple(got.shape) != tuple(want.shape):
        return float("inf")
    return float((torch.from_numpy(got) - want.float()).abs().max())


def _require_onnx() -> None:
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError:
        raise HeadpruneError("ONNX export needs the onnx extra: pip install 'headprune[onnx]'") from None
