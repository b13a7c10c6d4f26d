"""Tests of the training loop finetune and learn share (stages/training)."""
