"""`prune`: plan -> smaller checkpoint. stage.py (options, run, `cut`), compensation.py
(retraining-free compensation), solve.py (its closed forms), streams.py (its hidden-state streams)."""
