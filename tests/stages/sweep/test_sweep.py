"""`headprune sweep`: the quality curve per method, the knee, outputs and bad input."""

from __future__ import annotations

import json

import pytest

from headprune_cli import load, save
from headprune_cli.artifacts.schema import read_artifact
from headprune_cli.data.readers import read_data
from headprune_cli.errors import ArtifactError
from headprune_cli.model.surgery import apply_plan
from headprune_cli.stages.budget import Budget
from headprune_cli.stages.objectives import evaluate
from tests.support import ROOT, TINY, give_tokenizer, write_jsonl, write_text

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sweep")
    save(give_tokenizer(TINY["reference"]()), folder / "m.safetensors")
    write_jsonl(folder / "calib.jsonl", 16, seed=1)
    write_jsonl(folder / "dev.jsonl", 24, seed=2)
    return folder


def _sweep(cli, folder, *extra):
    return cli(
        "sweep",
        folder / "m.safetensors",
        "--data",
        folder / "calib.jsonl",
        "--eval-data",
        folder / "dev.jsonl",
        "--max-length",
        "16",
        "--batch-size",
        "8",
        *extra,
    )


def test_sweep_writes_curve_table_and_knee(setup, cli, tmp_path):
    result = _sweep(
        cli, setup, "--methods", "taylor,random", "--ratios", "0.3,0.6", "--max-drop", "5", "-o", tmp_path / "out"
    )
    assert result.code == 0, result.err
    assert result.out == ""
    sweep, _ = read_artifact(tmp_path / "out" / "sweep.json", ("sweep",))
    data = json.loads((tmp_path / "out" / "sweep.json").read_text())
    assert [(r["method"], r["ratio"]) for r in data["rows"]] == [
        ("taylor", 0.3),
        ("taylor", 0.6),
        ("random", 0.3),
        ("random", 0.6),
    ]
    total = data["total_heads"]
    assert total == 11
    for row in data["rows"]:
        assert (
            row["heads_removed"] == round(row["ratio"] * total) or abs(row["heads_removed"] - row["ratio"] * total) <= 1
        )
        assert row["within_budget"] == (row["drop"] <= 5)
        assert row["predicted_speedup"] > 1
    # The knee: the largest ratio within budget, per method.
    for method in ("taylor", "random"):
        ok = [r["ratio"] for r in data["rows"] if r["method"] == method and r["within_budget"]]
        assert (data["best"][method] or {}).get("ratio") == (max(ok) if ok else None)
    md = (tmp_path / "out" / "sweep.md").read_text()
    assert "| taylor | 0.3 |" in md and "Largest ratio within the budget" in md
    png = tmp_path / "out" / "curve.png"
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    from matplotlib.image import imread

    assert imread(png).ndim == 3


def test_a_sweep_point_equals_pruning_and_evaluating_by_hand(setup, cli):
    """Row metrics are what the same selection, cut and evaluated directly, gives."""
    from headprune_cli.stages.score.importance.api import score_model
    from headprune_cli.stages.score.table import ScoreTable
    from headprune_cli.stages.select.strategies import select

    result = _sweep(cli, setup, "--methods", "taylor", "--ratios", "0.5")
    assert result.code == 0, result.err
    row = json.loads(result.out)["rows"][0]
    model = load(setup / "m.safetensors")
    calib = read_data(setup / "calib.jsonl", model, max_length=16)
    dev = read_data(setup / "dev.jsonl", model, max_length=16)
    heads = score_model(model, calib, "taylor", batch_size=8).heads
    selection = select(
        ScoreTable(heads=heads, num_heads=[4, 3, 4], num_kv_heads=[4, 3, 4]), "global", budget=Budget("heads", 0.5)
    )
    apply_plan(model, selection.remove_heads, [])
    accuracy = {m.name: m.value for m in evaluate(model, dev, "classification", batch_size=8)}["accuracy"]
    assert row["main"] == pytest.approx(accuracy)
    assert row["heads_removed"] == sum(len(v) for v in selection.remove_heads.values())


def test_sweep_compensation_changes_the_result_to_what_compensating_by_hand_gives(cli, tmp_path):
    """On a causal LM (perplexity is continuous, unlike accuracy): `--compensate lstsq`
    gives another row than no compensation, and exactly the row of scoring, selecting,
    compensating on the calibration data and cutting by hand."""
    from headprune_cli.data.readers import batches
    from headprune_cli.stages.objectives import default_objective
    from headprune_cli.stages.prune.compensation import compensate
    from headprune_cli.stages.score.importance.api import score_model
    from headprune_cli.stages.score.table import ScoreTable
    from headprune_cli.stages.select.strategies import select

    save(give_tokenizer(TINY["gpt2"](), encoder=False), tmp_path / "m.safetensors")
    write_text(tmp_path / "calib.txt", 16, seed=1)
    write_text(tmp_path / "dev.txt", 16, seed=2)
    common = [
        "sweep",
        tmp_path / "m.safetensors",
        "--data",
        tmp_path / "calib.txt",
        "--eval-data",
        tmp_path / "dev.txt",
        "--max-length",
        "16",
        "--batch-size",
        "8",
        "--methods",
        "taylor",
        "--ratios",
        "0.4",
    ]
    rows = {}
    for how in ("none", "lstsq"):
        result = cli(*common, "--compensate", how)
        assert result.code == 0, result.err
        rows[how] = json.loads(result.out)["rows"][0]
    assert rows["lstsq"]["heads_removed"] == rows["none"]["heads_removed"] > 0
    assert rows["lstsq"]["main"] != pytest.approx(rows["none"]["main"], rel=1e-4)

    model = load(tmp_path / "m.safetensors")
    calib = read_data(tmp_path / "calib.txt", model, max_length=16)
    dev = read_data(tmp_path / "dev.txt", model, max_length=16)
    objective = default_objective(model)
    heads = score_model(model, calib, "taylor", objective, batch_size=8).heads
    selection = select(
        ScoreTable(heads=heads, num_heads=[4, 4, 4], num_kv_heads=[4, 4, 4]), "global", budget=Budget("heads", 0.4)
    )
    compensate(model, selection.remove_heads, selection.remove_layers, list(batches(calib, 8)), method="lstsq")
    apply_plan(model, selection.remove_heads, selection.remove_layers)
    perplexity = {m.name: m.value for m in evaluate(model, dev, objective, batch_size=8)}["perplexity"]
    assert rows["lstsq"]["main"] == pytest.approx(perplexity, rel=1e-6)


