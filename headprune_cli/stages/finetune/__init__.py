"""Recovery training: the stage (finetune.stage) and lottery rewinding (rewind); the loop is stages/training."""
