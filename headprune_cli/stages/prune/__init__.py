"""prune."""
