"""Recovery training: the loop (train), distillation (distill), task losses, training state on disk."""
