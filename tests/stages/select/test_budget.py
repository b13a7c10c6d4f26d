"""`--target-flops` and `--target-params` budget different costs: on a model where the two
disagree, each plan meets its own budget, measured on the cut model itself."""

from __future__ import annotations

import json

from headprune_cli import load
from headprune_cli.model.cost import flops_per_token
from headprune_cli.model.surgery import apply_plan
from tests.support import saved_model, write_scores

SEQ = 16  # the sequence length of the cost table in tests.support.scores_for


def _cut_costs(model_path, plan: dict) -> tuple[float, float, int]:
    """(params, FLOPs per token, heads removed) of the model the plan makes."""
    model = load(model_path)
    remove = {int(k): v for k, v in plan["remove_heads"].items()}
    apply_plan(model, remove, plan["remove_layers"])
    return sum(p.numel() for p in model.parameters()), flops_per_token(model, SEQ), sum(len(v) for v in remove.values())


def test_target_flops_budgets_flops_and_target_params_budgets_params(tmp_path, cli):
    # The tiny BERT's parameters are dominated by its embeddings and its FLOPs by attention:
    # a head is ~2.5% of the parameters and ~5% of the FLOPs, so one budget of 0.9 asks for
    # about 2 heads in FLOPs and about 4 in parameters.
    model, model_path = saved_model(tmp_path)
    scores = write_scores(tmp_path, model, model_path)
    params0, flops0 = sum(p.numel() for p in model.parameters()), flops_per_token(model, SEQ)
    costs = {}
    for option in ("--target-flops", "--target-params"):
        out = tmp_path / f"plan{option}.json"
        result = cli("select", scores, option, "0.9", "-o", out)
        assert result.code == 0, result.err
        costs[option] = _cut_costs(model_path, json.loads(out.read_text()))
    (p_f, f_f, n_f), (p_p, _, n_p) = costs["--target-flops"], costs["--target-params"]
    assert f_f <= 0.9 * flops0 and p_f > 0.9 * params0  # the FLOPs plan meets FLOPs, not params
    assert p_p <= 0.9 * params0  # the params plan meets params
    assert n_f < n_p, (n_f, n_p)
    # Each plan removes no more than it needs: one head fewer would miss its own budget.
    per_head_flops = (flops0 - f_f) / n_f
    per_head_params = (params0 - p_p) / n_p
    assert f_f + per_head_flops > 0.9 * flops0
    assert p_p + per_head_params > 0.9 * params0
