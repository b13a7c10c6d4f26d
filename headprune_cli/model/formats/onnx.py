"""ONNX export: one graph per model, checked in onnxruntime before it is moved into place.

Graphs are traced with torch's TorchScript exporter (`dynamo=False`): on every family,
pruned or not, it exports in about a second and matches PyTorch to 1e-6, while the
dynamo exporter takes 5-40 s per tiny model and needs onnxscript. ONNX has no notion of
"heads per layer": the graph holds each layer's exact shapes, so any pruned layout
exports, uneven ones included.

Causal LMs export for decoding, in the layout optimum and onnxruntime-genai use:
inputs input_ids, attention_mask (past + new tokens), position_ids and
past_key_values.{i}.key/value; outputs logits and present.{i}.key/value. Every layer
has its own KV-head count, so the cache of a pruned layer is smaller.

Each file is run in onnxruntime against PyTorch at two shapes (for causal LMs one of
them with an empty past, i.e. the prompt step) so a file that would not reproduce the
model, or whose dynamic axes do not work, is never written. A model of 2 GB or more
(protobuf's limit for one file) is written with its weights as ONNX external data in
one FILE.data beside FILE.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import DynamicCache

from headprune_cli.errors import HeadpruneError, NumericalError, UsageError, first_line
from headprune_cli.files.outputs import check_output
from headprune_cli.files.temps import publish, temp_folder
from headprune_cli.model.arch import adapter_for
from headprune_cli.model.layout import info_of

ONNX_ATOL = 1e-4  # largest |onnxruntime - pytorch| accepted for an fp32 model
MAX_ONNX_BYTES = 2 * 1024**3  # protobuf's limit for a single-file model; from here on, external data


@dataclass
class OnnxExport:
    path: str
    inputs: list[str]
    outputs: list[str]
    opset: int
    max_abs_diff: float  # onnxruntime vs PyTorch on the verification inputs
    external_data: str | None = None  # FILE.data when the weights live beside the graph


class _Forward(nn.Module):
    """Positional tensors in, one tensor out: what the tracer and onnxruntime need."""

    def __init__(self, model: nn.Module, names: list[str], output: str):
        super().__init__()
        self.model, self.names, self.output = model, names, output

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        return getattr(self.model(**dict(zip(self.names, tensors))), self.output)


class _Decoder(nn.Module):
    """input_ids, attention_mask, position_ids, past (key, value per layer) ->
    logits, present (key, value per layer)."""

    def __init__(self, model: nn.Module, layers: int):
        super().__init__()
        self.model, self.layers = model, layers

    def forward(self, input_ids, attention_mask, position_ids, *past):

        cache = DynamicCache()
        for i in range(self.layers):
            cache.update(past[2 * i], past[2 * i + 1], i)
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
        )
        present = [t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)]
        return (out.logits, *present)


def export_onnx(
    model: nn.Module,
    path: str | os.PathLike,
    seq_len: int = 16,
    opset: int = 17,
    force: bool = False,
    inputs: Iterable[str | os.PathLike] = (),
) -> OnnxExport:
    """Export `model` to ONNX with dynamic batch and sequence axes (and past key/values for
    causal LMs), verified in onnxruntime. `inputs` are the files the command read: FILE.data,
    an output too, goes through the same rule as FILE (never an input, replaced only with force)."""
    require_onnx()
    model.eval()
    info = info_of(model)
    if info.task == "causal-lm" and not adapter_for(model).keeps_kv_cache:
        raise UsageError(
            f"ONNX export of {info.family} causal LMs is not supported (supported: LLaMA, Mistral, Qwen2, Qwen3, GPT-2)"
        )
    external = needs_external_data(model)
    out = Path(path)
    data = out.with_name(out.name + ".data")
    if external:
        check_output(data, force, inputs)
    spec = _decoder_spec(model, seq_len) if info.task == "causal-lm" else _plain_spec(model, seq_len)
    result = OnnxExport(str(out), spec.names, spec.outputs, opset, 0.0, data.name if external else None)
    with temp_folder(out) as tmp:
        try:
            graph = tmp / out.name
            _trace(spec, graph, opset)
            if external:
                _to_external_data(graph, data.name)
            result.max_abs_diff = max(_ort_diff(graph, spec, inputs) for inputs in spec.checks)
            if not result.max_abs_diff <= ONNX_ATOL:
                raise NumericalError(
                    f"ONNX output differs from PyTorch by {result.max_abs_diff:.3g} (> {ONNX_ATOL}); not written"
                )
            move_into_place(graph, out, tmp / data.name if external else None, data)
        except OSError as exc:
            raise HeadpruneError(f"could not write {out}: {exc.strerror or exc}") from exc
    return result


def needs_external_data(model: nn.Module) -> bool:
    """Whether the model's weights reach protobuf's single-file limit (the graph then keeps
    them in FILE.data beside it)."""
    seen = {p.data_ptr(): p.numel() * p.element_size() for p in model.parameters()}  # tied weights once
    return sum(seen.values()) >= MAX_ONNX_BYTES


@dataclass
class _Spec:
    wrapper: nn.Module
    sample: tuple  # traced inputs, positional
    names: list[str]
    outputs: list[str]
    axes: dict
    checks: list[tuple]  # inputs to compare onnxruntime with PyTorch on


def _plain_spec(model: nn.Module, seq_len: int) -> _Spec:
    sample = example_inputs(model, batch=2, seq_len=seq_len)
    names = list(sample)
    with torch.no_grad():
        out = model(**sample)
    output = "logits" if getattr(out, "logits", None) is not None else "last_hidden_state"
    wrapper = _Forward(model, names, output).eval()
    axes = {n: {0: "batch"} if n == "pixel_values" else {0: "batch", 1: "sequence"} for n in names}
    # A token-level output follows the input's sequence axis; a classifier's logits and
    # ViT's patch axis (fixed by the image size) do not.
    token_level = "input_ids" in names and getattr(out, output).dim() == 3
    axes[output] = {0: "batch", 1: "sequence"} if token_level else {0: "batch"}
    second = example_inputs(model, batch=3, seq_len=max(1, seq_len // 2 + 1), seed=1)
    return _Spec(
        wrapper, tuple(sample.values()), names, [output], axes, [tuple(sample.values()), tuple(second.values())]
    )


def _decoder_spec(model: nn.Module, seq_len: int) -> _Spec:
    layers = len(info_of(model).layout.layers)
    past_names = [f"past_key_values.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]
    present = [f"present.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]
    names = ["input_ids", "attention_mask", "position_ids", *past_names]
    axes = {
        "input_ids": {0: "batch", 1: "sequence"},
        "attention_mask": {0: "batch", 1: "total_sequence"},
        "position_ids": {0: "batch", 1: "sequence"},
        "logits": {0: "batch", 1: "sequence"},
        **{n: {0: "batch", 2: "past_sequence"} for n in past_names},
        **{n: {0: "batch", 2: "total_sequence"} for n in present},
    }
    wrapper = _Decoder(model, layers).eval()
    past = max(1, seq_len // 2)
    sample = decoder_inputs(model, batch=2, seq_len=seq_len, past=past)
    checks = [sample, decoder_inputs(model, batch=3, seq_len=max(1, seq_len // 2 + 1), past=0, seed=1)]
    return _Spec(wrapper, sample, names, ["logits", *present], axes, checks)


def decoder_inputs(model: nn.Module, batch: int, seq_len: int, past: int, seed: int = 0) -> tuple:
    """A decoding step's inputs: new tokens after `past` cached ones (random cache values;
    one row left-padded so the mask path gets traced)."""
    gen = torch.Generator().manual_seed(seed)
    ids = example_inputs(model, batch=batch, seq_len=seq_len, seed=seed)["input_ids"]
    mask = torch.ones(batch, past + seq_len, dtype=torch.long)
    if past + seq_len > 2:
        mask[0, :1] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, past:]
    dtype = next(model.parameters()).dtype
    head_dim = adapter_for(model).head_dim(model)
    cache = []
    for layer in info_of(model).layout.kv_heads:
        shape = (batch, len(layer), past, head_dim)
        cache += [torch.randn(shape, generator=gen).to(dtype), torch.randn(shape, generator=gen).to(dtype)]
    return (ids, mask, positions, *cache)


def example_inputs(model: nn.Module, batch: int, seq_len: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random inputs of the model's kind; one row padded so the mask path gets traced."""
    adapter = adapter_for(model)
    limit = adapter.max_positions(model)
    if limit is not None and seq_len > limit:  # None for ViT: its length comes from the image size
        raise UsageError(f"--seq-len {seq_len} exceeds the model's {limit} positions")
    return adapter.example_inputs(model, batch, seq_len, seed=seed, pad_first_row=True)


