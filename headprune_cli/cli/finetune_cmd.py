"""`headprune finetune`: recovery training after pruning, with optional distillation (the stage: stages/finetune/stage.py)."""

from __future__ import annotations

from headprune_cli.cli.command import from_options
from headprune_cli.cli.common import context
from headprune_cli.stages.finetune import stage


@from_options(stage.FinetuneOptions)
def finetune_command(opts: stage.FinetuneOptions):
    """Recover quality after pruning: AdamW with warmup and linear decay, on the checkpoint's own objective, optionally distilling from the unpruned model.

    Loss with a teacher: (1 - a) * task + a * T^2 * KL(softmax(teacher/T) || softmax(student/T)); embedding models match the teacher's embeddings (1 - cosine). The output is written atomically at the end; the training state is saved every --save-every steps, and --resume continues from it with the same final weights as an uninterrupted run. Runs unchanged under torchrun (data parallel; --batch-size stays global).

    Examples:

      headprune finetune small.safetensors --data train.jsonl --eval-data dev.jsonl --epochs 3 -o small-ft.safetensors

      headprune finetune small.safetensors --data train.jsonl --teacher auto --kd-weight 0.5 -o small-kd.safetensors

      torchrun --nproc-per-node 2 -m headprune_cli finetune small.safetensors --data train.jsonl --steps 500 -o out.safetensors
    """
    return stage.run(opts, context())
