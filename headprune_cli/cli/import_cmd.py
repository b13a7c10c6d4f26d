"""`headprune import` (the stage: stages/import_/stage.py)."""

from __future__ import annotations

from headprune_cli.cli.command import from_options
from headprune_cli.cli.common import context
from headprune_cli.stages.import_ import stage


@from_options(stage.ImportOptions)
def import_model(opts: stage.ImportOptions):
    """Make one self-describing headprune checkpoint from a model folder.

    Examples:

      headprune import ./all-MiniLM-L6-v2 -o minilm.safetensors

      headprune import old.safetensors -o copy.safetensors
    """
    return stage.run(opts, context())
