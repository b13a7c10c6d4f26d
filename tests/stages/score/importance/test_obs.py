"""obs: structured OBS scores, checked against brute-force least-squares refits.

The greedy's cumulative error after k removals must equal the error of the best refit of the
kept features when those k groups are gone (the formula telescopes); on a model, the scores
must be that error for the refit's own token-weighted statistics, computed here directly
from the projection's inputs."""

from __future__ import annotations

import pytest
import torch

from headprune_cli.errors import UsageError
from headprune_cli.model.arch import adapter_for
from headprune_cli.model.arch.base import hidden_states_in
from headprune_cli.stages.score.importance import score_model
from headprune_cli.stages.score.importance.obs_greedy import STEP_SHARE, greedy_order
from tests.stages.score.importance.test_published import _inputs, _setup, _weight


def _refit_error(x: torch.Tensor, w: torch.Tensor, removed: list[int], group: int, lam: float = 0.0) -> float:
    """min over the kept rows W' of |X W - X_K W'|^2 + lam (|W_S|^2 + |W_K - W'|^2): the damped
    problem as ridge rows appended to the data, solved by lstsq. w: [in, out]."""
    n = w.shape[0]
    keep = [c for c in range(n) if c // group not in removed]
    target = x @ w
    a, b = x[:, keep], target
    if lam:
        eye = torch.eye(n, dtype=torch.float64) * lam**0.5
        a, b = torch.cat([a, eye[:, keep]]), torch.cat([b, eye @ w])
    solved = torch.linalg.lstsq(a, b, driver="gelsd").solution
    return float(((a @ solved - b) ** 2).sum())


@pytest.mark.parametrize("group", [1, 3])
@pytest.mark.parametrize("damp", [0.0, 0.3])
def test_cumulative_error_is_the_best_refit_of_the_rest(group, damp):
    torch.manual_seed(0)
    x = torch.randn(200, 12, dtype=torch.float64) @ torch.randn(12, 12, dtype=torch.float64)
    w = torch.randn(12, 5, dtype=torch.float64)
    gram = x.T @ x
    greedy = greedy_order(gram, w, group, damp)
    assert sorted(greedy.order) == list(range(12 // group))
    lam = damp * float(torch.diagonal(gram).mean())
    for k in range(1, len(greedy.order) + 1):
        assert greedy.errors[k - 1] == pytest.approx(_refit_error(x, w, greedy.order[:k], group, lam), rel=1e-7)


def test_wide_layers_remove_a_share_per_step_and_stay_exact_at_every_step():
    torch.manual_seed(3)
    x = torch.randn(400, 160, dtype=torch.float64) @ torch.randn(160, 160, dtype=torch.float64)
    w = torch.randn(160, 4, dtype=torch.float64)
    greedy = greedy_order(x.T @ x, w, 1, 0.1)
    assert greedy.steps[0] == 160 // STEP_SHARE and sum(greedy.steps) == 160 and greedy.steps[-1] == 1
    assert all(b >= a for a, b in zip(greedy.errors, greedy.errors[1:]))
    lam = 0.1 * float(torch.diagonal(x.T @ x).mean())
    alone = {j: _refit_error(x, w, [j], 1, lam) for j in range(160)}
    assert sorted(greedy.order[: greedy.steps[0]]) == sorted(sorted(alone, key=alone.get)[: greedy.steps[0]])
    done = 0
    for take in greedy.steps[:6]:
        done += take
        assert greedy.errors[done - 1] == pytest.approx(_refit_error(x, w, greedy.order[:done], 1, lam), rel=1e-7)


def test_each_step_removes_the_group_the_refit_repairs_best():
    """Brute force over the candidates at every step: the greedy's pick is the cheapest one."""
    torch.manual_seed(1)
    x = torch.randn(100, 8, dtype=torch.float64)
    w = torch.randn(8, 3, dtype=torch.float64)
    greedy = greedy_order(x.T @ x, w, 2, 0.0)
    for k, pick in enumerate(greedy.order):
        gone = greedy.order[:k]
        costs = {g: _refit_error(x, w, [*gone, g], 2) for g in range(4) if g not in gone}
        assert pick == min(costs, key=costs.get)


def test_a_duplicated_feature_goes_first_whatever_its_weight():
    """Feature 1 copies feature 0: the refit puts its work on feature 0 at no cost, so it goes
    first although its weight is the largest; a magnitude score would remove feature 2."""
    torch.manual_seed(2)
    a, c = torch.randn(50, 1, dtype=torch.float64), torch.randn(50, 1, dtype=torch.float64)
    x = torch.cat([a, a, c], 1)
    w = torch.tensor([[4.0], [5.0], [1.0]], dtype=torch.float64)
    greedy = greedy_order(x.T @ x, w, 1, 1e-9)
    assert greedy.order[:2] in ([0, 2], [1, 2])  # one copy, then the small independent feature
    assert greedy.errors[0] < 1e-6 * greedy.errors[1]
    residual = c - a * float((a * c).sum() / (a * a).sum())  # what of c the kept copy cannot explain
    assert greedy.errors[1] == pytest.approx(float((residual * residual).sum()), rel=1e-6)


def test_groups_must_split_the_features():
    with pytest.raises(ValueError, match="groups of 5"):
        greedy_order(torch.eye(12, dtype=torch.float64), torch.ones(12, 2, dtype=torch.float64), 5, 0.1)


def _weighted(x: torch.Tensor, w_out_in: torch.Tensor) -> tuple[torch.Tensor, float]:
    """X scaled by sqrt(1 / |Y_t|^2) per token (the refit's weights) and sum_t w_t |Y_t|^2."""
    y = x.double() @ w_out_in.T
    norms = (y * y).sum(1)
    weights = 1 / norms.clamp_min(1e-6 * float(norms.mean()))
    return x.double() * weights.sqrt()[:, None], float((weights * norms).sum())


@pytest.mark.parametrize("name", ["llama-gqa", "llama"])
def test_model_scores_are_the_refit_error_of_every_prefix(tmp_path, name):
    model, data = _setup(tmp_path, name)
    damp = 0.05
    result = score_model(model, data, "obs", batch_size=3, ffn=True, method_options={"obs_damp": damp})
    adapter, blocks, seen = _inputs(model, data)
    for layer, block in enumerate(blocks):
        view, ffn = adapter.attention(block), adapter.ffn(block)
        for key, module, scores, group in (
            ("down", ffn.down, result.ffn[layer], 1),
            ("o", view.o, [sum(s) for s in _grouped(result.heads[layer], view.group_size)], None),
        ):
            w = _weight(module)
            features = view.group_size * view.head_dim if group is None else group
            xw, yy = _weighted(seen[(key, layer)], w)
            lam = damp * float((xw * xw).sum(0).mean())
            order = sorted(range(len(scores)), key=lambda u: scores[u])
            for k in range(1, len(order) + 1):
                expected = _refit_error(xw, w.T, order[:k], features, lam) / yy
                assert scores[order[k - 1]] == pytest.approx(expected, rel=1e-6)  # float32-exact


def _grouped(heads: dict[int, float], size: int) -> list[list[float]]:
    values = [heads[h] for h in sorted(heads)]
    return [values[i : i + size] for i in range(0, len(values), size)]


def test_marginal_scores_rise_and_sum_to_at_least_the_layer_error(tmp_path):
    model, data = _setup(tmp_path, "llama")
    cumulative = score_model(model, data, "obs", batch_size=4, ffn=True)
    marginal = score_model(model, data, "obs", batch_size=4, ffn=True, method_options={"obs_score": "marginal"})
    assert marginal.config["obs_score"] == "marginal" and cumulative.config["obs_score"] == "cumulative"
    for layer, scores in cumulative.ffn.items():
        order = sorted(range(len(scores)), key=lambda j: scores[j])
        steps = [marginal.ffn[layer][j] for j in order]
        # The cumulative order survives select's sort, also in the artifact's float32.
        assert all(b > a for a, b in zip(steps, steps[1:]))
        assert all(b > a for a, b in zip(torch.tensor(steps).float(), torch.tensor(steps).float()[1:]))
        assert sum(steps) >= scores[order[-1]] * (1 - 1e-6)
        assert steps[0] == pytest.approx(scores[order[0]], rel=1e-6)


def test_output_norm_scales_each_layer_by_its_output_energy(tmp_path):
    model, data = _setup(tmp_path, "llama")
    relative = score_model(model, data, "obs", batch_size=4, ffn=True)
    output = score_model(model, data, "obs", batch_size=4, ffn=True, method_options={"obs_norm": "output"})
    residual = score_model(model, data, "obs", batch_size=4, ffn=True, method_options={"obs_norm": "residual"})
    adapter, blocks, seen = _inputs(model, data)
    hidden = _residual_energy(model, data, blocks)
    for layer, block in enumerate(blocks):
        down = adapter.ffn(block).down
        y = seen[("down", layer)].double() @ _weight(down).T
        energy = float((y * y).sum(1).mean())
        ratio = [o / r for o, r in zip(output.ffn[layer], relative.ffn[layer])]
        assert ratio == pytest.approx([energy] * len(ratio), rel=1e-6)  # float32 scores
        ratio = [o / r for o, r in zip(residual.ffn[layer], relative.ffn[layer])]
        assert ratio == pytest.approx([energy / hidden[layer]] * len(ratio), rel=1e-6)


def _residual_energy(model, data, blocks) -> list[float]:
    """Mean over real tokens of |h_t|^2 entering each block."""
    real = data.attention_mask.bool()
    seen = {}

    def keep(pos):
        def hook(module, args, kwargs):
            h = hidden_states_in(args, kwargs).detach()[real].double()
            seen[pos] = float((h * h).sum(1).mean())

        return hook

    handles = [b.register_forward_pre_hook(keep(p), with_kwargs=True) for p, b in enumerate(blocks)]
    with torch.no_grad():
        model(input_ids=data.input_ids, attention_mask=data.attention_mask)
    for handle in handles:
        handle.remove()
    return [seen[p] for p in range(len(blocks))]


def test_scores_are_deterministic_and_refuse_bad_settings(tmp_path):
    model, data = _setup(tmp_path, "gpt2")
    first = score_model(model, data, "obs", batch_size=4, ffn=True)
    assert first.heads == score_model(model, data, "obs", batch_size=4, ffn=True).heads
    assert len(first.ffn[0]) == adapter_for(model).ffn(adapter_for(model).layer_list(model)[0]).width
    for bad, match in (({"obs_norm": "energy"}, "--obs-norm"), ({"obs_damp": -1.0}, "--obs-damp")):
        with pytest.raises(UsageError, match=match):
            score_model(model, data, "obs", batch_size=4, method_options=bad)


def test_cli_refuses_obs_options_for_other_methods(tmp_path, cli):
    done = cli("score", str(tmp_path / "m.safetensors"), "--data", str(tmp_path / "d.txt"), "--obs-norm", "output")
    assert done.code == 2 and "only applies to --method obs" in done.err
