"""ONNX int8: onnxruntime's own quantizer applied to the graph export_onnx verified.

Quantization stacks on the cut: the pruned checkpoint is exported to fp32 ONNX (checked
against PyTorch to 1e-4, formats/onnx.py), then onnxruntime.quantization rewrites it:
- int8-dynamic (`quantize_dynamic`): the weights of every MatMul with a constant weight to
  int8 (QInt8, one scale per output channel), its input quantized at run time per tensor.
  No data needed.
- int8-static (`quantize_static`, QDQ format, the same weights): the ranges of every
  MatMul's inputs (attention's activation MatMuls too) fixed from calibration data (the
  task's own text, MinMax), so nothing is measured at run time. On the measured tasks it
  keeps less quality than int8-dynamic (see OPS).
Both are for encoders (classifiers, embedding models); a causal LM's quantized serving
path is GGUF.

The file is built in a temporary folder beside the output, run in onnxruntime against
the fp32 PyTorch model on the same two input shapes as the fp32 check, and moved into
place only when it loads, keeps the output shapes and gives finite outputs. int8 does not
reproduce fp32 to a float tolerance: the measured difference (max |diff| and the lowest
cosine of an output row to PyTorch's) is returned for the caller to state, and quality is
judged by `report --onnx FILE` on the task's data. The file records, as ONNX metadata,
the sha256 of the checkpoint it came from and its quantization, so the report can check
that it is the model it is compared as.
"""

from __future__ import annotations

import logging
import os
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from headprune_cli.errors import DataError, HeadpruneError, NumericalError, UsageError, first_line
from headprune_cli.files.temps import temp_folder
from headprune_cli.model.formats.onnx import (
    example_inputs,
    export_onnx,
    move_into_place,
    needs_external_data,
    require_onnx,
)
from headprune_cli.model.layout import info_of
from headprune_cli.names import did_you_mean

QUANTIZATIONS = ("int8-dynamic", "int8-static")
SOURCE_KEY = "headprune.source_sha256"  # ONNX metadata: the checkpoint the graph was exported from
QUANTIZATION_KEY = "headprune.quantization"
CALIBRATION_BATCH = 8
# What is quantized: MatMuls only, weights with one scale per output channel. int8-dynamic
# quantizes the weight MatMuls (MatMulConstBOnly is its default); int8-static's QDQ format also
# puts attention's two activation MatMuls through int8 (onnxruntime 1.32 writes the same bytes
# with MatMulConstBOnly on or off there). Measured on all-MiniLM-L6-v2 (fidelity = mean cosine to
# fp32 on examples/minilm_heldout.txt, 2026-12-02): dynamic per-tensor 0.9668, per-channel 0.9938;
# static over every op 0.4254 (softmax, LayerNorm and residual adds in int8), MatMul only 0.9412.
OPS = ["MatMul"]


@dataclass
class QuantizedExport:
    path: str
    quantization: str
    inputs: list[str]
    outputs: list[str]
    opset: int
    max_abs_diff: float  # int8 onnxruntime vs fp32 PyTorch on the verification inputs
    min_cosine: float  # lowest cosine of one output row (per token for token outputs) to PyTorch's
    fp32_bytes: int
    bytes: int
    calibration_rows: int = 0


def check_quantization(kind: str | None, onnx: Path | None, calib_data: Path | None) -> None:
    """Refuse option combinations before anything is loaded."""
    if kind is None:
        if calib_data is not None:
            raise UsageError("--calib-data goes with --quantize int8-static")
        return
    if kind not in QUANTIZATIONS:
        raise UsageError(f"unknown --quantize {kind!r}{did_you_mean(kind, QUANTIZATIONS)}")
    if onnx is None:
        raise UsageError("--quantize goes with --onnx FILE (it quantizes the ONNX graph for onnxruntime)")
    if kind == "int8-static" and calib_data is None:
        raise UsageError(
            "--quantize int8-static needs --calib-data FILE (text the model will see, for activation ranges)"
        )
    if kind == "int8-dynamic" and calib_data is not None:
        raise UsageError("--calib-data goes with --quantize int8-static (int8-dynamic needs no data)")


def export_quantized(
    model: nn.Module,
    path: str | os.PathLike,
    kind: str,
    calibration=None,
    seq_len: int = 16,
    opset: int = 17,
) -> QuantizedExport:
    """Export `model` to ONNX, quantize it (`kind` in QUANTIZATIONS; `calibration` a
    data.Dataset for int8-static), check it in onnxruntime and move it into place at `path`
    (which the caller has checked with check_output)."""
    require_onnx()
    info = info_of(model)
    if info.task == "causal-lm":
        raise UsageError("--quantize is for encoders (classifiers, embedding models); causal LMs are not supported")
    if needs_external_data(model):  # onnxruntime's quantizer would need the weights beside the graph
        raise UsageError("--quantize: models of 2 GB or more (ONNX external data) are not supported")
    out = Path(path)
    with temp_folder(out) as tmp:
        try:
            fp32 = tmp / "fp32.onnx"
            plain = export_onnx(model, fp32, seq_len=seq_len, opset=opset)  # in the temporary folder: no input there
            graph = tmp / out.name
            rows = _quantize(fp32, graph, kind, plain.inputs, calibration)
            _stamp(graph, {SOURCE_KEY: info.loaded_from[1] if info.loaded_from else "", QUANTIZATION_KEY: kind})
            diff, cosine = _check_in_onnxruntime(graph, model, plain.inputs, seq_len)
            result = QuantizedExport(
                str(out), kind, plain.inputs, plain.outputs, opset, diff, cosine, fp32.stat().st_size, 0, rows
            )
            result.bytes = graph.stat().st_size
            move_into_place(graph, out)
        except OSError as exc:
            raise HeadpruneError(f"could not write {out}: {exc.strerror or exc}") from exc
    return result


