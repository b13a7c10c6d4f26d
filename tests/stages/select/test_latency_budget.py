"""`select --latency`: the joint selection priced by a hand-written latency table whose
prices make the right answer known, the plan's latency record, and tightening."""

from __future__ import annotations

import json

import pytest

from headprune_cli.artifacts.schema import dumps
from tests.support import saved_model, scores_for
from tests.support.latency import latency_table, shape_of, write_latency


def _loo_scores(tmp_path, model, path, heads=None, layers=None):
    """Loss-scale scores (loo heads and layers): the joint selection prices heads against layers."""
    artifact = scores_for(model, path, scores=heads)
    artifact.update(method="loo", config={"method": "loo", "layers": "loo"})
    if layers is not None:
        artifact["layers"] = {str(k): v for k, v in layers.items()}
    out = tmp_path / "scores.json"
    out.write_text(dumps(artifact))
    return out


@pytest.fixture
def workspace(tmp_path):
    model, path = saved_model(tmp_path, "bert")
    # Layer 0's heads lose a little more than the others': by FLOPs (every head costs the
    # same FLOPs) they go last; by milliseconds (theirs cost 6x more) first.
    heads = {layer: {h: 1.1 if layer == 0 else 1.0 for h in range(4)} for layer in range(3)}
    scores = _loo_scores(tmp_path, model, path, heads=heads, layers={0: 100.0, 1: 100.0, 2: 100.0})
    return tmp_path, model, path, scores


def _expensive_layer_0(tmp_path, model, path, name="latency.json"):
    """Layer 0's heads cost 3 ms each, the others' 0.5 ms; FFNs are free to cut (flat); the rest 1 ms.
    Whole model: 1 + (2 + 12) + 2 x (2 + 2) = 23 ms."""
    shape = shape_of(model, path)
    table = latency_table(path, shape, attention=lambda layer, k: 2.0 + (3.0 if layer == 0 else 0.5) * k, outside=1.0)
    (tmp_path / name).write_text(dumps(table))
    return tmp_path / name


def test_latency_budget_cuts_where_milliseconds_are(workspace, cli):
    """The joint greedy spends the loss where each ms saved is cheapest: layer 0's 3 ms heads.
    14 of 23 ms = removing 3 of layer 0's heads (3 x 3 ms); the same FLOPs budget cuts elsewhere."""
    folder, model, path, scores = workspace
    table = _expensive_layer_0(folder, model, path)
    result = cli("select", scores, "--latency", table, "--target-ms", "14", "-o", folder / "plan.json")
    assert result.code == 0, result.err
    plan = json.loads((folder / "plan.json").read_text())
    assert plan["remove_heads"] == {"0": [0, 1, 2]} and plan["remove_layers"] == []
    latency = plan["latency"]
    assert latency["before_ms"] == pytest.approx(23.0) and latency["after_ms"] == pytest.approx(14.0)
    assert latency["target_ms"] == 14 and latency["device"] == "Test CPU" and latency["selections"] >= 1
    assert (
        plan["predicted"]["after"]["flops_per_token"] < plan["predicted"]["before"]["flops_per_token"]
    )  # FLOPs beside ms
    assert {"role": "latency"}.items() <= next(r for r in plan["inputs"] if r["role"] == "latency").items()
    by_flops = cli(
        "select",
        scores,
        "--target-flops",
        str(plan["predicted"]["after"]["flops_per_token"] / plan["predicted"]["before"]["flops_per_token"]),
    )
    assert json.loads(by_flops.out)["remove_heads"] != plan["remove_heads"]


