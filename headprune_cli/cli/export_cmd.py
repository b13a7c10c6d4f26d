"""`headprune export`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from headprune_cli.model.checkpoint import load
from headprune_cli.errors import UsageError
from headprune_cli.model.export import check_folder_output, export_hf, export_onnx
from headprune_cli.model.checkpoint import read_info
from headprune_cli.model.hf_config import folder_config, remedy
from headprune_cli.model.layout import info_of
from headprune_cli.model.st_export import is_sentence_transformer
from headprune_cli.model.streaming import export_specs
from headprune_cli.model.tensorfile import DEFAULT_MAX_SHARD, parse_size
from headprune_cli.outputs import check_output
from headprune_cli.cli.common import console


def export(
    checkpoint: Annotated[Path, typer.Argument(help="A headprune checkpoint (or a folder from `export --hf`).")],
    onnx: Annotated[Path | None, typer.Option("--onnx", help="Write an ONNX file (dynamic batch and sequence axes; causal LMs with past key/values).")] = None,
    hf: Annotated[Path | None, typer.Option("--hf", help="Write an HF-style folder: config, weights, tokenizer, headprune.json.")] = None,
    with_onnx: Annotated[
        Optional[bool],
        typer.Option("--with-onnx/--no-onnx", help="With --hf: also write DIR/onnx/model.onnx (default: for sentence-transformers models)."),
    ] = None,
    seq_len: Annotated[int, typer.Option("--seq-len", min=1, help="Sequence length of the example input traced for ONNX.")] = 16,
    opset: Annotated[int, typer.Option("--opset", min=9, help="ONNX opset version.")] = 17,
    max_shard_size: Annotated[str, typer.Option("--max-shard-size", help="--hf: split weights above this size into shards with an index, as transformers does (e.g. 5GB, 500MB).")] = DEFAULT_MAX_SHARD,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing output (a folder only if headprune wrote it).")] = False,
) -> None:
    """Export a (pruned) checkpoint for deployment: an ONNX file or an HF-style folder.

    The ONNX file takes input_ids + attention_mask (pixel_values for ViT) and returns
    logits (last_hidden_state for base models); a causal LM's file also takes
    position_ids and past_key_values.N.key/value and returns present.N.key/value, so
    onnxruntime can decode. Each file is checked against PyTorch in onnxruntime before it
    is written; models of 2 GB or more keep their weights in FILE.data beside it.

    The folder loads back with `headprune_cli.load(DIR)` and re-imports with
    `headprune import DIR -o x.safetensors`. A LLaMA/Mistral/Qwen model whose layers keep
    the same heads (`select --uniform`) also loads in plain transformers
    (AutoModelForCausalLM.from_pretrained(DIR)); other layouts are kept from loading
    there with wrong shapes and serve through DIR/onnx/model.onnx (--with-onnx).
    Sentence-transformers models get modules.json, pooling and onnx/model.onnx.

    Examples:

      headprune export small.safetensors --onnx small.onnx

      headprune export small.safetensors --hf small-model/

      headprune export small-minilm.safetensors --hf small-minilm/   # + onnx/model.onnx
    """
    if (onnx is None) == (hf is None):
        raise UsageError("give exactly one of --onnx FILE or --hf DIR")
    if with_onnx is not None and hf is None:
        raise UsageError("--with-onnx/--no-onnx go with --hf DIR (--onnx FILE writes only the ONNX file)")
    # Check the output before the (slow) load, so a refused run costs nothing.
    if onnx is not None:
        check_output(onnx, force, inputs=[checkpoint])
    else:
        check_folder_output(hf, force, inputs=[checkpoint])
        parse_size(max_shard_size)
    if hf is not None:
        _export_folder(hf, force, checkpoint, with_onnx, max_shard_size)
        return
    model = load(checkpoint)
    result = export_onnx(model, onnx, seq_len=seq_len, opset=opset, force=force, inputs=[checkpoint])
    past = [n for n in result.inputs if n.startswith("past_key_values.")]
    names = [n for n in result.inputs if n not in past] + ([f"past key/values of {len(past) // 2} layers"] if past else [])
    data = f", weights in {result.external_data}" if result.external_data else ""
    console.print(
        f"wrote {onnx} (inputs {', '.join(names)} -> {result.outputs[0]}{' + present key/values' if past else ''}, "
        f"opset {opset}{data}; onnxruntime matches PyTorch to {result.max_abs_diff:.1e})"
    )


def _export_folder(hf: Path, force: bool, checkpoint: Path, with_onnx: bool | None, max_shard_size: str) -> None:
    info = read_info(checkpoint)
    if with_onnx is None:
        with_onnx = is_sentence_transformer(info)
    if with_onnx:  # tracing needs the real weights
        model, specs = load(checkpoint), None
    else:  # weights are copied tensor by tensor; the model stays on the meta device
        model, specs = export_specs(checkpoint)
    export_hf(model, hf, force=force, inputs=[checkpoint], max_shard_size=max_shard_size, specs=specs, with_onnx=with_onnx)
    layout = folder_config(info_of(model))
    extras = (", sentence-transformers modules" if is_sentence_transformer(info) else "") + (", onnx/model.onnx" if with_onnx else "")
    weights = layout.weights if (hf / layout.weights).is_file() else f"{layout.weights.removesuffix('.safetensors')}-*.safetensors shards with an index"
    console.print(f"wrote {hf}/ (config.json, {weights}, headprune.json{extras})", soft_wrap=True, markup=False)
    if layout.plain:
        console.print("transformers loads it as it is (no headprune needed)")
    else:  # one line: why transformers cannot load it, and what serves it instead
        console.print(f"note: transformers cannot load it: {layout.reason}; {remedy(layout, with_onnx)}", soft_wrap=True, markup=False)
