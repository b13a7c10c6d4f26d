"""The `export` stage: a checkpoint -> an ONNX file or an HF-style folder.

Outputs are checked before the (slow) load, so a refused run costs nothing; the folder
export copies weights tensor by tensor unless it also traces ONNX (which needs them).
"""

from __future__ import annotations

from pathlib import Path

from headprune_cli.errors import UsageError
from headprune_cli.files.outputs import check_output
from headprune_cli.model.llama_cpp_env import ENGINE_PYTHON_HELP
from headprune_cli.stages.unit import Context, Options, Result, Stage, option

# As model.tensorfile.DEFAULT_MAX_SHARD (a test holds them equal); written out here so
# that reading the options does not import torch.
DEFAULT_MAX_SHARD = "5GB"
ROUNDINGS = ("nearest", "gptq")  # --gguf-rounding


class ExportOptions(Options):
    checkpoint: Path = option(..., "A headprune checkpoint (or a folder from `export --hf`).", argument=True)
    onnx: Path | None = option(
        None, "Write an ONNX file (dynamic batch and sequence axes; causal LMs with past key/values)."
    )
    hf: Path | None = option(None, "Write an HF-style folder: config, weights, tokenizer, headprune.json.")
    gguf: Path | None = option(
        None, "Write a GGUF file for llama.cpp (LLaMA-family causal LMs; per-layer shapes use its deci architecture)."
    )
    vllm: Path | None = option(
        None,
        "Write a folder vLLM serves (nemotron-nas: per-layer KV heads and FFN widths, one query-head count; "
        "LLaMA, Mistral, Qwen2 causal LMs).",
    )
    gguf_type: str = option(
        "auto",
        "--gguf: weight type: auto (the checkpoint's), f32, f16, bf16, q8_0, q5_1, q5_0, q4_1, q4_0, or llama.cpp's "
        "k-quants q6_K, q5_K_M, q4_K_M (quantized by llama.cpp's own quantizer in its engine environment). A cut "
        "whose pruned widths are off the type's blocks is refused: select it with --runtime llama.cpp --gguf-type T.",
    )
    gguf_embedding_type: str | None = option(
        None,
        "--gguf: the token embedding and output head (one matrix when tied) in this type instead of --gguf-type, "
        "as llama-quantize's --token-embedding-type: f32, f16, bf16, q8_0, q5_1, q5_0, q4_1, q4_0. "
        "E.g. --gguf-type q4_0 --gguf-embedding-type q8_0.",
    )
    engine_python: Path | None = option(None, "--gguf-type q6_K|q5_K_M|q4_K_M: " + ENGINE_PYTHON_HELP)
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
    quantize: str | None = option(
        None,
        "With --onnx: int8 through onnxruntime's quantizer: int8-dynamic (weights int8, no data) or int8-static "
        "(activation ranges from --calib-data).",
    )
    calib_data: Path | None = option(
        None,
        "Calibration data (JSONL/CSV/text/safetensors) the model will see: --quantize int8-static takes its "
        "activation ranges from it; --gguf-type q4_0 weighs each block's rounding by its columns' importance on it "
        "(llama.cpp's imatrix).",
    )
    calib_samples: int = option(128, "--calib-data: rows read from it.", ge=1)
    gguf_rounding: str = option(
        "nearest",
        "--gguf-type q4_0 --calib-data: nearest (each weight to its nearest level, at the importance-weighted "
        "scale) or gptq (columns rounded in turn, each one's error moved onto those not yet rounded: GPTQ; "
        "slower, closer outputs).",
    )
    force: bool = option(False, "Overwrite an existing output (a folder only if headprune wrote it).")

    def check(self) -> None:
        """Which output, and the options that go with it: refused before anything is read."""
        if sum(out is not None for out in (self.onnx, self.hf, self.gguf, self.vllm)) != 1:
            raise UsageError("give exactly one of --onnx FILE, --hf DIR, --gguf FILE or --vllm DIR")
        if self.gguf_embedding_type is not None and self.gguf is None:
            raise UsageError("--gguf-embedding-type goes with --gguf FILE")
        if self.calib_data is not None and self.onnx is None and self.gguf is None:
            raise UsageError(
                "--calib-data goes with --onnx FILE --quantize int8-static or --gguf FILE --gguf-type q4_0"
            )
        if self.gguf_rounding not in ROUNDINGS:
            raise UsageError(f"--gguf-rounding: one of {', '.join(ROUNDINGS)} (got {self.gguf_rounding})")
        if self.gguf_rounding != "nearest" and (self.gguf is None or self.calib_data is None):
            raise UsageError(f"--gguf-rounding {self.gguf_rounding} goes with --gguf FILE --calib-data TEXT")
        if self.with_onnx is not None and self.hf is None:
            raise UsageError("--with-onnx/--no-onnx go with --hf DIR (--onnx FILE writes only the ONNX file)")


