"""`report --onnx FILE`: the shipped ONNX file, run in onnxruntime, stands in for the pruned
PyTorch model in quality, speed and the gates, so the CI gate covers what is deployed.

The checkpoint (`--model`) still gives the facts a graph does not state (its tokenizer,
layout, params, FLOPs, head map); the file must come from it: a file `export --quantize`
wrote names the checkpoint's sha256 in its metadata and is refused when that differs, and
any file is refused when its output is not the checkpoint's (name, or width on the same
input). Evaluation goes through the same code as PyTorch models (objectives.evaluate):
OnnxModel answers `model(**inputs)` with the output the graph computes. Both models are
timed with the same thread count (torch.set_num_threads, onnxruntime's intra-op pool).
The report's `shipped` section says what ran and keeps the checkpoint's own metrics
beside it, so a report shows what quantization cost on top of the cut.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

from headprune_cli.data import readers as data_mod
from headprune_cli.errors import CheckpointError, HeadpruneError, UsageError, first_line
from headprune_cli.files.io import sha256_file
from headprune_cli.model.formats.onnx import example_inputs, require_onnx
from headprune_cli.model.formats.onnx_quantize import QUANTIZATION_KEY, SOURCE_KEY, read_stamp
from headprune_cli.model.layout import info_of
from headprune_cli.stages import objectives
from headprune_cli.stages.objectives import metric_dicts

ENGINE = "onnxruntime"


class OnnxModel(nn.Module):
    """An ONNX file in an onnxruntime session, called like the checkpoint it was exported from."""

    def __init__(self, path: Path, checkpoint: nn.Module, threads: int):
        import onnxruntime as ort  # noqa: PLC0415 (keeps onnxruntime out of this module's import)

        super().__init__()
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        try:
            self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own types (Fail, InvalidGraph)
            raise CheckpointError(f"{path}: onnxruntime cannot load it: {first_line(exc)}") from None
        self.config = checkpoint.config  # adapter_for and the data readers read the family from here
        self.headprune = info_of(checkpoint)  # info_of: tokenizer, task, pooling, layout
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_name = self.session.get_outputs()[0].name

    def forward(self, **inputs: torch.Tensor) -> SimpleNamespace:
        missing = [n for n in self.input_names if n not in inputs]
        if missing:
            raise UsageError(f"the ONNX file takes {', '.join(missing)}, which the checkpoint's inputs do not have")
        feeds = {n: inputs[n].detach().cpu().numpy() for n in self.input_names}
        out = self.session.run([self.output_name], feeds)[0]
        return SimpleNamespace(**{self.output_name: torch.from_numpy(out)})


def check_onnx_options(onnx: Path | None, device: str, dtype: str) -> None:
    """Before any work: onnxruntime runs on the CPU in the file's own dtypes."""
    if onnx is not None:
        check_shipped_file("--onnx", onnx, ENGINE, device, dtype)


def check_shipped_file(flag: str, path: Path, engine: str, device: str, dtype: str) -> None:
    """A shipped file (--onnx, --gguf) runs in its engine on the CPU in its own dtypes, and must exist."""
    if device not in ("auto", "cpu"):
        raise UsageError(f"{flag} runs the file in {engine} on the CPU; --device {device} does not go with it")
    if dtype not in ("auto", "float32"):
        raise UsageError(f"{flag} runs the file in its own dtypes; --dtype {dtype} does not go with it")
    if not path.is_file():
        raise UsageError(f"{flag} {path}: no such file")


def load_shipped(path: Path, checkpoint: nn.Module, threads: int) -> tuple[OnnxModel, dict]:
    """The file as a model, and the report's `shipped` section (checkpoint metrics added later)."""

    require_onnx()
    info = info_of(checkpoint)
    if info.task == "causal-lm":
        raise UsageError("--onnx evaluates encoders (classifiers, embedding models); causal LMs are not supported")
    try:
        stamp = read_stamp(path)
    except Exception as exc:  # noqa: BLE001 - onnx raises protobuf's DecodeError and others
        raise CheckpointError(f"{path}: not an ONNX file ({first_line(exc)})") from None
    source = stamp.get(SOURCE_KEY)
    sha = info.loaded_from[1] if info.loaded_from else ""
    if source and source != sha:
        raise CheckpointError(
            f"--onnx {path} was exported from checkpoint {source[:12]}, not from --model ({sha[:12]}); "
            "pass the checkpoint it came from"
        )
    model = OnnxModel(path, checkpoint, threads)
    _check_output_matches(model, checkpoint, path)
    import onnxruntime as ort  # noqa: PLC0415 (keeps onnxruntime out of this module's import)

    section = {
        "path": str(path),
        "sha256": sha256_file(path),
        "engine": ENGINE,
        "engine_version": ort.__version__,
        "quantization": stamp.get(QUANTIZATION_KEY),
        "source_checked": bool(source),
        "bytes": _file_bytes(path),
        "checkpoint_metrics": [],
    }
    return model, section


def _file_bytes(path: Path) -> int:
    data = path.with_name(path.name + ".data")  # export's external weights, when there are any
    return os.path.getsize(path) + (os.path.getsize(data) if data.is_file() else 0)


def _check_output_matches(model: OnnxModel, checkpoint: nn.Module, path: Path) -> None:
    """Same output name and shape as the checkpoint on one input: a file of another model is refused."""

    sample = example_inputs(checkpoint, batch=1, seq_len=4)
    with torch.no_grad():
        want = checkpoint(**sample)
    want = getattr(want, model.output_name, None)
    try:
        got = getattr(model(**sample), model.output_name)
    except HeadpruneError:
        raise
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own types at run time
        raise CheckpointError(
            f"--onnx {path}: onnxruntime cannot run it on the model's inputs: {first_line(exc)}"
        ) from None
    if want is None or tuple(got.shape) != tuple(want.shape):
        raise CheckpointError(
            f"--onnx {path} gives {model.output_name} of shape {tuple(got.shape)}, the checkpoint "
            f"{'no ' + model.output_name if want is None else tuple(want.shape)}: it is not an export of --model"
        )


def shipped_line(shipped: dict) -> str:
    """One sentence for the terminal and Markdown: what ran in the engine."""
    quant = shipped["quantization"] or "not quantized by headprune (fp32)"
    if shipped.get("kv_cache"):  # llama.cpp: the file's type and the KV cache's
        quant = f"{quant}, {shipped['kv_cache']} KV cache"
    return (
        f"Shipped model: {shipped['path']} in {shipped['engine']} {shipped['engine_version']} ({quant}, "
        f"{shipped['bytes'] / 1e6:.1f} MB) stands for the pruned model in quality, latency and gates."
    )


def checkpoint_metrics(baseline: nn.Module, checkpoint: nn.Module, data, batch_size: int, max_length: int) -> list:
    """The PyTorch checkpoint's metrics on the report's data: what the cut alone kept."""

    dataset = data_mod.read_data(data, checkpoint, max_length=max_length)
    objective = objectives.default_objective(checkpoint)
    metrics = objectives.evaluate(checkpoint, dataset, objective, reference=baseline, batch_size=batch_size)
    return metric_dicts(metrics)
