"""`headprune search`: plans found by measured loss, from the greedy start, under the constraints."""

from __future__ import annotations

import json

import pytest

from headprune_cli.stages.budget import Budget
from headprune_cli.stages.constraints import Constraints
from headprune_cli.stages.score.table import ScoreTable
from headprune_cli.stages.search.local import search
from headprune_cli.stages.select.strategies import select
from tests.support import ROOT, assert_refused

DEMO = ROOT / "examples" / "demo"


def _table(scores: list[list[float]]) -> ScoreTable:
    return ScoreTable(
        heads={l: dict(enumerate(row)) for l, row in enumerate(scores)},
        num_heads=[len(r) for r in scores],
        num_kv_heads=[len(r) for r in scores],
    )


def _quadratic(weights):
    """A loss that punishes removing several heads of one layer: not additive, as real losses are not."""
    seen = []

    def loss(remove_heads, remove_layers, remove_ffn):
        seen.append({k: list(v) for k, v in remove_heads.items()})
        return float(sum(w * len(remove_heads.get(layer, [])) ** 2 for layer, w in enumerate(weights)))

    return loss, seen


def test_search_finds_the_spread_out_plan_that_greedy_scores_miss():
    # Layer 0's heads score lowest, so greedy takes all three of them; removing one head
    # from each layer costs 3 instead of 9 under the measured loss.
    table = _table([[0.01, 0.02, 0.03, 0.04], [1.0, 1.1, 1.2, 1.3], [2.0, 2.1, 2.2, 2.3]])
    greedy = select(table, budget=Budget("heads", 0.25))
    assert {k: len(v) for k, v in greedy.remove_heads.items()} == {0: 3}
    loss, _ = _quadratic([1.0, 1.0, 1.0])
    result = search(table, loss, budget=Budget("heads", 0.25), evaluations=50)
    assert result.start_loss == 9.0 and result.best_loss == 3.0 and result.improvements >= 1
    assert {k: len(v) for k, v in result.selection.remove_heads.items()} == {0: 1, 1: 1, 2: 1}
    assert result.selection.remove_heads[1] == [0] and result.selection.remove_heads[2] == [
        0
    ]  # the lowest-scored head of each layer
    assert result.history == sorted(result.history, reverse=True) and result.evaluations <= 50


def test_every_candidate_keeps_the_budget_and_the_constraints():
    table = _table([[0.1, 0.2, 0.3, 0.4, 0.5, 0.6], [0.7, 0.8, 0.9, 1.0, 1.1, 1.2], [1.3, 1.4, 1.5, 1.6, 1.7, 1.8]])
    constraints = Constraints(min_heads=2, multiple_of=2, protect=((1, 0),))
    loss, seen = _quadratic([3.0, 1.0, 2.0])
    result = search(table, loss, budget=Budget("heads", 0.45), constraints=constraints, evaluations=40, seed=3)
    removed = sum(
        len(v) for v in select(table, budget=Budget("heads", 0.45), constraints=constraints).remove_heads.values()
    )
    assert len(seen) == result.evaluations > 1
    for candidate in seen:
        assert sum(len(v) for v in candidate.values()) == removed
        for heads in candidate.values():
            kept = 6 - len(heads)
            assert kept >= 2 and kept % 2 == 0
        assert 0 not in candidate.get(1, [])  # protected


def test_the_evaluation_bound_is_kept_and_the_search_is_deterministic():
    table = _table([[0.1 * i for i in range(8)] for _ in range(6)])
    runs = []
    for _ in range(2):
        loss, seen = _quadratic([1, 2, 3, 4, 5, 6])
        runs.append((search(table, loss, budget=Budget("heads", 0.5), evaluations=7, seed=11), seen))
    (a, seen_a), (b, seen_b) = runs
    assert a.evaluations == 7 == len(seen_a) and seen_a == seen_b
    assert a.selection.remove_heads == b.selection.remove_heads
    loss, seen = _quadratic([1, 2, 3, 4, 5, 6])
    other = search(table, loss, budget=Budget("heads", 0.5), evaluations=7, seed=12)
    assert seen != seen_a or other.selection.remove_heads == a.selection.remove_heads  # another order, same bound
    assert other.evaluations == 7


def _held_out_loss(plan: dict, fraction: float = 0.5) -> float:
    """The plan's loss measured again, independently of the search, on the held-out rows."""
    import headprune_cli
    from headprune_cli.data.readers import read_data
    from headprune_cli.stages.search.masked_loss import MaskedLoss

    model = headprune_cli.load(DEMO / "model.safetensors")
    data = read_data(DEMO / "calib.jsonl", model, max_length=64)
    cut = len(data) - round(len(data) * fraction)
    loss = MaskedLoss(model, data.select(cut, len(data)), "classification", 32)
    return loss({int(k): v for k, v in plan["remove_heads"].items()}, plan["remove_layers"])


