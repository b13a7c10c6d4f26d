"""`headprune report`: exit codes, artifacts (JSON, Markdown, JUnit, PNG), bad input."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest
import torch

from headprune_cli import load, save
from headprune_cli.artifacts.schema import read_artifact
from headprune_cli.model.layout import info_of
from headprune_cli.model.surgery import apply_plan
from tests.support import FAST_REPORT, ROOT, TINY, give_tokenizer, run_report, snapshot, write_text

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_passing_gates_exit_0_and_write_every_output(models, cli, tmp_path):
    folder, accuracy = models
    out = {k: tmp_path / name for k, name in [("json", "r.json"), ("md", "r.md"), ("junit", "j.xml")]}
    result = run_report(
        cli,
        folder,
        "--max-drop",
        "100",
        "--max-rel-drop",
        "1",
        "--json",
        out["json"],
        "--markdown",
        out["md"],
        "--junit",
        out["junit"],
        "--plot",
        tmp_path / "plots",
    )
    assert result.code == 0, result.err
    assert result.out == ""  # data goes to files; the summary to stderr
    assert "PASS" in result.err and "head map" in result.err

    report, _ = read_artifact(out["json"], ("report",))  # validates against the schema
    data = json.loads(out["json"].read_text())
    assert data["verdict"] == "pass" and [g["name"] for g in data["gates"]] == ["max-drop", "max-rel-drop"]
    main = data["main_metric"]
    assert main["name"] == "accuracy" and main["baseline"] == 1.0 and main["pruned"] == pytest.approx(accuracy)
    assert main["drop"] == pytest.approx((1.0 - accuracy) * 100) and main["unit"] == "points"
    assert main["rel_drop"] == pytest.approx(1.0 - accuracy)
    names = {m["name"]: m["higher_is_better"] for m in data["metrics"]["pruned"]}
    assert names == {"accuracy": True, "macro_f1": True}
    assert data["models"]["pruned"]["heads"] == 3 and data["models"]["baseline"]["heads"] == 11
    assert data["lineage"]["descendant"] and data["warnings"] == []
    assert data["cost"]["predicted_speedup"] > 1
    measured = data["measured"]
    assert measured["batch"] == 8 and measured["seq_len"] == 16 and measured["threads"] == 2
    assert measured["latency_ms"]["baseline"]["runs"] == 2
    assert measured["speedup"] == pytest.approx(
        measured["latency_ms"]["baseline"]["median_ms"] / measured["latency_ms"]["pruned"]["median_ms"]
    )
    assert [row["kept"] for row in data["head_map"]] == [[3], [2], [0]]
    assert data["head_map"][1]["removed"] == [0, 1]

    md = out["md"].read_text()
    assert md.startswith("## headprune report: ✅ PASS")
    assert f"{accuracy * 100:.2f}%" in md and "100.00%" in md
    assert "| heads | 11 | 3 | -8 |" in md
    suite = ET.parse(out["junit"]).getroot().find("testsuite")
    assert suite.get("tests") == "2" and suite.get("failures") == "0" and len(suite.findall("testcase")) == 2
    _assert_png(tmp_path / "plots" / "head_map.png")


def test_a_failed_gate_exits_3_after_writing_outputs(models, cli, tmp_path):
    folder, accuracy = models
    result = run_report(
        cli,
        folder,
        "--max-drop",
        "0.5",
        "--max-rel-drop",
        "1",
        "--json",
        tmp_path / "r.json",
        "--markdown",
        tmp_path / "r.md",
        "--junit",
        tmp_path / "j.xml",
    )
    assert result.code == 3, result.err
    assert "FAIL: gate max-drop failed" in result.err and "Error" not in result.err
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["verdict"] == "fail"
    assert [g["passed"] for g in data["gates"]] == [False, True]
    md = (tmp_path / "r.md").read_text()
    assert md.startswith("## headprune report: ❌ FAIL (1/2 gates passed") or "❌ FAIL" in md.splitlines()[0]
    assert "❌ fail" in md and f"{(1 - accuracy) * 100:.4g}" in md
    cases = ET.parse(tmp_path / "j.xml").getroot().find("testsuite").findall("testcase")
    assert [c.find("failure") is not None for c in cases] == [True, False]


def test_min_speedup_gate_and_json_on_stdout(models, cli):
    folder, _ = models
    result = run_report(cli, folder, "--min-speedup", "1000", "--json", "-")
    assert result.code == 3
    data = json.loads(result.out)  # stdout holds the JSON and nothing else
    assert data["gates"][0]["name"] == "min-speedup" and not data["gates"][0]["passed"]
    assert data["gates"][0]["value"] == data["measured"]["speedup"]


def test_without_timing_two_runs_are_byte_identical(models, cli, monkeypatch):
    folder, _ = models
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    runs = [run_report(cli, folder, "--repeats", "0", "--json", "-") for _ in range(2)]
    assert runs[0].code == 0 and runs[0].out == runs[1].out
    assert json.loads(runs[0].out)["measured"] is None and json.loads(runs[0].out)["verdict"] == "no-gates"


@pytest.mark.parametrize(
    "args, message",
    [
        (("--max-drop", "-1"), "--max-drop"),
        (("--min-speedup", "1.1", "--repeats", "0"), "--min-speedup needs latency"),
        (("--seq-len", "1000"), "exceeds the model's maximum"),
        (("--bogus",), "No such option"),
    ],
)
def test_usage_errors_exit_2(models, cli, args, message):
    folder, _ = models
    result = run_report(cli, folder, *args)
    assert result.code == 2 and message in result.err and result.out == ""


def test_missing_model_option_is_usage(cli, models):
    folder, _ = models
    assert cli("report", "--data", folder / "dev.jsonl").code == 2


def test_existing_output_needs_force_and_inputs_are_never_overwritten(models, cli, tmp_path):
    folder, _ = models
    (tmp_path / "r.md").write_text("keep me")
    before = snapshot(folder)
    result = run_report(cli, folder, "--markdown", tmp_path / "r.md")
    assert result.code == 2 and "--force" in result.err
    assert (tmp_path / "r.md").read_text() == "keep me"
    result = run_report(cli, folder, "--json", folder / "dev.jsonl", "--force")
    assert result.code == 2 and "also an input" in result.err
    assert snapshot(folder) == before
    assert run_report(cli, folder, "--markdown", tmp_path / "r.md", "--force").code == 0


def test_baseline_auto_follows_provenance_and_explicit_baseline_matches(models, cli):
    folder, _ = models
    auto = json.loads(run_report(cli, folder, "--repeats", "0", "--json", "-").out)
    explicit = json.loads(
        run_report(cli, folder, "--repeats", "0", "--baseline", folder / "base.safetensors", "--json", "-").out
    )
    assert auto["models"]["baseline"]["sha256"] == explicit["models"]["baseline"]["sha256"]
    assert auto["main_metric"] == explicit["main_metric"]


def test_baseline_auto_needs_a_root(models, cli):
    folder, _ = models
    result = cli("report", "--model", folder / "base.safetensors", "--data", folder / "dev.jsonl", *FAST_REPORT)
    assert result.code == 2 and "no root model" in result.err


def test_a_moved_root_is_a_clear_error(cli, tmp_path):
    save(give_tokenizer(TINY["reference"]()), tmp_path / "base.safetensors")
    pruned = load(tmp_path / "base.safetensors")
    apply_plan(pruned, {0: [0]}, [])
    save(pruned, tmp_path / "pruned.safetensors")
    (tmp_path / "base.safetensors").unlink()
    write_text(tmp_path / "dev.txt", 4)
    result = cli("report", "--model", tmp_path / "pruned.safetensors", "--data", tmp_path / "dev.txt", *FAST_REPORT)
    assert result.code == 1 and "root model" in result.err and "not found" in result.err


def test_errors_exit_1(models, cli, tmp_path):
    folder, _ = models
    other = give_tokenizer(TINY["gpt2"](), encoder=False)
    save(other, tmp_path / "gpt2.safetensors")
    cases = [
        (("--data", tmp_path / "missing.jsonl"), "no such data file"),
        (("--data", folder / "unlabelled.jsonl"), "needs a `label`"),  # eval data of another task
        (("--baseline", tmp_path / "gpt2.safetensors"), "a gpt2 model"),  # another family
        (("--baseline", tmp_path / "nothing.safetensors"), "no such checkpoint"),
        (("--scores", folder / "dev.jsonl"), "not valid JSON"),
    ]
    for args, message in cases:
        result = cli(
            "report", "--model", folder / "pruned.safetensors", "--data", folder / "dev.jsonl", *FAST_REPORT, *args
        )
        assert result.code == 1 and message in result.err, (args, result.err)
        assert "Traceback" not in result.err and result.out == ""


def test_a_baseline_that_is_not_an_ancestor_warns_and_says_so(models, cli, tmp_path):
    folder, _ = models
    stranger = give_tokenizer(TINY["reference"]())
    with torch.no_grad():
        for p in stranger.parameters():
            p.add_(0.01)
    save(stranger, tmp_path / "stranger.safetensors")
    result = run_report(
        cli, folder, "--baseline", tmp_path / "stranger.safetensors", "--json", "-", "--markdown", tmp_path / "r.md"
    )
    assert result.code == 0, result.err
    assert "warning" in result.err and "does not descend" in result.err
    data = json.loads(result.out)
    assert data["lineage"]["descendant"] is False and data["warnings"]
    assert "**Warning:**" in (tmp_path / "r.md").read_text()


def test_scores_give_an_importance_heatmap(models, cli, tmp_path):
    from headprune_cli.artifacts.schema import envelope, write_artifact
    from headprune_cli.model.cost import cost_table

    folder, _ = models
    base = load(folder / "base.safetensors")
    layout = info_of(base).layout
    heads = {layer: {h: float(layer * 10 + h) for h in kept} for layer, kept in zip(layout.layers, layout.heads)}
    scores = {
        **envelope("scores", [], {}),
        "method": "test",
        "objective": "classification",
        "shape": [3, 4],
        "num_heads": layout.num_heads,
        "num_kv_heads": layout.num_kv_heads,
        "kept": dict(zip(layout.layers, layout.heads)),
        "heads": heads,
        "samples": 1,
        "cost": cost_table(base, 16).to_dict(),
    }
    write_artifact(json.loads(json.dumps(scores)), tmp_path / "scores.json")
    result = run_report(
        cli, folder, "--scores", tmp_path / "scores.json", "--repeats", "0", "--json", "-", "--plot", tmp_path / "plots"
    )
    assert result.code == 0, result.err
    rows = json.loads(result.out)["head_map"]
    assert rows[1]["scores"] == {"0": 10.0, "1": 11.0, "2": 12.0}
    _assert_png(tmp_path / "plots" / "head_map.png")


@pytest.mark.parametrize(
    "name, metric, unit", [("gpt2", "perplexity", "perplexity"), ("roberta", "fidelity", "points")]
)
def test_causal_lm_and_embedding_models(name, metric, unit, cli, tmp_path):
    base = give_tokenizer(TINY[name](), encoder=name != "gpt2")
    save(base, tmp_path / "base.safetensors")
    pruned = load(tmp_path / "base.safetensors")
    apply_plan(pruned, {0: [0, 1], 2: [3]}, [1])
    save(pruned, tmp_path / "pruned.safetensors")
    write_text(tmp_path / "dev.txt", 12)
    result = cli(
        "report",
        "--model",
        tmp_path / "pruned.safetensors",
        "--data",
        tmp_path / "dev.txt",
        *FAST_REPORT,
        "--json",
        "-",
        "--max-drop",
        "1e9",
    )
    assert result.code == 0, result.err
    data = json.loads(result.out)
    main = data["main_metric"]
    assert main["name"] == metric and main["unit"] == unit
    if metric == "fidelity":
        assert main["baseline"] == pytest.approx(1.0) and main["pruned"] < 1.0
    else:
        assert not main["higher_is_better"] and main["drop"] == pytest.approx(main["pruned"] - main["baseline"])
    assert data["head_map"][1]["layer_removed"] is True


def _assert_png(path):
    from matplotlib.image import imread

    assert path.read_bytes()[:8] == PNG_SIGNATURE
    image = imread(path)
    assert image.ndim == 3 and image.shape[0] > 50 and image.shape[1] > 50


def test_default_sequence_length_fits_the_model(tmp_path, cli):
    """The bundled example has 64 positions: the default 128 is capped, not an error."""
    demo = ROOT / "examples" / "demo"
    result = cli(
        "report",
        "--model",
        demo / "model.safetensors",
        "--baseline",
        demo / "model.safetensors",
        "--data",
        demo / "dev.jsonl",
        "--repeats",
        "0",
        "--json",
        tmp_path / "r.json",
    )
    assert result.code == 0, result.err
    assert json.loads((tmp_path / "r.json").read_text())["cost"]["seq_len"] == 64
