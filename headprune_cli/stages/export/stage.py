"""The `export` stage: a checkpoint -> an ONNX file or an HF-style folder.

Outputs are checked before the (slow) load, so a refused run costs nothing; the folder
export copies weights tensor by tensor unless it also traces ONNX (which needs them).
"""

from __future__ import annotations

from pathlib import Path

from headprune_cli.errors import UsageError
from headprune_cli.files.outputs import check_output
from headprune_cli.stages.unit import Context, Options, Result, Stage, option

# As model.tensorfile.DEFAULT_MAX_SHARD (a test holds them equal); written out here so
# that reading the options does not import torch.
DEFAULT_MAX_SHARD = "5GB"


class ExportOptions(Options):
    checkpoint: Path = option(..., "A headprune checkpoint (or a folder from `export --hf`).", argument=True)
    onnx: Path | None = option(
        None, "Write an ONNX file (dynamic batch and sequence axes; causal LMs with past key/values)."
    )
    hf: Path | None = option(None, "Write an HF-style folder: config, weights, tokenizer, headprune.json.")
    with_onnx: bool | None = option(
        None,
        "With --hf: also write DIR/onnx/model.onnx (default: for sentence-transformers models).",
        negative="--no-onnx",
    )
    seq_len: int = option(16, "Sequence length of the example input traced for ONNX.", ge=1)
    opset: int = option(17, "ONNX opset version.", ge=9)
    max_shard_size: str = option(
        DEFAULT_MAX_SHARD,
        "--hf: split weights above this size into shards with an index, as transformers does (e.g. 5GB, 500MB).",
    )
    force: bool = option(False, "Overwrite an existing output (a folder only if headprune wrote it).")


def run(opts: ExportOptions, ctx: Context) -> Result:
    from headprune_cli.model.export import check_folder_output
    from headprune_cli.model.tensorfile import parse_size

    if (opts.onnx is None) == (opts.hf is None):
        raise UsageError("give exactly one of --onnx FILE or --hf DIR")
    if opts.with_onnx is not None and opts.hf is None:
        raise UsageError("--with-onnx/--no-onnx go with --hf DIR (--onnx FILE writes only the ONNX file)")
    if opts.onnx is not None:
        check_output(opts.onnx, opts.force, inputs=[opts.checkpoint])
        return _export_onnx(opts, ctx)
    check_folder_output(opts.hf, opts.force, inputs=[opts.checkpoint])
    parse_size(opts.max_shard_size)
    return _export_folder(opts, ctx)


def _export_onnx(opts: ExportOptions, ctx: Context) -> Result:
    from headprune_cli.model.checkpoint import load
    from headprune_cli.model.export import export_onnx

    model = load(opts.checkpoint)
    result = export_onnx(
        model, opts.onnx, seq_len=opts.seq_len, opset=opts.opset, force=opts.force, inputs=[opts.checkpoint]
    )
    past = [n for n in result.inputs if n.startswith("past_key_values.")]
    names = [n for n in result.inputs if n not in past] + (
        [f"past key/values of {len(past) // 2} layers"] if past else []
    )
    data = f", weights in {result.external_data}" if result.external_data else ""
    ctx.print(
        f"wrote {opts.onnx} (inputs {', '.join(names)} -> "
        f"{result.outputs[0]}{' + present key/values' if past else ''}, "
        f"opset {opts.opset}{data}; onnxruntime matches PyTorch to {result.max_abs_diff:.1e})"
    )
    written = [str(opts.onnx)] + ([str(opts.onnx.with_name(result.external_data))] if result.external_data else [])
    return Result(written, value=result)


def _export_folder(opts: ExportOptions, ctx: Context) -> Result:
    from headprune_cli.model.checkpoint import load, read_info
    from headprune_cli.model.export import export_hf
    from headprune_cli.model.hf_config import folder_config, remedy
    from headprune_cli.model.layout import info_of
    from headprune_cli.model.st_export import is_sentence_transformer
    from headprune_cli.model.streaming import export_specs

    hf, checkpoint = opts.hf, opts.checkpoint
    info = read_info(checkpoint)
    with_onnx = is_sentence_transformer(info) if opts.with_onnx is None else opts.with_onnx
    if with_onnx:  # tracing needs the real weights
        model, specs = load(checkpoint), None
    else:  # weights are copied tensor by tensor; the model stays on the meta device
        model, specs = export_specs(checkpoint)
    export_hf(
        model,
        hf,
        force=opts.force,
        inputs=[checkpoint],
        max_shard_size=opts.max_shard_size,
        specs=specs,
        with_onnx=with_onnx,
    )
    layout = folder_config(info_of(model))
    extras = (", sentence-transformers modules" if is_sentence_transformer(info) else "") + (
        ", onnx/model.onnx" if with_onnx else ""
    )
    weights = (
        layout.weights
        if (hf / layout.weights).is_file()
        else f"{layout.weights.removesuffix('.safetensors')}-*.safetensors shards with an index"
    )
    ctx.print(f"wrote {hf}/ (config.json, {weights}, headprune.json{extras})", soft_wrap=True, markup=False)
    if layout.plain:
        ctx.print("transformers loads it as it is (no headprune needed)")
    else:  # one line: why transformers cannot load it, and what serves it instead
        ctx.print(
            f"note: transformers cannot load it: {layout.reason}; {remedy(layout, with_onnx)}",
            soft_wrap=True,
            markup=False,
        )
    return Result([str(hf)])


STAGE = Stage(
    "export",
    ExportOptions,
    run,
    stem="export",
    inputs={"checkpoint": ("model",)},
    outputs={"hf": "{stem}"},
    makes={},
    needs=("checkpoint",),
    refused={"onnx": "the export stage writes an HF folder; `with_onnx: true` adds onnx/model.onnx to it"},
)
