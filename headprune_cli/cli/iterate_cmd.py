"""`headprune iterate`: gradual pruning with recovery between rounds (the stage: stages/iterate/stage.py)."""

from __future__ import annotations

from headprune_cli.cli.command import from_options
from headprune_cli.cli.common import context
from headprune_cli.stages.iterate import stage


@from_options(stage.IterateOptions)
def iterate(opts: stage.IterateOptions):
    """Prune gradually: each round rescores the current model, removes heads up to the next fraction of the original heads (or, with --target-flops/--target-params, heads and with --ffn FFN neurons down to the next fraction of the original cost), and recovers; stops before the dev metric crosses the floor and writes the last model above it.

    Examples:

      headprune iterate model.safetensors --data train.jsonl --eval-data dev.jsonl --max-drop 1.0 -o small.safetensors

      headprune iterate model.safetensors --data train.jsonl --eval-data dev.jsonl --schedule 0.2,0.4,0.6 --teacher self -o small.safetensors

      headprune iterate model.safetensors --data train.jsonl --eval-data dev.jsonl --method fisher --ffn --target-flops 0.8,0.65,0.5 -o small.safetensors
    """  # noqa: E501 - the --help text, byte for byte: rich keeps its line breaks, so a paragraph is one line
    return stage.run(opts, context())
