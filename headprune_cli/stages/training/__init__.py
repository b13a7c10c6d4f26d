"""The training loop that `finetune` and `learn` share: the loop (train), its options, the run
around it (run), distillation, losses, LoRA, FSDP, precision, training state, gating hooks."""
