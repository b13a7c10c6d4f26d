"""scripts/bench_peer.py --quick runs in the suite so it cannot rot: the headprune side
(taylor scores, selection, compensation, removal, reload) and the onnxruntime path, on a
tiny random BERT. The peer (Torch-Pruning) is never needed here: it lives only in the
benchmark environment."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "bench_peer.py"


def load_script():
    spec = importlib.util.spec_from_file_location("bench_peer", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_peer_quick(tmp_path, capsys):
    bench = load_script()
    out = tmp_path / "peer.json"
    assert bench.main(["--quick", "--repeats", "2", "--warmup", "1", "--json", str(out)]) == 0
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
