"""`sweep`: the quality curve. stage.py (options, run), ratios.py (head ratios), budgets.py
(FLOPs budgets per route)."""
