"""`headprune prune`: checkpoint + plan (or scores + amount) -> a smaller checkpoint.

The stage: stages/prune/stage.py.
"""

from __future__ import annotations

from headprune_cli.cli.command import from_options
from headprune_cli.cli.common import context
from headprune_cli.stages.prune import stage


@from_options(stage.PruneOptions)
def prune(opts: stage.PruneOptions):
    """Remove heads, FFN neurons and layers physically (smaller dense matrices); optionally compensate.

    With neither --plan nor --scores, a plan or a scores JSON is read from stdin.
    Compensation (retraining-free, seconds): `bias` adds the removed heads' mean
    contribution to the output-projection bias; `lstsq` refits the kept columns of each
    pruned layer's output projection to match the unpruned layer on --data.

    Examples:

      headprune prune model.safetensors --plan plan.json -o small.safetensors

      headprune prune --scores scores.json --ratio 0.3 --compensate lstsq --data calib.txt -o small.safetensors

      headprune score m.safetensors --method taylor --data d.jsonl | headprune prune --ratio 0.3 --min-heads 1 -o small.safetensors
    """  # noqa: E501 - the --help text, byte for byte: rich keeps its line breaks, so a paragraph is one line
    return stage.run(opts, context())
