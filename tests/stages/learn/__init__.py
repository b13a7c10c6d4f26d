"""Tests of the learn stage (learned-gate pruning)."""
