"""`report --onnx FILE`: the shipped ONNX file, not the PyTorch checkpoint, is what the
metrics, the latency and the gates describe; a file from another model is refused."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest

from headprune_cli import load
from headprune_cli.data.readers import batches, read_data
from headprune_cli.files.io import sha256_file
from tests.support import FAST_REPORT, run_report


@pytest.fixture(scope="module")
def shipped(models, tmp_path_factory):
    """The pruned model of the report workspace as int8 ONNX (written by the real command)."""
    from headprune_cli.cli import main

    folder, _ = models
    path = tmp_path_factory.mktemp("shipped") / "pruned-int8.onnx"
    args = ["export", folder / "pruned.safetensors", "--onnx", path, "--quantize", "int8-dynamic"]
    assert main([str(a) for a in args]) == 0
    return path


def _accuracy_in_onnxruntime(path, folder) -> float:
    """dev.jsonl through onnxruntime by hand, in report's batches of 8 (dynamic int8 ranges are per batch)."""
    dataset = read_data(folder / "dev.jsonl", load(folder / "pruned.safetensors"), max_length=16)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    predicted = []
    for batch in batches(dataset, 8):
        feeds = {"input_ids": batch["input_ids"].numpy(), "attention_mask": batch["attention_mask"].numpy()}
        predicted.append(session.run(None, feeds)[0].argmax(-1))
    return float((np.concatenate(predicted) == dataset.labels.numpy()).mean())


def _metric(metrics: list[dict], name: str = "accuracy") -> float:
    return next(m["value"] for m in metrics if m["name"] == name)


def test_report_on_onnx_gives_the_accuracy_onnxruntime_gives(models, shipped, cli, tmp_path):
    folder, pruned_accuracy = models
    res = run_report(cli, folder, "--onnx", shipped, "--json", tmp_path / "r.json", "--max-drop", "0")
    report = json.loads((tmp_path / "r.json").read_text())
    by_hand = _accuracy_in_onnxruntime(shipped, folder)
    assert _metric(report["metrics"]["pruned"]) == pytest.approx(by_hand, abs=1e-12)
    assert _metric(report["shipped"]["checkpoint_metrics"]) == pytest.approx(pruned_accuracy, abs=1e-12)
    assert report["shipped"]["quantization"] == "int8-dynamic" and report["shipped"]["source_checked"]
    shipped_input = next(i for i in report["inputs"] if i["role"] == "shipped")
    assert shipped_input["sha256"] == report["shipped"]["sha256"] == sha256_file(shipped)
    # The gate reads the shipped file's accuracy: it lost some, so --max-drop 0 fails (exit 3).
    assert by_hand < 1.0 and res.code == 3 and "FAIL: gate max-drop" in res.err
    assert report["gates"][0]["value"] == pytest.approx((1.0 - by_hand) * 100)
    assert set(report["measured"]["latency_ms"]) == {"baseline", "pruned"}


def test_report_without_onnx_keeps_its_shape(models, cli, tmp_path):
    folder, _ = models
    assert run_report(cli, folder, "--json", tmp_path / "r.json").code == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert "shipped" not in report and "onnx" not in report["config"]


def test_a_file_exported_from_another_checkpoint_is_refused(models, shipped, cli, tmp_path):
    folder, _ = models
    res = cli(
        "report",
        "--model",
        folder / "base.safetensors",
        "--data",
        folder / "dev.jsonl",
        *FAST_REPORT,
        "--baseline",
        folder / "base.safetensors",
        "--onnx",
        shipped,
        "--json",
        tmp_path / "r.json",
    )
    assert res.code == 1 and res.err.startswith("Error: --onnx") and "not from --model" in res.err
    assert not (tmp_path / "r.json").exists()
