"""`headprune import`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from headprune_cli.model.checkpoint import is_export_folder, load, save
from headprune_cli.errors import CheckpointError
from headprune_cli.outputs import check_output
from headprune_cli.model.importer import import_folder
from headprune_cli.cli.common import console


def import_model(
    source: Annotated[Path, typer.Argument(help="A Hugging Face model folder (config.json + *.safetensors + tokenizer files), a folder from `headprune export --hf`, or a headprune checkpoint.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Checkpoint to write (.safetensors).")],
    force: Annotated[bool, typer.Option("--force", help="Overwrite OUTPUT if it exists.")] = False,
) -> None:
    """Make one self-describing headprune checkpoint from a model folder.

    Examples:

      headprune import ./all-MiniLM-L6-v2 -o minilm.safetensors

      headprune import old.safetensors -o copy.safetensors
    """
    check_output(output, force, inputs=[source])
    if is_export_folder(source):  # written by `headprune export --hf`: keeps its pruned layout
        model = load(source)
    elif source.is_dir():
        model = import_folder(source)
    elif source.is_file():
        model = load(source)
    else:
        raise CheckpointError(f"{source}: no such folder or file")
    digest = save(model, output, overwrite=force)
    console.print(f"wrote {output} (sha256 {digest[:12]})")
