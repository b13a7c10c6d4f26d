"""`iterate`: gradual pruning with recovery. stage.py (options, run), schedule.py (the
schedule of budgets), rounds.py (rescore, cut, recover per round)."""
