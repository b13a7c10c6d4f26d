"""`search`: a plan judged by measured loss. stage.py (options, run), space.py (the
candidates and moves), local.py (the local search), layer_rescore.py (layers chosen one at a
time), masked_loss.py (a candidate's held-out loss)."""