def _trace(spec: _Spec, path: Path, opset: int) -> None:
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # tracer warnings about Python control flow
            torch.onnx.export(
                spec.wrapper,
                spec.sample,
                str(path),
                dynamo=False,
                input_names=spec.names,
                output_names=spec.outputs,
                dynamic_axes=spec.axes,
                opset_version=opset,
            )
    except HeadpruneError:
        raise
    except Exception as exc:
        raise HeadpruneError(f"ONNX export failed: {first_line(exc)}") from None


def _to_external_data(graph: Path, location: str) -> None:
    """Rewrite `graph` with all weights in one file `location` beside it (deterministic
    order: the graph's initializer order)."""
    import onnx  # noqa: PLC0415 (keeps onnx out of this module's import)

    proto = onnx.load(str(graph))  # also reads any per-tensor files the exporter wrote
    for stray in graph.parent.iterdir():
        if stray != graph:
            stray.unlink()
    onnx.save_model(
        proto, str(graph), save_as_external_data=True, all_tensors_to_one_file=True, location=location, size_threshold=0
    )


def _ort_diff(path: Path, spec: _Spec, inputs: tuple) -> float:
    import onnxruntime as ort  # noqa: PLC0415 (keeps onnxruntime out of this module's import)

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(None, {name: t.numpy() for name, t in zip(spec.names, inputs)})
    with torch.no_grad():
        want = spec.wrapper(*inputs)
    want = want if isinstance(want, tuple) else (want,)
    if [tuple(g.shape) for g in got] != [tuple(w.shape) for w in want]:
        return float("inf")
    return max(float((torch.from_numpy(g) - w.float()).abs().max()) if w.numel() else 0.0 for g, w in zip(got, want))


def move_into_place(graph: Path, out: Path, data_tmp: Path | None = None, data: Path | None = None) -> None:
    """Sync the finished graph (and its external data) and publish them, the data first."""
    for path in (graph, data_tmp):
        if path is not None:
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
            os.chmod(path, 0o644)
    if data_tmp is not None and data is not None:  # the data first: a graph never points at a missing file
        publish(data_tmp, data)
    publish(graph, out)  # never over a new output another process made meanwhile


def require_onnx() -> None:
    try:
        import onnx  # noqa: F401, PLC0415 (an optional extra: is it installed?)
        import onnxruntime  # noqa: F401, PLC0415 (an optional extra: is it installed?)
    except ImportError:
        raise HeadpruneError("ONNX export needs the onnx extra: pip install 'headprune[onnx]'") from None
