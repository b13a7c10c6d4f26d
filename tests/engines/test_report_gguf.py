"""`report --gguf FILE`: llama.cpp's perplexity of the shipped GGUF file is what the report gates.

The tiny LLaMA with the BPE tokenizer (tests/support/gguf_models.py), cut non-uniformly, is
exported as f32 and q8_0 GGUF; `report --gguf` evaluates each in llama.cpp's own environment
(a child process where headprune cannot be imported) on the token rows headprune's reader makes.
f32 must give the checkpoint's own perplexity (headprune's `report` of the checkpoint) to float
tolerance; q8_0 only what quantization costs (Q8_BOUND).

Run: `python -m pytest -m engines tests/engines` (deselected from the default suite).
"""

from __future__ import annotations

import json
import os

import pytest
import torch

import headprune_cli
from tests.support.engines import llama_cpp_python
from tests.support.gguf_models import NON_UNIFORM_GRID, TEXT, tiny_llama, write_checkpoint
from tests.support.refusals import assert_refused

pytestmark = pytest.mark.engines

FAST = ("--repeats", "1", "--warmup", "0", "--decode-tokens", "0", "--seq-len", "32", "--batch-size", "4")
# |q8_0 - checkpoint| / checkpoint perplexity. Measured 2026-12-02 (llama-cpp-python 0.3.36) on
# this random-weight model: see the test's printout; the bound leaves room for other CPUs' kernels.
Q8_BOUND = 0.02
# q4_K_M: measured 0.0101 the same day (llama.cpp falls back per tensor on this 64-wide model, as it does
# on real models for rows off its 256-blocks); the bound leaves the same room as Q8_BOUND does.
K_QUANT_BOUND = 0.05


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    folder = tmp_path_factory.mktemp("report-gguf")
    write_checkpoint(folder / "base.safetensors", model=tiny_llama())
    write_checkpoint(folder / "pruned.safetensors", NON_UNIFORM_GRID)
    lines = [line for line in TEXT.read_text(encoding="utf-8").splitlines() if line.strip()][:12]
    (folder / "eval.txt").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return folder


def _report(cli, folder, name: str, *extra) -> dict:
    out = folder / f"{name}.json"
    result = cli(
        "report",
        "--model",
        folder / "pruned.safetensors",
        "--baseline",
        folder / "base.safetensors",
        "--data",
        folder / "eval.txt",
        *FAST,
        "--json",
        out,
        "--force",
        *extra,
    )
    assert result.code == 0, result
    return json.loads(out.read_text())


def _perplexity(metrics: list[dict]) -> float:
    return next(m["value"] for m in metrics if m["name"] == "perplexity")


def test_report_gguf_gives_llama_cpp_perplexity(cli, workspace, monkeypatch):
    monkeypatch.setenv("HEADPRUNE_LLAMA_CPP_ENV", os.path.dirname(os.path.dirname(llama_cpp_python())))
    own = _perplexity(_report(cli, workspace, "own")["metrics"]["pruned"])
    found = {}
    for kind in ("f32", "q8_0", "q4_K_M"):  # q4_K_M: llama.cpp's own quantizer and file type
        gguf = workspace / f"pruned-{kind}.gguf"
        assert cli("export", workspace / "pruned.safetensors", "--gguf", gguf, "--gguf-type", kind).code == 0
        report = _report(cli, workspace, kind, "--gguf", gguf)
        shipped = report["shipped"]
        assert shipped["engine"] == "llama.cpp" and shipped["quantization"] == kind and shipped["kv_cache"] == "f32"
        assert shipped["architecture"] == "deci" and shipped["probe_correlation"] > 0.9
        assert _perplexity(shipped["checkpoint_metrics"]) == pytest.approx(own, rel=1e-12)
        assert set(report["measured"]["latency_ms"]) == {"baseline", "pruned"}
        assert report["config"]["gguf"] == str(gguf) and "engine_python" not in report["config"]
        found[kind] = _perplexity(report["metrics"]["pruned"])
        medians = {side: lat["median_ms"] for side, lat in report["measured"]["latency_ms"].items()}
        print(f"{kind}: forward ms (PyTorch baseline, llama.cpp file) {medians}")
    gaps = {kind: abs(ppl - own) / own for kind, ppl in found.items()}
    print(f"checkpoint perplexity {own:.6f}; llama.cpp {found}; relative gaps {gaps}")
    assert gaps["f32"] < 1e-4, gaps
    assert gaps["q8_0"] < Q8_BOUND, gaps
    assert gaps["q4_K_M"] < K_QUANT_BOUND, gaps


def test_a_gguf_of_another_model_is_refused(cli, workspace, tmp_path, monkeypatch):
    """Another shape (the uncut base: llama, 4 blocks) and the same shape with other weights."""
    monkeypatch.setenv("HEADPRUNE_LLAMA_CPP_ENV", os.path.dirname(os.path.dirname(llama_cpp_python())))
    other = headprune_cli.load(workspace / "pruned.safetensors")
    with torch.no_grad():
        for p in other.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.08)
    headprune_cli.save(other, tmp_path / "other.safetensors")
    for source, message in (("base.safetensors", "4 blocks"), (tmp_path / "other.safetensors", "probe row")):
        gguf = tmp_path / "shipped.gguf"
        assert cli("export", workspace / source, "--gguf", gguf, "--force").code == 0
        res = cli(
            "report",
            "--model",
            workspace / "pruned.safetensors",
            "--baseline",
            workspace / "base.safetensors",
            "--data",
            workspace / "eval.txt",
            *FAST,
            "--gguf",
            gguf,
            "--json",
            tmp_path / "r.json",
        )
        assert_refused(res, 1, message)
        assert "not an export of --model" in res.err and not (tmp_path / "r.json").exists()