@pytest.mark.parametrize(
    "args, code, message",
    [
        (("--methods", "tayler"), 2, "did you mean"),
        (("--ratios", "0.5,1.5"), 2, "between 0 and 1"),
        (("--ratios", "a,b"), 2, "comma-separated"),
        (("--compensate", "magic"), 2, "unknown compensation"),
    ],
)
def test_bad_options(setup, cli, args, code, message):
    result = _sweep(cli, setup, *args)
    assert result.code == code and message in result.err and result.out == ""


def test_eval_data_of_another_task_is_an_error(setup, cli, tmp_path):
    (tmp_path / "plain.txt").write_text("w1 w2 w3\nw4 w5\n")
    result = cli(
        "sweep",
        setup / "m.safetensors",
        "--data",
        setup / "calib.jsonl",
        "--eval-data",
        tmp_path / "plain.txt",
        "--max-length",
        "16",
        "--methods",
        "random",
        "--ratios",
        "0.5",
    )
    assert result.code == 1 and "label" in result.err


def _flops_sweep(cli, out, *extra):
    demo = ROOT / "examples" / "demo"
    return cli(
        "sweep",
        demo / "model.safetensors",
        "--data",
        demo / "calib.jsonl",
        "--eval-data",
        demo / "dev.jsonl",
        "--methods",
        "fisher",
        "--target-flops",
        "0.7,0.4",
        "--repeats",
        "0",
        "--samples",
        "32",
        "-o",
        out,
        *extra,
    )


def test_a_budget_sweep_gives_one_curve_per_route(tmp_path, cli, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "0")
    out = tmp_path / "sweep"
    result = _flops_sweep(cli, out)
    assert result.code == 0, result.err
    data = json.loads((out / "sweep.json").read_text())
    rows = data["rows"]
    assert {r["route"] for r in rows} == {"heads", "heads+ffn", "heads+ffn+layers"}
    assert not any(r["route"] == "heads" and r["target_flops"] == 0.4 for r in rows)  # beyond what heads alone remove
    for r in rows:
        assert r["flops_kept"] <= r["target_flops"] * (1 + 1e-9) and r["measured_speedup"] is None
    assert "targets" in data["config"] and "ratios" not in data["config"]
    assert (out / "curve.png").read_bytes()[:4] == b"\x89PNG" and "| heads+ffn |" in (out / "sweep.md").read_text()


def test_a_budget_sweep_writes_its_rows_and_knees_where_a_ratio_sweep_does(tmp_path, cli):
    """`rows` and `best` hold a FLOPs sweep's points and per-route knees too (they were written
    empty, the points tucked under `budget`), so `jq .best` answers for either kind; the knee is
    the row within the budget that keeps the fewest FLOPs, and what the command prints."""
    result = _flops_sweep(cli, tmp_path / "sweep", "--routes", "heads,heads+ffn", "--max-drop", "100")
    assert result.code == 0, result.err
    data, _ = read_artifact(tmp_path / "sweep" / "sweep.json", ("sweep",))
    raw = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    assert [(r["route"], r["target_flops"]) for r in raw["rows"]] == [
        ("heads", 0.7),
        ("heads+ffn", 0.7),
        ("heads+ffn", 0.4),
    ]
    assert raw["budget"] == {"routes": ["heads", "heads+ffn"]} and data.budget is not None
    for route in ("heads", "heads+ffn"):
        ok = [r for r in raw["rows"] if r["route"] == route and r["within_budget"]]
        knee = min(ok, key=lambda r: r["flops_kept"])
        assert (
            raw["best"][route] == {k: knee[k] for k in raw["best"][route]} and raw["best"][route]["method"] == "fisher"
        )
        assert f"{route}: fewest FLOPs kept within budget {knee['flops_kept']:.1%}" in result.err


def test_a_budget_sweep_of_the_old_layout_still_reads(tmp_path, cli):
    """Budget sweeps written before kept their points under `budget` with empty `rows` and `best`."""
    result = _flops_sweep(cli, tmp_path / "sweep", "--routes", "heads", "--target-flops", "0.7")
    assert result.code == 0, result.err
    raw = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    raw["budget"] = {"routes": ["heads"], "rows": raw["rows"], "best": raw["best"]}
    raw["rows"], raw["best"] = [], {}
    (tmp_path / "old.json").write_text(json.dumps(raw))
    old, _ = read_artifact(tmp_path / "old.json", ("sweep",))
    assert old.rows == [] and old.budget.rows[0].route == "heads"
    mixed = {**raw, "rows": [{**raw["budget"]["rows"][0], "ratio": 0.5}]}  # a row of neither kind
    (tmp_path / "mixed.json").write_text(json.dumps(mixed))
    with pytest.raises(ArtifactError, match="invalid sweep: rows"):
        read_artifact(tmp_path / "mixed.json", ("sweep",))
