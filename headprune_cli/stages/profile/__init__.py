"""`profile`: measured latency per layer at a grid of kept heads and FFN widths (stage.py)."""
