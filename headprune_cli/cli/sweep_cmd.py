"""`headprune sweep` (the stage: stages/sweep/stage.py)."""

from __future__ import annotations

from headprune_cli.cli.command import from_options
from headprune_cli.cli.common import context
from headprune_cli.stages.sweep import stage


@from_options(stage.SweepOptions)
def sweep(opts: stage.SweepOptions):
    """Score once per method, prune at each ratio, evaluate (no finetuning): the quality curve.

    Reports, per method, the largest ratio whose drop stays within --max-drop: the knee.

    Examples:

      headprune sweep model.safetensors --data calib.jsonl --eval-data dev.jsonl -o sweep/

      headprune sweep model.safetensors --data calib.txt --eval-data dev.txt --methods taylor,random \\
        --ratios 0.25,0.5,0.75 --compensate lstsq --max-drop 2 | jq .best
    """
    return stage.run(opts, context())
