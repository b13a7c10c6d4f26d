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
        "export --hf`, or a headprune checkpoint.",
        argument=True,
    )
    output: Path = option(..., "Checkpoint to write (.safetensors).", "-o", "--output")
    force: bool = option(False, "Overwrite OUTPUT if it exists.")


def run(opts: ImportOptions, ctx: Context) -> Result:
    from headprune_cli.model.checkpoint import is_export_folder, load, save  # noqa: PLC0415 (keeps numpy, torch, transformers out of this module's import)
    from headprune_cli.model.importer import import_folder  # noqa: PLC0415 (keeps torch, transformers out of this module's import)

    source = opts.source
    check_output(opts.output, opts.force, inputs=[source])
    if is_export_folder(source):  # written by `headprune export --hf`: keeps its pruned layout
        model = load(source)
    elif source.is_dir():
        model = import_folder(source)
    elif source.is_file():
        model = load(source)
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
