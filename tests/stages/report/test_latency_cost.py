"""`report --latency`: the table's predicted speedup beside the measured one and FLOPs'."""

from __future__ import annotations

import json

import pytest
import torch

from headprune_cli import load
from headprune_cli.stages.profile.build import device_facts
from tests.support import run_report
from tests.support.latency import write_latency

HERE = device_facts(torch.device("cpu"))


def _table(folder, **kwargs):
    # FAST_REPORT's setting: batch 8, sequence 16, 2 threads (report's default), float32.
    return write_latency(
        folder / "latency.json",
        load(folder / "base.safetensors"),
        folder / "base.safetensors",
        batch=8,
        seq_len=16,
        threads=2,
        **kwargs,
    )


def test_report_states_the_tables_prediction_beside_the_measured_speedup(models, cli, tmp_path):
    folder, _ = models
    table = _table(folder, device=HERE)
    out, md = tmp_path / "r.json", tmp_path / "r.md"
    result = run_report(
        cli, folder, "--baseline", folder / "base.safetensors", "--latency", table, "--json", out, "--markdown", md
    )
    assert result.code == 0, result.err
    report = json.loads(out.read_text())
    section = report["cost"]["latency"]
    # The hand table: a layer costs 1 ms + 1 ms per kept head (+ its FFN, untouched here);
    # the baseline keeps 4, 3, 4 heads, the pruned model 1 per layer.
    layers = json.loads(table.read_text())["phases"]["forward"]["layers"]
    ffn = sum(layer["attention"][-1]["median_ms"] - 1 - layer["attention"][-1]["units"] for layer in layers.values())
    base, new = 1 + 3 + 11 + ffn, 1 + 3 + 3 + ffn
    assert section["comparable"] is True and section["predicted_ms"] == {
        "baseline": pytest.approx(base),
        "pruned": pytest.approx(new),
    }
    assert section["predicted_speedup"] == pytest.approx(base / new)
    assert section["flops_predicted_speedup"] == report["cost"]["predicted_speedup"]
    assert section["measured_speedup"] == report["measured"]["speedup"]
    assert section["latency_error"] == pytest.approx(section["predicted_speedup"] / section["measured_speedup"] - 1)
    assert section["flops_error"] == pytest.approx(
        report["cost"]["predicted_speedup"] / section["measured_speedup"] - 1
    )
    assert "the table was off by" in md.read_text() and "the FLOPs prediction" in md.read_text()
    assert any(ref["role"] == "latency" for ref in report["inputs"])


def test_a_table_from_another_device_is_named_not_compared(models, cli, tmp_path):
    folder, _ = models
    table = _table(folder, device={"type": "cuda", "name": "Some GPU", "index": 0})
    out, md = tmp_path / "r.json", tmp_path / "r.md"
    result = run_report(
        cli, folder, "--baseline", folder / "base.safetensors", "--latency", table, "--json", out, "--markdown", md
    )
    assert result.code == 0, result.err
    section = json.loads(out.read_text())["cost"]["latency"]
    assert section["comparable"] is False and "device Some GPU (table)" in section["reason"]
    assert section.get("predicted_speedup") is None
    lines = [line for line in md.read_text().splitlines() if "Latency table" in line]
    assert len(lines) == 1 and "not compared" in lines[0]
