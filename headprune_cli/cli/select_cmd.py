"""`headprune select`: scores JSON -> plan JSON (the stage: stages/select/stage.py)."""

from __future__ import annotations

from headprune_cli.cli.command import from_options
from headprune_cli.cli.common import context
from headprune_cli.stages.select import stage


@from_options(stage.SelectOptions)
def select(opts: stage.SelectOptions):
    """Choose the heads, FFN neurons and layers to remove from importance scores; writes a plan.

    Every strategy respects every constraint: --min-heads per layer, --multiple-of,
    whole KV groups for grouped-query attention, --protect, and with --uniform the same
    number of heads and KV groups in every layer.

    Examples:

      headprune select scores.json --ratio 0.3 -o plan.json

      headprune select scores.json --ratio 0.5 --strategy layer --multiple-of 2

      headprune select scores.json --target-flops 0.7 --protect 0:3,5:1

      headprune select scores.json --ratio 0.5 --uniform -o plan.json

      headprune select scores.json --target-flops 0.6 --runtime vllm -o plan.json   # only plans vLLM loads

      headprune select scores.json --target-flops 0.8 --runtime llama.cpp --gguf-type q4_0   # widths on q4_0's blocks

      headprune score m.safetensors --method taylor --data d.jsonl | headprune select --ratio 0.3 | headprune prune -o small.safetensors
    """  # noqa: E501 - the --help text, byte for byte: rich keeps its line breaks, so a paragraph is one line
    return stage.run(opts, context())