def _quantize(fp32: Path, graph: Path, kind: str, names: list[str], calibration) -> int:
    from onnxruntime import quantization as q  # noqa: PLC0415 (keeps onnxruntime out of this module's import)

    try:
        with _quiet_quantizer():
            if kind == "int8-dynamic":
                q.quantize_dynamic(
                    str(fp32), str(graph), weight_type=q.QuantType.QInt8, per_channel=True, op_types_to_quantize=OPS
                )
                return 0
            reader = _CalibrationReader(calibration, names)
            q.quantize_static(
                str(fp32),
                str(graph),
                reader,
                quant_format=q.QuantFormat.QDQ,
                activation_type=q.QuantType.QInt8,
                weight_type=q.QuantType.QInt8,
                per_channel=True,
                op_types_to_quantize=OPS,
                calibrate_method=q.CalibrationMethod.MinMax,
                # onnxruntime's defaults give asymmetric activations and symmetric weights (zero
                # points 0), which the tests read from the graph; stating them, or even asking for
                # asymmetric weights, wrote the same bytes (onnxruntime 1.32, 2026-12-05)
            )
            return reader.rows
    except HeadpruneError:
        raise
    except Exception as exc:  # noqa: BLE001 - onnxruntime's quantizer raises plain exceptions on graphs it cannot handle
        raise HeadpruneError(f"onnxruntime could not quantize the graph ({kind}): {first_line(exc)}") from None


@contextmanager
def _quiet_quantizer():
    """onnxruntime's quantizer logs advice ("consider pre-processing") through the root
    logger, and numpy warns on constant tensors (scale 0); stderr is for the command's own lines."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        root.setLevel(level)


class _CalibrationReader:
    """onnxruntime's CalibrationDataReader over a headprune Dataset: numpy batches of the
    graph's inputs, in the data's order."""

    def __init__(self, dataset, names: list[str]):

        if dataset is None or len(dataset) == 0:
            raise DataError("--calib-data has no rows")
        self.rows = len(dataset)
        first = next(iter(dataset.batches(CALIBRATION_BATCH)))
        missing = [n for n in names if n not in first]
        if missing:
            raise DataError(
                f"--calib-data does not match the model: the graph takes {', '.join(missing)}, which the data lacks"
            )
        self._batches = ({n: b[n].numpy() for n in names} for b in dataset.batches(CALIBRATION_BATCH))

    def get_next(self):
        return next(self._batches, None)

    def rewind(self):  # the MinMax calibrator reads the data once; a second pass is not supported
        raise NotImplementedError

    def set_range(self, start_index: int, end_index: int):
        raise NotImplementedError


def _stamp(graph: Path, metadata: dict[str, str]) -> None:
    import onnx  # noqa: PLC0415 (keeps onnx out of this module's import)

    proto = onnx.load(str(graph))
    kept = [p for p in proto.metadata_props if p.key not in metadata]
    del proto.metadata_props[:]
    proto.metadata_props.extend(kept)
    for key, value in sorted(metadata.items()):
        proto.metadata_props.add(key=key, value=value)
    onnx.save_model(proto, str(graph))


def read_stamp(path: str | os.PathLike) -> dict[str, str]:
    """The headprune metadata of an ONNX file (empty for a plain fp32 export)."""
    import onnx  # noqa: PLC0415 (keeps onnx out of this module's import)

    proto = onnx.load(str(path), load_external_data=False)
    return {p.key: p.value for p in proto.metadata_props if p.key.startswith("headprune.")}


def _check_in_onnxruntime(graph: Path, model: nn.Module, names: list[str], seq_len: int) -> tuple[float, float]:
    """Run the quantized file on the fp32 check's two input shapes: (max |diff|, lowest cosine)."""
    import onnxruntime as ort  # noqa: PLC0415 (keeps onnxruntime out of this module's import)

    try:
        session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own types (Fail, InvalidGraph)
        raise HeadpruneError(f"onnxruntime cannot load the quantized graph: {first_line(exc)}") from None
    diffs, cosines = [], []
    for batch, length, seed in ((2, seq_len, 0), (3, max(1, seq_len // 2 + 1), 1)):
        sample = example_inputs(model, batch=batch, seq_len=length, seed=seed)
        with torch.no_grad():
            out = model(**sample)
        want = out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state
        got = torch.from_numpy(session.run(None, {n: sample[n].numpy() for n in names})[0])
        if tuple(got.shape) != tuple(want.shape) or not torch.isfinite(got).all():
            raise NumericalError(
                f"the quantized graph gives outputs of shape {tuple(got.shape)} (want {tuple(want.shape)}) "
                "or non-finite values; not written"
            )
        diffs.append(float((got - want.float()).abs().max()))
        cosines.append(float(torch.nn.functional.cosine_similarity(got, want.float(), dim=-1).min()))
    return max(diffs), min(cosines)