def run(opts: ExportOptions, ctx: Context) -> Result:
    from headprune_cli.model.formats.hf import check_folder_output  # noqa: PLC0415 (keeps numpy, torch, transformers out of this module's import)
    from headprune_cli.model.formats.onnx_quantize import check_quantization  # noqa: PLC0415 (keeps torch, transformers out of this module's import)
    from headprune_cli.model.tensorfile import parse_size  # noqa: PLC0415 (keeps numpy, torch out of this module's import)

    opts.check()
    # --quantize and its --calib-data are the ONNX path's; --calib-data also weighs a GGUF's blocks.
    check_quantization(opts.quantize, opts.onnx, None if opts.gguf is not None else opts.calib_data)
    if opts.gguf is not None:
        from headprune_cli.stages.export.gguf_file import export_gguf_file  # noqa: PLC0415 (keeps torch out of this module's import)

        return export_gguf_file(
            opts.checkpoint,
            opts.gguf,
            opts.gguf_type,
            opts.force,
            ctx,
            opts.engine_python,
            opts.gguf_embedding_type,
            opts.calib_data,
            opts.calib_samples,
            opts.gguf_rounding,
        )
    if opts.vllm is not None:
        from headprune_cli.stages.export.vllm_folder import export_vllm_folder  # noqa: PLC0415 (keeps torch out of this module's import)

        return export_vllm_folder(opts.checkpoint, opts.vllm, opts.force, opts.max_shard_size, ctx)
    if opts.onnx is not None:
        check_output(opts.onnx, opts.force, inputs=[opts.checkpoint, opts.calib_data])
        if opts.quantize is not None:
            from headprune_cli.stages.export.onnx_int8 import export_quantized_onnx  # noqa: PLC0415 (keeps torch out of this module's import)

            return export_quantized_onnx(opts, ctx)
        return _export_onnx(opts, opts.onnx, ctx)
    hf = opts.hf
    assert hf is not None  # check(): exactly one output, and the other three returned above
    check_folder_output(hf, opts.force, inputs=[opts.checkpoint])
    parse_size(opts.max_shard_size)
    return _export_folder(opts, hf, ctx)


def _export_onnx(opts: ExportOptions, onnx: Path, ctx: Context) -> Result:
    from headprune_cli.model.checkpoint import load  # noqa: PLC0415 (keeps numpy, torch, transformers out of this module's import)
    from headprune_cli.model.formats.onnx import export_onnx  # noqa: PLC0415 (keeps numpy, torch, transformers out of this module's import)

    model = load(opts.checkpoint)
    result = export_onnx(
        model, onnx, seq_len=opts.seq_len, opset=opts.opset, force=opts.force, inputs=[opts.checkpoint]
    )
    past = [n for n in result.inputs if n.startswith("past_key_values.")]
    names = [n for n in result.inputs if n not in past] + (
        [f"past key/values of {len(past) // 2} layers"] if past else []
    )
    data = f", weights in {result.external_data}" if result.external_data else ""
    ctx.print(
        f"wrote {onnx} (inputs {', '.join(names)} -> "
        f"{result.outputs[0]}{' + present key/values' if past else ''}, "
        f"opset {opts.opset}{data}; onnxruntime matches PyTorch to {result.max_abs_diff:.1e})"
    )
    written = [str(onnx)] + ([str(onnx.with_name(result.external_data))] if result.external_data else [])
    return Result(written, value=result)


def _export_folder(opts: ExportOptions, hf: Path, ctx: Context) -> Result:
    from headprune_cli.model.checkpoint import load, read_info  # noqa: PLC0415 (keeps numpy, torch, transformers out of this module's import)
    from headprune_cli.model.formats.engines import serving, serving_line  # noqa: PLC0415 (keeps numpy, torch, transformers out of this module's import)
    from headprune_cli.model.formats.hf import export_hf, weights_written  # noqa: PLC0415 (keeps numpy, torch, transformers out of this module's import)
    from headprune_cli.model.formats.hf_config import folder_config, remedy  # noqa: PLC0415 (keeps torch, transformers out of this module's import)
    from headprune_cli.model.formats.sentence_transformers import is_sentence_transformer  # noqa: PLC0415 (keeps torch, transformers out of this module's import)
    from headprune_cli.model.layout import info_of  # noqa: PLC0415 (keeps torch, transformers out of this module's import)
    from headprune_cli.model.streaming import export_specs  # noqa: PLC0415 (keeps numpy, torch, transformers out of this module's import)

    checkpoint = opts.checkpoint
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
    ctx.print(
        f"wrote {hf}/ (config.json, {weights_written(hf, layout.weights)}, headprune.json{extras})",
        soft_wrap=True,
        markup=False,
    )
    if layout.plain:
        ctx.print("transformers loads it as it is (no headprune needed)")
    else:  # one line: why transformers cannot load it, and what serves it instead
        ctx.print(
            f"note: transformers cannot load it: {layout.reason}; {remedy(layout, with_onnx)}",
            soft_wrap=True,
            markup=False,
        )
    ctx.print(serving_line(serving(info_of(model))), soft_wrap=True, markup=False)  # and the other engines' exports
    return Result([str(hf)])


