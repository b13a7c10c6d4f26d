"""The `import` stage: a Hugging Face model folder (or an export folder, or a checkpoint)
-> one self-describing headprune checkpoint. A pipeline whose `model:` is a folder
starts with it, implicitly."""

from __future__ import annotations

from pathlib import Path

from headprune_cli.errors import CheckpointError
from headprune_cli.files.outputs import check_output
from headprune_cli.stages.unit import Context, Options, Result, Stage, option


class ImportOptions(Options):
    source: Path = option(
        ...,
        "A Hugging Face model folder (config.json + *.safetensors + tokenizer files), a folder from `headprune "
        "export --hf`, a llama.cpp GGUF file (or a folder holding one; dequantized to float32), or a headprune "
        "checkpoint.",
        argument=True,
    )
    output: Path = option(..., "Checkpoint to write (.safetensors).", "-o", "--output")
    force: bool = option(False, "Overwrite OUTPUT if it exists.")


def run(opts: ImportOptions, ctx: Context) -> Result:
    from headprune_cli.model.checkpoint import is_export_folder, load, save  # noqa: PLC0415 (keeps numpy, torch, transformers out of this module's import)
    from headprune_cli.model.gguf_import import gguf_source, import_gguf  # noqa: PLC0415 (same)
    from headprune_cli.model.importer import import_folder  # noqa: PLC0415 (keeps torch, transformers out of this module's import)

    source = opts.source
    check_output(opts.output, opts.force, inputs=[source])
    gguf = gguf_source(source)
    if gguf is not None:  # llama.cpp's file: dequantized to float, tokenizer from its metadata
        model = import_gguf(gguf)
    elif is_export_folder(source):  # written by `headprune export --hf`: keeps its pruned layout
        model = load(source)
    elif source.is_dir():
        model = import_folder(source)
    elif source.is_file():
        model = load(source)
    elif source.exists():  # a FIFO, a device, a socket: nothing a model is read from
        raise CheckpointError(f"{source}: not a regular file or a folder")
    else:
        raise CheckpointError(f"{source}: no such folder or file")
    digest = save(model, opts.output, overwrite=opts.force)
    ctx.print(f"wrote {opts.output} (sha256 {digest[:12]})")
    return Result([str(opts.output)], value=digest)


# `headprune import --help`: the command's text (cli/ builds the command from STAGE).
HELP = """Make one self-describing headprune checkpoint from a model folder.

    Examples:

      headprune import ./all-MiniLM-L6-v2 -o minilm.safetensors

      headprune import old.safetensors -o copy.safetensors
    """

STAGE = Stage(
    "import",
    ImportOptions,
    run,
    stem="model",
    inputs={"source": ("source",)},
    outputs={"output": "model.safetensors"},
    makes={"model": "output", "baseline": "output"},
    needs=("source",),
    help=HELP,
)
