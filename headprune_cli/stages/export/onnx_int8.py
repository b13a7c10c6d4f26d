"""`export --onnx FILE --quantize KIND`: the int8 ONNX file (model/formats/onnx_quantize.py).

Kept beside stage.py so the stage module stays the options and the dispatch.
Calibration data is read with the checkpoint's own tokenizer at the traced sequence
length before anything is traced, so data that does not fit the model is refused
before any work."""

from __future__ import annotations

from headprune_cli.stages.unit import Context, Result


def export_quantized_onnx(opts, ctx: Context) -> Result:
    from headprune_cli.model.checkpoint import load  # noqa: PLC0415 (keeps numpy, torch, transformers out of this module's import)
    from headprune_cli.model.formats.onnx_quantize import export_quantized  # noqa: PLC0415 (keeps torch, transformers out of this module's import)

    model = load(opts.checkpoint)
    calibration = None
    if opts.calib_data is not None:
        from headprune_cli.data.readers import read_data  # noqa: PLC0415 (keeps torch out of this module's import)

        calibration = read_data(
            opts.calib_data, model, max_length=opts.seq_len, samples=opts.calib_samples, need_labels=False
        )
    result = export_quantized(
        model,
        opts.onnx,
        opts.quantize,
        calibration=calibration,
        seq_len=opts.seq_len,
        opset=opts.opset,
    )
    rows = f", calibrated on {result.calibration_rows} rows" if result.calibration_rows else ""
    ctx.print(
        f"wrote {opts.onnx} ({result.quantization}{rows}; {result.bytes / 1e6:.1f} MB, "
        f"fp32 {result.fp32_bytes / 1e6:.1f} MB; "
        f"inputs {', '.join(result.inputs)} -> {result.outputs[0]}, opset {opts.opset}; "
        f"onnxruntime vs PyTorch fp32: max |diff| {result.max_abs_diff:.2g}, lowest cosine {result.min_cosine:.4f})",
        soft_wrap=True,
        markup=False,
    )
    return Result([str(opts.onnx)], value=result)
