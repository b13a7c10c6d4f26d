"""`select --strategy random --seed S`: the random-heads control of the lottery-ticket runs."""

from __future__ import annotations

import json

from headprune_cli.stages.budget import Budget
from headprune_cli.stages.constraints import Constraints
from headprune_cli.stages.score.table import ScoreTable
from headprune_cli.stages.select.strategies import select
from tests.support import saved_model, write_scores


def _table() -> ScoreTable:
    heads = {layer: {h: float(10 * layer + h) for h in range(6)} for layer in range(4)}  # ordered scores
    return ScoreTable(heads=heads, num_heads=[6] * 4, num_kv_heads=[6] * 4)


def _removed(selection) -> set[tuple[int, int]]:
    return {(layer, h) for layer, heads in selection.remove_heads.items() for h in heads}


def test_random_plans_have_the_size_of_the_scored_plan_and_ignore_the_scores():
    table, ratio = _table(), Budget("heads", 0.5)
    scored = select(table, "global", budget=ratio)
    draws = [select(table, "random", budget=ratio, seed=seed) for seed in range(4)]
    assert all(len(_removed(d)) == len(_removed(scored)) == 12 for d in draws)
    assert len({frozenset(_removed(d)) for d in draws}) == 4  # every seed draws another plan
    assert any(_removed(d) != _removed(scored) for d in draws)
    assert _removed(select(table, "random", budget=ratio, seed=2)) == _removed(draws[2])  # the same seed, the same plan
    assert all(d.strategy == "random" for d in draws)


def test_random_plans_keep_the_constraints():
    table = _table()
    constraints = Constraints(min_heads=2, multiple_of=2, protect=((0, 0), (3, 5)))
    for seed in range(8):
        removed = _removed(select(table, "random", budget=Budget("heads", 0.75), constraints=constraints, seed=seed))
        assert (0, 0) not in removed and (3, 5) not in removed
        for layer in range(4):
            kept = 6 - sum(1 for l, _ in removed if l == layer)
            assert kept >= 2 and kept % 2 == 0


def test_select_command_records_the_seed_and_repeats_byte_for_byte(tmp_path, cli):
    model, path = saved_model(tmp_path)
    scores = write_scores(tmp_path, model, path)
    outs = [tmp_path / f"p{i}.json" for i in range(3)]
    for out, seed in zip(outs, (5, 5, 6)):
        res = cli("select", scores, "--ratio", "0.5", "--strategy", "random", "--seed", str(seed), "-o", out)
        assert res.code == 0, res.err
    first = json.loads(outs[0].read_text())
    assert first["strategy"] == "random" and first["config"]["seed"] == 5
    strip = lambda p: {k: v for k, v in json.loads(p.read_text()).items() if k != "created"}  # noqa: E731
    assert strip(outs[0]) == strip(outs[1])
    assert sum(len(v) for v in first["remove_heads"].values()) == 6
    scored = cli("select", scores, "--ratio", "0.5", "--seed", "5", "-o", tmp_path / "global.json")
    assert scored.code == 0 and "seed" not in json.loads((tmp_path / "global.json").read_text())["config"]
