"""`report --gguf FILE` refusals: each is one `Error:` line before any work, and nothing is written.

These need no llama.cpp (the engine test, tests/engines/test_report_gguf.py, runs the file): a
refusal comes from the options, the file's magic bytes, the model's task or the engine's absence.
"""

from __future__ import annotations

import pytest

from tests.support.gguf_models import write_checkpoint
from tests.support.refusals import assert_refused


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A tiny causal LM and a file that starts like a GGUF file (what the checks before llama.cpp read)."""
    folder = tmp_path_factory.mktemp("report-gguf")
    write_checkpoint(folder / "lm.safetensors")
    (folder / "eval.txt").write_text("one line of text\nanother line of text\n", encoding="utf-8")
    (folder / "lm.gguf").write_bytes(b"GGUF" + bytes(60))
    (folder / "text.gguf").write_text("not a gguf file\n", encoding="utf-8")
    return folder


def _report(cli, model, data, tmp_path, *extra):
    return cli("report", "--model", model, "--baseline", model, "--data", data, "--json", tmp_path / "r.json", *extra)


@pytest.mark.parametrize(
    "extra, code, message",
    [
        (("--onnx", "{f}/lm.gguf"), 2, "--gguf and --onnx each name the shipped file"),
        (("--device", "cuda"), 2, "--device cuda does not go with it"),
        (("--dtype", "bfloat16"), 2, "--dtype bfloat16 does not go with it"),
    ],
    ids=["with --onnx", "on a GPU", "in bfloat16"],
)
def test_options_that_do_not_go_with_gguf(cli, llama, tmp_path, extra, code, message):
    extra = [str(e).format(f=llama) for e in extra]
    res = _report(cli, llama / "lm.safetensors", llama / "eval.txt", tmp_path, "--gguf", llama / "lm.gguf", *extra)
    assert_refused(res, code, message)
    assert not (tmp_path / "r.json").exists()


def test_a_missing_file_and_a_file_that_is_not_gguf(cli, llama, tmp_path):
    model, data = llama / "lm.safetensors", llama / "eval.txt"
    assert_refused(_report(cli, model, data, tmp_path, "--gguf", llama / "none.gguf"), 2, "no such file")
    assert_refused(_report(cli, model, data, tmp_path, "--gguf", llama / "text.gguf"), 1, "not a GGUF file")
    assert not (tmp_path / "r.json").exists()


def test_an_encoder_is_refused(cli, models, llama, tmp_path):
    folder, _ = models
    res = _report(cli, folder / "pruned.safetensors", folder / "dev.jsonl", tmp_path, "--gguf", llama / "lm.gguf")
    assert_refused(res, 2, "--gguf evaluates causal LMs")
    assert not (tmp_path / "r.json").exists()


def test_a_missing_engine_says_how_to_build_it(cli, llama, tmp_path, monkeypatch):
    model, data, gguf = llama / "lm.safetensors", llama / "eval.txt", llama / "lm.gguf"
    monkeypatch.setenv("HEADPRUNE_LLAMA_CPP_ENV", str(tmp_path / "no-env"))
    assert_refused(_report(cli, model, data, tmp_path, "--gguf", gguf), 2, "bash scripts/engines/llama_cpp.sh")
    res = _report(cli, model, data, tmp_path, "--gguf", gguf, "--engine-python", tmp_path / "no-python")
    assert_refused(res, 2, "engine environment absent")
    assert not (tmp_path / "r.json").exists()
