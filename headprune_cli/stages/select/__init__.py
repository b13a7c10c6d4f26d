"""`select`: scores -> plan. stage.py (options, run), chains.py (per-layer chains and
constraints), strategies.py (the strategies and `select`), ffn.py (heads + FFN neurons under one
budget), joint.py (heads and layers on the loss scale), uniform.py (one shape for every layer),
latency.py (budgets in measured milliseconds), plan.py (the plan artifact)."""
