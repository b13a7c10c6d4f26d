"""`headprune score` (the stage: stages/score/stage.py)."""

from __future__ import annotations

from headprune_cli.cli.command import from_options
from headprune_cli.cli.common import context
from headprune_cli.stages.score import stage


@from_options(stage.ScoreOptions)
def score(opts: stage.ScoreOptions):
    """Score the importance of every attention head (and, with --layers, every layer; with --ffn, every FFN neuron).

    Runs unchanged under `torchrun --nproc-per-node N -m headprune_cli score ...`: each
    process scores a shard of the batches, sums are all-reduced, rank 0 writes.
    Scores are summed in float64 whatever --dtype the model computes in.

    Examples:

      headprune score model.safetensors --data dev.jsonl --method taylor -o scores.json

      headprune score lm.safetensors --data wiki.txt --method loo --layers --samples 256

      headprune score emb.safetensors --data sentences.txt --method combined --weights taylor=1,entropy=0.5
    """
    return stage.run(opts, context())
