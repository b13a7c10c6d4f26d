"""`--target-flops`, `--target-params` and `--target-block-params` budget different costs: on a
model where they disagree, each plan meets its own budget, measured on the cut model itself."""

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


def _block_params(model) -> int:
    """The params inside the tiny BERT's transformer blocks, counted from its modules."""
    return sum(p.numel() for p in model.bert.encoder.layer.parameters())


def test_target_block_params_budgets_the_blocks_and_not_the_embeddings(tmp_path, cli):
    # The tiny BERT's embeddings are most of its parameters: 0.9 of the block params removes
    # far fewer heads than 0.9 of all params, and a budget that counted the embeddings (or
    # left them in the total) would cut past its own limit by several heads.
    model, model_path = saved_model(tmp_path)
    scores = write_scores(tmp_path, model, model_path)
    blocks0 = _block_params(model)
    plans = {}
    for option in ("--target-block-params", "--target-params"):
        out = tmp_path / f"plan{option}.json"
        result = cli("select", scores, option, "0.9", "-o", out)
        assert result.code == 0, result.err
        plans[option] = json.loads(out.read_text())
    plan = plans["--target-block-params"]
    assert plan["config"]["target_block_params"] == 0.9
    assert "target_block_params" not in plans["--target-params"]["config"]  # other budgets' bytes unchanged
    cut = load(model_path)
    apply_plan(cut, {int(k): v for k, v in plan["remove_heads"].items()}, plan["remove_layers"])
    removed = sum(len(v) for v in plan["remove_heads"].values())
    blocks = _block_params(cut)
    assert not plan["remove_layers"] and removed > 0
    assert blocks <= 0.9 * blocks0
    assert blocks + (blocks0 - blocks) / removed > 0.9 * blocks0  # one head fewer would miss it
    assert removed < sum(len(v) for v in plans["--target-params"]["remove_heads"].values())
    cut_all = sum(p.numel() for p in cut.parameters())
    assert cut_all > 0.9 * sum(p.numel() for p in model.parameters())  # the embeddings are not cut into


def test_prune_scores_takes_target_block_params_and_refuses_it_with_another_budget(tmp_path, cli):
    model, model_path = saved_model(tmp_path)
    scores = write_scores(tmp_path, model, model_path)
    out = tmp_path / "small.safetensors"
    result = cli("prune", model_path, "--scores", scores, "--target-block-params", "0.9", "-o", out)
    assert result.code == 0, result.err
    assert _block_params(load(out)) <= 0.9 * _block_params(model)
    both = cli("select", scores, "--target-block-params", "0.9", "--target-flops", "0.9")
    assert both.code != 0 and both.err.count("\n") == 1 and both.err.startswith("Error: give exactly one of")
    assert "--target-block-params" in both.err
    bad = cli("select", scores, "--target-block-params", "0")
    assert bad.code != 0 and "--target-block-params 0.0 is outside (0, 1]" in bad.err


def test_search_meets_a_block_params_budget_on_the_blocks(tmp_path, cli):
    from tests.support import tensor_data

    model, model_path = saved_model(tmp_path)
    out = tmp_path / "plan.json"
    result = cli(
        "search", model_path, "--data", tensor_data(tmp_path), "--objective", "fidelity", "--method", "random",
        "--target-block-params", "0.9", "--evaluations", "6", "--compensate", "none", "--judge", "loss", "-o", out,
    )  # fmt: skip
    assert result.code == 0, result.err
    plan = json.loads(out.read_text())
    assert plan["config"]["target_block_params"] == 0.9
    cut = load(model_path)
    apply_plan(cut, {int(k): v for k, v in plan["remove_heads"].items()}, plan["remove_layers"])
    # At most 0.9 of the blocks kept, within about a head (4.7% of the blocks) of it: a plan
    # meeting 0.9 of all the params would keep at most 0.813 of them.
    assert 0.85 < _block_params(cut) / _block_params(model) <= 0.9
