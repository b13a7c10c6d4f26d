"""The stages, one package each: stages/<name>/stage.py holds the options model, `run` and
STAGE (unit.py's rule), the algorithms it uses sit beside it. Shared by all: unit.py (the
stage unit), options.py (the option groups declared once), budget.py (the one budget value),
objectives.py (losses and metrics), lm_chunks.py (a causal LM's head in chunks of tokens),
timing.py (the timing harness) and model_latency.py (whole-model latency)."""
