"""The one llama.cpp check in the default suite: an f32 GGUF of a tiny LLaMA, llama.cpp's logits
against headprune's. It runs whenever the engine env exists on this machine (the build script's
cache, scripts/engines/_cache.sh), skips with the reason when it does not, and fails then under
HEADPRUNE_REQUIRE_ENGINES=1. The whole matrix (types, layouts, families) is tests/engines/test_llama_cpp.py."""

from __future__ import annotations

import numpy as np

from tests.engines.test_llama_cpp import BOUNDS, export, headprune_logits, llama_cpp_run
from tests.support.engines import llama_cpp_python
from tests.support.gguf_models import UNIFORM, write_checkpoint


def test_llama_cpp_computes_headprunes_logits_for_a_tiny_f32_llama(cli, tmp_path):
    engine = llama_cpp_python()
    checkpoint = write_checkpoint(tmp_path / "tiny.safetensors", UNIFORM)
    ids, ours = headprune_logits(checkpoint)
    theirs = llama_cpp_run(engine, export(cli, checkpoint, "f32"))
    assert theirs["arch"] == "llama"
    assert [run["ids"] for run in theirs["runs"]] == ids
    for run, mine in zip(theirs["runs"], ours, strict=True):
        got = np.asarray(run["logits"])
        assert got.shape == mine.shape
        assert np.abs(got - mine).max() / np.abs(mine).max() < BOUNDS["f32"]