def test_search_on_the_demo_classifier_measures_its_plan_and_prunes_with_it(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "0")
    out = tmp_path / "plan.json"
    args = [
        "search",
        DEMO / "model.safetensors",
        "--data",
        DEMO / "calib.jsonl",
        "--target-flops",
        "0.5",
        "--layers",
        "--layer-method",
        "loo",
        "--evaluations",
        "15",
        "--compensate",
        "none",
        "--judge",
        "loss",
        "-o",
        out,
    ]
    result = cli(*args)
    assert result.code == 0, result.err
    plan = json.loads(out.read_text())
    record = plan["search"]
    assert plan["kind"] == "plan" and plan["strategy"] == "search" and 1 <= record["evaluations"] <= 30
    assert record["best_loss"] <= record["start_loss"]
    assert _held_out_loss(plan) == pytest.approx(record["best_loss"], rel=1e-9)
    after, before = plan["predicted"]["after"], plan["predicted"]["before"]
    assert after["flops_per_token"] <= 0.5 * before["flops_per_token"] * (1 + 1e-12)
    again = tmp_path / "again.json"
    assert cli(*args[:-1], again).code == 0
    assert again.read_bytes() == out.read_bytes()  # same inputs and seed: the same bytes
    pruned = tmp_path / "small.safetensors"
    assert cli("prune", "--plan", out, "-o", pruned).code == 0
    assert pruned.is_file()


@pytest.mark.parametrize(
    ("extra", "code", "message"),
    [
        (["--ratio", "0.5", "--evaluations", "0"], 2, "--evaluations"),
        (["--ratio", "0.5", "--evaluations", "1000000"], 2, "--evaluations"),
        ([], 2, "exactly one of --ratio"),
        (["--ratio", "0.5", "--target-flops", "0.5"], 2, "exactly one of --ratio"),
        (["--ratio", "0.5", "--uniform"], 2, "--uniform"),
        (["--ratio", "0.5", "--samples", "3"], 1, "too few to split"),
        (["--target-flops", "0.01"], 2, "cannot be met"),
        (["--ratio", "0.5", "--layer-method", "loo"], 2, "needs --layers"),
        (["--ratio", "0.5", "--seconds", "0"], 2, "--seconds: Input should be greater than 0"),
        (["--ratio", "0.5", "--seconds", "-3"], 2, "--seconds: Input should be greater than 0"),
        (["--ratio", "0.5", "--seconds", "inf"], 2, "--seconds: Input should be a finite number"),
        (["--ratio", "0.5", "--compensate", "refit"], 2, "--compensate must be one of"),
        (["--ratio", "0.5", "--judge", "accuracy"], 2, "--judge must be one of"),
        (["--ratio", "0.5", "--judge", "metric", "--objective", "fidelity"], 2, "--judge metric needs class labels"),
    ],
    ids=[
        "zero-evaluations",
        "absurd-evaluations",
        "no-amount",
        "two-amounts",
        "uniform",
        "data-too-small",
        "unreachable",
        "layer-method-alone",
        "zero-seconds",
        "negative-seconds",
        "infinite-seconds",
        "unknown-compensation",
        "unknown-judge",
        "metric-without-labels",
    ],
)
def test_bad_search_requests_are_refused_and_write_nothing(cli, tmp_path, extra, code, message):
    out = tmp_path / "plan.json"
    result = cli("search", DEMO / "model.safetensors", "--data", DEMO / "calib.jsonl", *extra, "-o", out)
    assert_refused(result, code, message)
    assert not out.exists()


def test_search_runs_as_a_pipeline_stage(cli, tmp_path):
    config = tmp_path / "search.yaml"
    config.write_text(
        f"model: {DEMO / 'model.safetensors'}\ndata: {DEMO / 'calib.jsonl'}\nout: {tmp_path / 'out'}\n"
        "stages:\n  - command: search\n    ratio: 0.5\n    evaluations: 5\n  - command: prune\n"
    )
    result = cli("run", config)
    assert result.code == 0, result.err
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert plan["strategy"] == "search" and (tmp_path / "out" / "pruned.safetensors").is_file()


def test_search_with_ffn_neurons_measures_its_plan_and_keeps_the_widths_aligned(cli, tmp_path):
    import headprune_cli
    from headprune_cli.data.readers import read_data
    from headprune_cli.stages.search.masked_loss import MaskedLoss

    out = tmp_path / "plan.json"
    result = cli(
        "search",
        DEMO / "model.safetensors",
        "--data",
        DEMO / "calib.jsonl",
        "--target-flops",
        "0.4",
        "--ffn",
        "--evaluations",
        "15",
        "--compensate",
        "none",
        "--judge",
        "loss",
        "-o",
        out,
    )
    assert result.code == 0, result.err
    plan = json.loads(out.read_text())
    assert plan["config"]["method"] == "fisher"  # the default with --ffn: BENCHMARKS.md "Which method"
    assert plan["remove_ffn"] and plan["num_ffn"] == [128] * 4
    for neurons in plan["remove_ffn"].values():
        assert (128 - len(neurons)) % 8 == 0 and 128 - len(neurons) >= 8
    model = headprune_cli.load(DEMO / "model.safetensors")
    data = read_data(DEMO / "calib.jsonl", model, max_length=64)
    half = len(data) - round(len(data) * 0.5)
    loss = MaskedLoss(model, data.select(half, len(data)), "classification", 32)
    measured = loss(
        {int(k): v for k, v in plan["remove_heads"].items()},
        plan["remove_layers"],
        {int(k): v for k, v in plan["remove_ffn"].items()},
    )
    assert (
        measured == pytest.approx(plan["search"]["best_loss"], rel=1e-9)
        and plan["search"]["best_loss"] <= plan["search"]["start_loss"]
    )
    assert cli("prune", "--plan", out, "-o", tmp_path / "small.safetensors").code == 0
