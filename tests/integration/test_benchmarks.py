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
        "## 1. Scoring cost",
        "## 2. Speed",
        "## 3. Quality",
        "## 4. Recovery",
        "## 5. Pipeline wall time",
        "## 6. Peer comparison",
        "## 7. onnxruntime latency",
        "Which method to pick",
        "## 11. Serving a causal LM",
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
    """Sections 8-10 and 12-16 come from their own scripts: a suite run carries them as they are and
    rewrites section 11 where it stands (once), and only its own sections above the marker."""
    decode = "## 11. Serving a causal LM: KV cache, prefill and decode"
    out = tmp_path / "BENCHMARKS.md"
    out.write_text(
        f"# old header\n\n## 1. Scoring cost\n\nold scores\n\n{suite.OTHER_SECTIONS}\n## 8. Large\n\nkept 8\n\n"
        f"## 10. Depth\n\nkept 10\n\n{decode}\n\nold decode\n\n## 12. Learned\n\nkept 12\n"
    )
    assert suite.main(["--render", str(raw), "--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("# headprune benchmarks") and "old header" not in text and "old scores" not in text
    assert text.count(decode) == 1 and "old decode" not in text
    assert text.index("## 7. onnxruntime latency") < text.index(suite.OTHER_SECTIONS)
    assert text.index("kept 8") < text.index("kept 10") < text.index(decode) < text.index("kept 12")
    assert "| batch |" in text[text.index(decode) : text.index("kept 12")]  # the new run's decode table


def test_benchmarks_md_names_no_scratch_paths():
    text = (ROOT / "BENCHMARKS.md").read_text()
    assert "/tmp/" not in text
    assert text.count(suite.OTHER_SECTIONS) == 1


def test_bench_quick_refuses_to_overwrite_benchmarks_md(capsys):
    try:
        suite.main(["--quick", "--out", str(ROOT / "BENCHMARKS.md")])
    except SystemExit as exc:
        assert exc.code == 2
    else:
        raise AssertionError("--quick must not write BENCHMARKS.md")
    assert "--out" in capsys.readouterr().err
