"""`headprune search` (the stage: stages/search/stage.py)."""

from __future__ import annotations

from headprune_cli.cli.command import from_options
from headprune_cli.cli.common import context
from headprune_cli.stages.search import stage


@from_options(stage.SearchOptions)
def search(opts: stage.SearchOptions):
    """Find a plan by measured quality: start from the greedy plan, try per-layer head counts (and layer drops) on held-out calibration data.

    Each candidate is judged as `prune --compensate` will ship it (--compensate lstsq by
    default: the refit solved from statistics collected once), by held-out accuracy for a
    classifier (loss breaking ties) or by loss (--judge loss); at a local optimum the search
    restarts from a random perturbation of the best plan until --evaluations (or --seconds)
    is spent. Every candidate respects the same constraints as `select` (--min-heads, --multiple-of,
    --protect, whole KV groups) and the same budget (--ratio of heads, or a
    --target-flops/--target-params budget, where layers may be dropped too with
    --layers). The result is a plan for `headprune prune --plan`.

    Examples:

      headprune search model.safetensors --data calib.jsonl --ratio 0.7 -o plan.json

      headprune search model.safetensors --data calib.jsonl --target-flops 0.5 --layers --layer-method loo --evaluations 200 -o plan.json

      headprune search m.safetensors --data calib.jsonl --ratio 0.85 --method fisher --compensate lstsq --evaluations 200 -o plan.json && headprune prune --plan plan.json --compensate lstsq --data calib.jsonl -o small.safetensors

      headprune search m.safetensors --data calib.jsonl --ratio 0.5 --seconds 60 --compensate none | headprune prune -o small.safetensors
    """  # noqa: E501 - the --help text, byte for byte: rich keeps its line breaks, so a paragraph is one line
    return stage.run(opts, context())
