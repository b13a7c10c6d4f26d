"""The options of the training loop, declared once for the two stages that train.

`finetune` (recovery) and `learn` (learned-gate pruning) both read a checkpoint and
training data and run the same loop (train.py): these are its files, steps, rates,
distillation, LoRA and precision. Each stage's options model adds its own fields to this
one; no option is declared in both. torch stays out of this module's import.
"""

from __future__ import annotations

from pathlib import Path

from headprune_cli.errors import UsageError
from headprune_cli.stages.unit import Options, device_option, option

LORA_SETTINGS = ("lora_rank", "lora_alpha", "lora_dropout", "lora_targets")


class TrainingOptions(Options):
    checkpoint: Path = option(..., "The checkpoint to train.", argument=True)
    data: Path = option(..., "Training data (JSONL/CSV/text/safetensors).")
    output: Path = option(..., "Where to write the trained checkpoint.", "-o", "--output")
    eval_data: Path | None = option(None, "Dev set: evaluated every epoch; the best epoch is kept.")
    teacher: str | None = option(None, "Distil from this checkpoint, or `auto` = the root model in CKPT's provenance.")
    epochs: int | None = option(None, "Passes over the training data (default 1 unless --steps).")
    steps: int | None = option(None, "Optimizer steps (instead of --epochs).")
    lr: float | None = option(
        None,
        "Peak learning rate (default: about a tenth of the usual fine-tuning rate for the model's size; "
        "with --lora, 10x that).",
    )
    batch_size: int = option(16, "Rows per micro-batch, over all processes.", ge=1)
    grad_accum: int = option(1, "Micro-batches per optimizer step.", ge=1)
    warmup: float = option(0.1, "Warmup: a fraction of the steps (<1) or a step count.", ge=0)
    kd_weight: float | None = option(None, "Weight a of the distillation term (default 0.5 with a teacher).")
    kd_temperature: float = option(2.0, "Softmax temperature T for distillation.", ge=0.01)
    hidden_weight: float | None = option(
        None,
        "Weight of layer distillation: each block's output against the teacher's (relative squared error); "
        "default 1 in `learn` with a teacher, else 0.",
        ge=0.0,
    )
    seed: int = option(0, "Seed for data order and dropout.")
    max_length: int = option(128, "Truncate sequences to this many tokens.", ge=1)
    force: bool = option(False, "Overwrite OUT if it exists.")
    device: str = device_option()
    dtype: str = option(
        "auto",
        "Training dtype: auto (stored), float32 (float32 master weights for a bf16 model), bfloat16, float16; "
        "the output keeps the stored dtype.",
    )
    lora: bool = option(
        False,
        "Train low-rank adapters (peft) on the attention and FFN projections instead of every weight; "
        "they are merged into the output.",
    )
    lora_rank: int = option(8, "--lora: adapter rank r (at most the narrowest targeted projection's width).")
    lora_alpha: float | None = option(None, "--lora: scaling alpha (the update is scaled by alpha / r; default 2 r).")
    lora_dropout: float = option(0.0, "--lora: dropout on the adapters' input, in [0, 1).")
    lora_targets: str | None = option(
        None,
        "--lora: projections to adapt, NAME[,NAME] matched as a module-name suffix (default: every block's "
        "attention and FFN projections, e.g. q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj).",
    )
    recompute: bool | None = option(
        None,
        "Recompute each block's activations in the backward instead of keeping them (less memory, "
        "one more forward per micro-batch, the same gradients). Default: on from 400 M parameters.",
        negative="--no-recompute",
    )
    autocast: bool | None = option(
        None,
        "Run the forward passes under bf16 autocast (weights, gradients and AdamW state keep their dtype). "
        "Default: on where the device computes bf16 natively (CUDA), off on CPU.",
        negative="--no-autocast",
    )

    def lora_spec(self):
        from headprune_cli.stages.training.lora import LoraSpec  # noqa: PLC0415 (keeps torch, transformers out of this module's import)

        targets = (
            None if self.lora_targets is None else tuple(t.strip() for t in self.lora_targets.split(",") if t.strip())
        )
        return LoraSpec(self.lora_rank, self.lora_alpha, self.lora_dropout, targets)

    def check_lora(self) -> None:
        """LoRA settings without --lora would be ignored: refused."""
        given = [f for f in LORA_SETTINGS if getattr(self, f) != TrainingOptions.model_fields[f].default]
        if given and not self.lora:
            raise UsageError(f"{', '.join('--' + f.replace('_', '-') for f in given)}: LoRA settings need --lora")
