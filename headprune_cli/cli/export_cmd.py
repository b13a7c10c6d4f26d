"""`headprune export`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from headprune_cli.model.checkpoint import load
from headprune_cli.errors import UsageError
from headprune_cli.model.export import check_folder_output, export_hf, export_onnx
from headprune_cli.model.streaming import export_specs
from headprune_cli.model.tensorfile import DEFAULT_MAX_SHARD, parse_size
from headprune_cli.outputs import check_output
from headprune_cli.cli.common import console


def export(
    checkpoint: Annotated[Path, typer.Argument(help="A headprune checkpoint (or a folder from `export --hf`).")],
    onnx: Annotated[Path | None, typer.Option("--onnx", help="Write an ONNX file (dynamic batch and sequence axes).")] = None,
    hf: Annotated[Path | None, typer.Option("--hf", help="Write an HF-style folder: config, weights, tokenizer, headprune.json.")] = None,
    seq_len: Annotated[int, typer.Option("--seq-len", min=1, help="Sequence length of the example input traced for ONNX.")] = 16,
    opset: Annotated[int, typer.Option("--opset", min=9, help="ONNX opset version.")] = 17,
    max_shard_size: Annotated[str, typer.Option("--max-shard-size", help="--hf: split weights above this size into shards with an index, as transformers does (e.g. 5GB, 500MB).")] = DEFAULT_MAX_SHARD,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing output (a folder only if headprune wrote it).")] = False,
) -> None:
    """Export a (pruned) checkpoint for deployment: an ONNX file or an HF-style folder.

    The ONNX file takes input_ids + attention_mask (pixel_values for ViT) and returns
    logits (last_hidden_state for base models); it is checked against PyTorch in
    onnxruntime before it is written. The folder loads back with
    `headprune_cli.load(DIR)` and re-imports with `headprune import DIR -o x.safetensors`.

    Examples:

      headprune export small.safetensors --onnx small.onnx

      headprune export small.safetensors --hf small-model/
    """
    if (onnx is None) == (hf is None):
        raise UsageError("give exactly one of --onnx FILE or --hf DIR")
    # Check the output before the (slow) load, so a refused run costs nothing.
    if onnx is not None:
        check_output(onnx, force, inputs=[checkpoint])
    else:
        check_folder_output(hf, force, inputs=[checkpoint])
        parse_size(max_shard_size)
    if hf is not None:  # weights are copied tensor by tensor; the model is never built
        model, specs = export_specs(checkpoint)
        export_hf(model, hf, force=force, inputs=[checkpoint], max_shard_size=max_shard_size, specs=specs)
        console.print(f"wrote {hf}/ (config.json, weights, headprune.json)")
        return
    model = load(checkpoint)
    result = export_onnx(model, onnx, seq_len=seq_len, opset=opset)
    console.print(
        f"wrote {onnx} (inputs {', '.join(result.inputs)} -> {result.outputs[0]}, opset {opset}; "
        f"onnxruntime matches PyTorch to {result.max_abs_diff:.1e})"
    )