# `headprune export --help`: the command's text (cli/ builds the command from STAGE).
HELP = """Export a (pruned) checkpoint for deployment: an ONNX file or an HF-style folder.

    The ONNX file takes input_ids + attention_mask (pixel_values for ViT) and returns
    logits (last_hidden_state for base models); a causal LM's file also takes
    position_ids and past_key_values.N.key/value and returns present.N.key/value, so
    onnxruntime can decode. Each file is checked against PyTorch in onnxruntime before it
    is written; models of 2 GB or more keep their weights in FILE.data beside it.
    --quantize int8-dynamic|int8-static (encoders) writes it through
    onnxruntime's quantizer, run in onnxruntime before it is moved into
    place; `report --onnx` measures what it kept.

    The folder loads back with `headprune_cli.load(DIR)` and re-imports with
    `headprune import DIR -o x.safetensors`. A LLaMA/Mistral/Qwen model whose layers keep
    the same heads (`select --uniform`) also loads in plain transformers
    (AutoModelForCausalLM.from_pretrained(DIR)); other layouts are kept from loading
    there with wrong shapes and serve through DIR/onnx/model.onnx (--with-onnx).
    Sentence-transformers models get modules.json, pooling and onnx/model.onnx.

    --vllm DIR writes a folder vLLM serves (`vllm serve DIR --trust-remote-code`)
    for LLaMA/Mistral/Qwen2 cuts with one query-head count and per-layer KV heads
    and FFN widths (`select --runtime vllm`); --gguf FILE one llama.cpp loads
    (--gguf-type q8_0/q4_0/...: a cut chosen with `select --runtime llama.cpp
    --gguf-type T`, whose widths are on T's quantization blocks; q4_K_M/q5_K_M/q6_K
    are quantized by llama.cpp's own quantizer in its engine environment; q4_0 with
    --calib-data TEXT rounds each block for the columns that text leans on, as
    llama.cpp's imatrix does, and with --gguf-rounding gptq as GPTQ does: same bytes,
    lower perplexity).

    Examples:

      headprune export small.safetensors --onnx small.onnx

      headprune export small.safetensors --onnx small-int8.onnx --quantize int8-dynamic   # encoders: int8 weights

      headprune export small.safetensors --hf small-model/

      headprune export small-minilm.safetensors --hf small-minilm/   # + onnx/model.onnx

      headprune export small-llama.safetensors --vllm small-llama-vllm/   # nemotron-nas folder for vLLM

      headprune export small-llama.safetensors --gguf small-q4km.gguf --gguf-type q4_K_M   # llama.cpp

      headprune export small-llama.safetensors --gguf small-q4.gguf --gguf-type q4_0 --gguf-embedding-type q8_0

      headprune export small-llama.safetensors --gguf small-q4.gguf --gguf-type q4_0 --calib-data calib.txt   # imatrix

      headprune export lm.safetensors --gguf lm-q4.gguf --gguf-type q4_0 --calib-data calib.txt --gguf-rounding gptq
    """

STAGE = Stage(
    "export",
    ExportOptions,
    run,
    stem="export",
    inputs={"checkpoint": ("model",)},
    outputs={"hf": "{stem}"},
    makes={},
    needs=("checkpoint",),
    refused={
        "onnx": "the export stage writes an HF folder; `with_onnx: true` adds onnx/model.onnx to it",
        "gguf": "the export stage writes an HF folder; run `headprune export --gguf FILE` on the run's checkpoint",
        "vllm": "the export stage writes an HF folder; run `headprune export --vllm DIR` on the run's checkpoint",
        "quantize": (
            "int8 ONNX goes with --onnx FILE: run `headprune export CKPT --onnx FILE --quantize ...` after the run"
        ),
        "calib_data": "it goes with --quantize int8-static or --gguf, which the export stage does not take",
    },
    help=HELP,
)
