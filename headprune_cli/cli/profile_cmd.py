"""`headprune profile` (the stage: stages/profile/stage.py)."""

from __future__ import annotations

from headprune_cli.cli.command import from_options
from headprune_cli.cli.common import context
from headprune_cli.stages.profile import stage


@from_options(stage.ProfileOptions)
def profile(opts: stage.ProfileOptions):
    """Measure each layer's latency at a grid of kept heads (KV groups) and FFN widths; writes a latency table.

    Each layer's block is timed (torch.utils.benchmark, interleaved rounds,
    medians after warm-up) as copies sliced to k heads or w neurons, one
    layer at a time; layers of one shape share a measurement unless
    --every-layer. The default grid is 9 points per layer: the smallest
    count, every eighth of the full count and all (aligned to --multiple-of and
    --ffn-multiple-of); `select` and `report` interpolate between them.

    Examples:

      headprune profile model.safetensors -o latency.json

      headprune profile model.safetensors --device cuda --dtype bf16 --batch-size 1 --context 1024 -o latency.json

      headprune select scores.json --latency latency.json --target-latency 0.7 -o plan.json
    """
    return stage.run(opts, context())
