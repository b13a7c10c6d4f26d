"""Learned-gate pruning: the stage, hard-concrete gates (gates), their units (gate_space), and
setting them up and closing them (learn)."""
