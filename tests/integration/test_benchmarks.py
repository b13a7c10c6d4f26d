"""scripts/benchmarks/suite.py --quick and scripts/benchmarks/peer.py --quick run in the
suite so it cannot rot: the headprune side
(taylor scores, selection, compensation, removal, reload) and the onnxruntime path, on a
tiny random BERT. The peer (Torch-Pruning) is never needed here: it lives only in the
benchmark environment."""

from __future__ import annotations

import json

from scripts.benchmarks import peer, suite
from tests.support import ROOT


def test_bench_peer_quick(tmp_path, capsys):
    out = tmp_path / "peer.json"
    assert peer.main(["--quick", "--threads", "1", "--repeats", "2", "--warmup", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    rows = {r["model"]: r for r in result["rows"]}
    assert list(rows) == ["unpruned", "headprune taylor", "headprune taylor + lstsq"]  # no peer in quick mode
    assert result["setting"]["peer"] is False
    for name in ("headprune taylor", "headprune taylor + lstsq"):
        row = rows[name]
        assert row["heads_removed"] == row["heads_total"] // 2  # --ratio 0.5 of all heads
        assert 0.5 < row["fidelity"] < 1.0 + 1e-6
        assert row["reloads"].startswith("yes, bit-identical")
        assert row["latency_ms"] > 0
    assert rows["unpruned"]["fidelity"] > 0.99999
    # Compensation can only move the pruned model towards the unpruned one on average.
    assert rows["headprune taylor + lstsq"]["fidelity"] >= rows["headprune taylor"]["fidelity"] - 1e-3
    assert set(result["onnxruntime"]) == {"unpruned", "headprune taylor + lstsq"}
    assert all(v["median_ms"] > 0 for v in result["onnxruntime"].values())
    table = capsys.readouterr().out
    assert "| headprune taylor + lstsq | 6/12 |" in table and "| onnxruntime |" in table


def test_peer_row_with_another_head_count_is_refused():
    peer.check_same_removal(36, 36)
    try:
        peer.check_same_removal(0, 36)
    except ValueError as exc:
        assert "0 heads" in str(exc) and "36" in str(exc)
    else:
        raise AssertionError("a peer that removed 0 of 36 heads must be refused")


def test_bench_quick_fills_every_table(tmp_path):
    """scripts/benchmarks/suite.py --quick runs every section's code path on tiny models and writes
    the same document BENCHMARKS.md gets; re-rendering its JSON gives the same text."""
    out, raw = tmp_path / "bench.md", tmp_path / "bench.json"
    assert (
        suite.main(["--quick", "--threads", "1", "--out", str(out), "--json", str(raw)]) == 0
    )  # 1: xdist workers share the cores
    text = out.read_text()
    for heading in (
        "### Scoring cost",
        "### Speed",
        "### Fidelity per importance method",
        "### Recovery",
        "### Pipeline wall time",
        "### Against Torch-Pruning",
        "### onnxruntime latency",
        "Which method to pick",
        "### Serving a causal LM",
    ):
        assert heading in text, heading
    result = json.loads(raw.read_text())
    assert result["mode"] == "quick" and result["machine"]["threads"] == 1
    assert result["score"]["ratio"] > 0 and result["score"]["score_s"] > 0
    speed = result["speed"]
    assert [r["removed"] for r in speed] == ["25%", "50%", "75%"] * 3  # three shapes, three cuts
    assert all(r["predicted"] > 1 and r["measured"] > 0 for r in speed)
    quality = result["quality"]["rows"]
    assert set(quality) == {"random", "taylor-weight", "gradient", "taylor", "fisher", "loo"}
    assert text.index("| random (mean of 2 seeds)") < text.index("| taylor-weight |") < text.index("| loo |")
    assert all(0 < v <= 1 + 1e-6 for by in quality.values() for pair in by.values() for v in pair)
    recovery = [r["model"].split(",")[0] for r in result["recovery"]["rows"]]
    assert recovery[:2] == ["baseline", "pruned 40% (taylor)"] and len(recovery) == 4
    assert result["pipeline"][0]["seconds"] > 0
    assert set(result["peer"]["onnxruntime"]) == {"unpruned", "headprune taylor + lstsq"}
    assert "No peer row in this run" in text
    again = tmp_path / "again.md"
    assert suite.main(["--render", str(raw), "--out", str(again)]) == 0
    assert again.read_text() == text
    _check_a_rerun_keeps_the_other_scripts_sections(tmp_path, raw)


def _check_a_rerun_keeps_the_other_scripts_sections(tmp_path, raw):
    """Only the suite's blocks are the suite's: a run replaces each between its markers, where it
    stands (once), and carries every other line of the file as it was."""
    out = tmp_path / "BENCHMARKS.md"
    out.write_text(
        "# headprune benchmarks\n\nintro kept\n\n<!-- suite: run -->\nold run facts\n<!-- /suite: run -->\n\n"
        "## Which method\n\nkept 1\n\n<!-- suite: quality -->\nold quality\n<!-- /suite: quality -->\n\nkept 2\n\n"
        "## How fast\n\n<!-- suite: decode -->\nold decode\n<!-- /suite: decode -->\n\nkept 3\n"
    )
    assert suite.main(["--render", str(raw), "--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("# headprune benchmarks\n\nintro kept\n\n<!-- suite: run -->\n- command: ")
    assert "old run facts" not in text and "old quality" not in text and "old decode" not in text
    assert text.index("kept 1") < text.index("### Fidelity per importance method") < text.index("kept 2")
    assert text.index("## How fast") < text.index("### Serving a causal LM") < text.index("kept 3")
    assert text.count("<!-- suite: quality -->") == 1 and text.count("<!-- /suite: decode -->") == 1
    assert "| batch |" in text[text.index("### Serving a causal LM") : text.index("kept 3")]  # the new decode table
    # blocks the file did not place (score, speed, ...) are appended after everything it had
    assert text.index("kept 3") < text.index("<!-- suite: score -->")


def test_benchmarks_md_names_no_scratch_paths():
    text = (ROOT / "BENCHMARKS.md").read_text()
    assert "/tmp/" not in text
    for name in ("run", "score", "speed", "quality", "recovery", "pipeline", "peer", "onnx", "decode"):
        assert text.count(f"<!-- suite: {name} -->") == 1 and text.count(f"<!-- /suite: {name} -->") == 1, name


def test_bench_quick_refuses_to_overwrite_benchmarks_md(capsys):
    try:
        suite.main(["--quick", "--out", str(ROOT / "BENCHMARKS.md")])
    except SystemExit as exc:
        assert exc.code == 2
    else:
        raise AssertionError("--quick must not write BENCHMARKS.md")
    assert "--out" in capsys.readouterr().err
