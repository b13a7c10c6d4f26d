"""The stages, one package each: stages/<name>/stage.py holds the options model, `run` and
STAGE (unit.py's rule), the algorithms it uses sit beside it. Shared by all: unit.py (the
stage unit), budget.py (the one budget value), objectives.py (losses and metrics),
timing.py (the timing harness)."""
