"""`headprune finetune`: recovery training after pruning, with optional distillation
(the stage: stages/finetune/stage.py)."""

from __future__ import annotations

from headprune_cli.cli.command import from_options
from headprune_cli.cli.common import context
from headprune_cli.stages.finetune import stage


@from_options(stage.FinetuneOptions)
def finetune_command(opts: stage.FinetuneOptions):
    """Recover quality after pruning: AdamW with warmup and linear decay, on the checkpoint's own objective, optionally distilling from the unpruned model.

    Recovery keeps the model's shape; learned-gate pruning (formerly --learn-gates) is `headprune learn`.

    Loss with a teacher: (1 - a) * task + a * T^2 * KL(softmax(teacher/T) || softmax(student/T)); embedding models match the teacher's embeddings (1 - cosine). The output is written atomically at the end; the training state is saved every --save-every steps, and --resume continues from it with the same final weights as an uninterrupted run. Runs unchanged under torchrun (data parallel; --batch-size stays global).

    Examples:

      headprune finetune small.safetensors --data train.jsonl --eval-data dev.jsonl --epochs 3 -o small-ft.safetensors

      headprune finetune small.safetensors --data train.jsonl --teacher auto --kd-weight 0.5 -o small-kd.safetensors

      torchrun --nproc-per-node 2 -m headprune_cli finetune small.safetensors --data train.jsonl --steps 500 -o out.safetensors

    At LLM scale: --lora trains low-rank adapters (peft) on the attention and FFN projections and merges them into the output (--keep-adapter DIR also writes peft's adapter folder); --fsdp under torchrun shards weights, gradients, AdamW state and the teacher (FSDP2, one unit per block; sharded resumable state); --recompute (default from 400 M parameters) and --autocast cut activation memory.

      headprune finetune llama-pruned.safetensors --data train.txt --teacher auto --lora --lora-rank 16 --keep-adapter adapter -o llama-lora.safetensors

      torchrun --nproc-per-node 8 -m headprune_cli finetune llama-pruned.safetensors --data train.txt --teacher auto --fsdp -o llama-kd.safetensors

    --head-dropout P zeroes each head's output with probability P per example while training (not rescaled: the condition a pruned model runs in), so the model becomes robust to removal.

      headprune finetune model.safetensors --data train.jsonl --head-dropout 0.2 -o robust.safetensors

    Lottery tickets: --rewind-to CKPT gives the kept heads, FFN neurons and layers the weights they have in CKPT (a headprune checkpoint or a Hugging Face folder of the same family and shape, typically the pre-trained base the model was fine-tuned from), by the original indices the pruned checkpoint records; tensors CKPT lacks (a classifier, when CKPT is the bare encoder) keep their values and are named. --reinit SEED re-initialises the kept structure with the model's own init instead. Then it trains as usual. The random-heads control: `headprune select --strategy random --seed S`.

      headprune finetune pruned.safetensors --data train.jsonl --teacher auto --rewind-to init-folder/ -o ticket.safetensors

      headprune finetune pruned.safetensors --data train.jsonl --teacher auto --reinit 0 -o reinit.safetensors
    """  # noqa: E501 - the --help text, byte for byte: rich keeps its line breaks, so a paragraph is one line
    return stage.run(opts, context())
