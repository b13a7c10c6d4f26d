"""`sweep`: the quality curve. stage.py (options, run), loop.py (one loop over head-ratio or
FLOPs budgets), views.py (sweep.md and the curves), sweep_artifact.py (the artifact)."""
