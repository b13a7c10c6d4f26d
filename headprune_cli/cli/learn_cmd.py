"""`headprune learn`: learned-gate pruning, a checkpoint -> a pruned checkpoint and the gate
scores (the stage: stages/learn/stage.py)."""

from __future__ import annotations

from headprune_cli.cli.command import from_options
from headprune_cli.cli.common import context
from headprune_cli.stages.learn import stage


@from_options(stage.LearnOptions)
def learn(opts: stage.LearnOptions):
    """Prune by learned gates: hard-concrete gates train with the model under one budget, then the closed heads, neurons and layers are cut.

    Gates on the heads (whole KV groups for GQA models), and with a FLOPs/params target on every FFN neuron (--gate-ffn) and every whole layer (--gate-layers), train with the model under the one budget (--ratio, --target-params or --target-flops); a Lagrangian (CoFi) drives the expected share removed to the target, which rises from 0 over --gate-warmup of the gate phase (the first 1 - --closed-share of the steps) and is then held. At the closing step, an expected share further than --gate-tolerance from the target trains up to --gate-extra-steps more gate steps, then refuses (nothing written). The gates then close as `headprune select` would choose from their open probabilities (with --min-heads, --multiple-of, --protect, --uniform, --min-ffn, --ffn-multiple-of; layers open with probability below 0.5 are dropped), the last --closed-share of the steps trains the model with them closed, and the output is the physically cut model. With a teacher, --hidden-weight (default 1 here) adds layer distillation: each block's output against the teacher's. --gates-out writes the open probabilities as scores (method `learned`) with the gates' report (expected vs target vs lambdas per step, expected vs closed share) under config.gates. --teacher auto on an unpruned model distils from the model itself. The training options are finetune's (--steps, --lr, --kd-weight, --lora, ...); not resumable, one process. Recover further with `headprune finetune`.

    Examples:

      headprune learn model.safetensors --data train.jsonl --ratio 0.5 --teacher auto --gates-out gates.json -o small.safetensors

      headprune learn model.safetensors --data train.jsonl --ratio 0.85 --teacher auto --gate-warmup 0.5 --gate-tolerance 0.01 --gate-extra-steps 50 -o small.safetensors

      headprune learn model.safetensors --data train.jsonl --target-flops 0.5 --gate-ffn --gate-layers --teacher auto -o small.safetensors
    """  # noqa: E501 - the --help text, byte for byte: rich keeps its line breaks, so a paragraph is one line
    return stage.run(opts, context())