def test_target_latency_is_a_fraction_of_the_profile_and_plans_are_byte_identical(workspace, cli, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    folder, model, path, scores = workspace
    table = _expensive_layer_0(folder, model, path)
    result = cli("select", scores, "--latency", table, "--target-latency", str(14 / 23))
    assert result.code == 0, result.err
    assert json.loads(result.out)["remove_heads"] == {"0": [0, 1, 2]}
    assert cli("select", scores, "--latency", table, "--target-latency", str(14 / 23)).out == result.out
    assert "latency 14 ms predicted" in result.err.replace("\n", " ")


def test_a_concave_table_is_tightened_until_the_measured_points_fit(workspace, cli):
    """Layer 0's first removed head saves 0.75 ms by the measured points (11 -> 10.25 at 3
    heads) but 0.96 ms by the fitted linear price: a 0.9 ms cut fits the prices, not the
    points, so the budget is tightened and a second head goes too (the next cheapest loss
    per ms: one of layer 1's 0.5 ms heads)."""
    folder, model, path, scores = workspace
    concave = {1: 8.0, 2: 9.5, 4: 11.0}
    shape = shape_of(model, path)
    table = latency_table(
        path, shape, attention=lambda layer, k: concave[k] if layer == 0 else 2.0 + 0.5 * k, outside=1.0
    )
    (folder / "t.json").write_text(dumps(table))
    result = cli("select", scores, "--latency", folder / "t.json", "--target-ms", "19.1")
    assert result.code == 0, result.err
    plan = json.loads(result.out)
    assert plan["latency"]["before_ms"] == pytest.approx(20.0)
    assert plan["remove_heads"] == {"0": [0], "1": [0]} and plan["latency"]["after_ms"] == pytest.approx(
        20 - 0.75 - 0.5
    )
    assert plan["latency"]["selections"] >= 2


def test_a_budget_that_overshoots_by_the_points_is_loosened_to_the_plan_that_cuts_less(workspace, cli):
    """Layer 0 costs 2 ms at 1 or 2 heads and 11 ms at 4: its fitted price (3.2 ms a head)
    says three heads must go to save 7 ms; the measured points say two suffice (11 -> 2 ms).
    The bisection finds the looser budget whose plan the points say fits: two heads."""
    folder, model, path, scores = workspace
    step = {1: 2.0, 2: 2.0, 4: 11.0}
    table = latency_table(
        path, shape_of(model, path), attention=lambda layer, k: step[k] if layer == 0 else 2.0 + 0.5 * k, outside=1.0
    )
    (folder / "t.json").write_text(dumps(table))
    plan = json.loads(cli("select", scores, "--latency", folder / "t.json", "--target-ms", "13").out)
    assert plan["remove_heads"] == {"0": [0, 1]} and plan["latency"]["after_ms"] == pytest.approx(11.0)


def test_decode_prices_choose_by_the_decode_profile(workspace, cli):
    """Forward: layer 0's heads are the expensive ones; decode (its own profile): layer 2's."""
    folder, model, path, scores = workspace
    shape = shape_of(model, path)
    table = latency_table(path, shape, attention=lambda layer, k: 2.0 + (3.0 if layer == 0 else 0.5) * k)
    decode = latency_table(path, shape, attention=lambda layer, k: 2.0 + (3.0 if layer == 2 else 0.5) * k)
    table["phases"]["decode"] = {**decode["phases"]["forward"], "context": 64}
    (folder / "t.json").write_text(dumps(table))
    forward = json.loads(cli("select", scores, "--latency", folder / "t.json", "--target-ms", "14").out)
    by_decode = json.loads(
        cli("select", scores, "--latency", folder / "t.json", "--target-ms", "14", "--latency-phase", "decode").out
    )
    assert forward["remove_heads"] == {"0": [0, 1, 2]} and forward["latency"]["phase"] == "forward"
    assert by_decode["remove_heads"] == {"2": [0, 1, 2]} and by_decode["latency"]["phase"] == "decode"
    assert by_decode["config"]["latency_phase"] == "decode"


def test_ffn_and_heads_priced_together(tmp_path, cli):
    """Scores with FFN neurons: cheap-to-score neurons whose ms the table says are worth more."""
    from tests.support import saved_model as save

    model, path = save(tmp_path, "bert")
    scores = _ffn_scores(tmp_path, model, path)
    table = write_latency(tmp_path / "t.json", model, path)
    result = cli("select", scores, "--latency", table, "--target-latency", "0.8")
    assert result.code == 0, result.err
    plan = json.loads(result.out)
    assert plan["latency"]["after_fraction"] <= 0.8 + 1e-9
    assert plan.get("remove_ffn") or plan["remove_heads"]


def _ffn_scores(tmp_path, model, path):
    from headprune_cli.cli import main

    data = tmp_path / "data.safetensors"
    from tests.support import tensor_data

    data = tensor_data(tmp_path)
    out = tmp_path / "ffn-scores.json"
    assert (
        main(
            [
                "score",
                str(path),
                "--data",
                str(data),
                "--method",
                "fisher",
                "--objective",
                "fidelity",
                "--ffn",
                "--samples",
                "8",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    return out


def test_a_plan_a_hair_over_the_target_is_not_chosen_again_by_a_budget_a_hair_tighter():
    """The linear budget is tightened by a margin that grows: the interpolated latency of
    a plan is a step function of the budget, and the same plan must not come back."""
    from headprune_cli.stages.select.latency import _search

    target = 100.0

    def attempt(fraction):  # every budget above 0.5 yields the same plan, just over the target
        return ("tight" if fraction <= 0.5 else "loose"), (90.0 if fraction <= 0.5 else target * (1 + 1e-7))

    selection, ms = _search(attempt, 0.7, target)
    assert selection == "tight" and ms == 90.0
