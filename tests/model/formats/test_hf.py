"""`headprune export`: ONNX files that onnxruntime runs like PyTorch, HF-style folders that
load back bit-identically, and bad input refused without a partial output."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort  # in the `test` extra: required, not optional
import pytest
import torch

import headprune_cli
from headprune_cli.model.formats.hf import export_hf
from headprune_cli.model.formats.onnx import export_onnx
from headprune_cli.model.layout import info_of
from tests.support import CAUSAL, PLANS, TINY, model_inputs, model_output, pruned, snapshot


def heads_per_layer(model) -> list[int]:
    return [len(h) for h in info_of(model).layout.heads]


@pytest.mark.parametrize("name", sorted(set(PLANS) - set(CAUSAL)))  # causal LMs: tests/model/test_onnx_decode.py
def test_onnx_matches_pytorch_on_pruned_models(tmp_path, name):
    model = pruned(name)
    assert len(set(heads_per_layer(model))) > 1  # really uneven
    path = tmp_path / "m.onnx"
    result = export_onnx(model, path, seq_len=9)
    assert result.max_abs_diff <= 1e-4
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == list(model_inputs(name))
    # Shapes other than the traced one: the batch and sequence axes are dynamic.
    for batch, seq in ((1, 5), (4, 13)):
        inputs = model_inputs(name, batch=batch, seq=seq)
        if "attention_mask" in inputs:
            inputs["attention_mask"][-1] = 1  # one row without padding too
        want = model_output(model, inputs)
        (got,) = session.run(None, {k: v.numpy() for k, v in inputs.items()})
        assert got.shape == tuple(want.shape)
        np.testing.assert_allclose(got, want.numpy(), atol=1e-4, rtol=0)


def test_onnx_output_names(tmp_path):
    model = TINY["roberta"]()  # a base model: last_hidden_state, token-level
    result = export_onnx(model, tmp_path / "r.onnx", seq_len=6)
    assert result.outputs == ["last_hidden_state"]
    session = ort.InferenceSession(str(tmp_path / "r.onnx"), providers=["CPUExecutionProvider"])
    assert session.get_outputs()[0].name == "last_hidden_state"
    assert export_onnx(pruned("bert"), tmp_path / "b.onnx").outputs == ["logits"]


@pytest.mark.parametrize("name", ["reference", "bert", "distilbert", "vit", "gpt2", "llama-gqa"])
def test_hf_folder_round_trip_is_bit_identical(tmp_path, name):
    model = pruned(name)
    folder = export_hf(model, tmp_path / "out")
    names = {p.name for p in folder.iterdir()}
    # Weights are model.safetensors only where transformers can load them (tests/integration/test_deploy.py).
    assert {"config.json", "headprune.json"} <= names and len(
        names & {"model.safetensors", "headprune.safetensors"}
    ) == 1
    back = headprune_cli.load(folder)
    assert heads_per_layer(back) == heads_per_layer(model)
    assert info_of(back).layout == info_of(model).layout
    inputs = model_inputs(name)
    assert torch.equal(model_output(back, inputs), model_output(model, inputs))
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == [type(model).__name__]


def test_hf_folder_carries_tokenizer_and_pooling(tmp_path):
    model = TINY["bert"]()
    info = info_of(model)
    info.tokenizer = json.dumps(
        {"version": "1.0", "model": {"type": "WordLevel", "vocab": {"[UNK]": 0}, "unk_token": "[UNK]"}}
    )
    info.tokenizer_config = {"pad_token": "[PAD]", "model_max_length": 128}
    info.pooling = {"mode": "mean", "normalize": True}
    folder = export_hf(model, tmp_path / "out")
    assert (folder / "tokenizer.json").read_text() == info.tokenizer
    assert json.loads((folder / "tokenizer_config.json").read_text())["pad_token"] == "[PAD]"
    back = info_of(headprune_cli.load(folder))
    assert (back.tokenizer, back.tokenizer_config, back.pooling) == (
        info.tokenizer,
        info.tokenizer_config,
        info.pooling,
    )


@pytest.mark.parametrize("shard", ["5GB", "20KB"])
def test_the_weights_hash_remembered_at_export_is_the_files_own(tmp_path, shard):
    """export_hf hashes each weight file as it writes it and remembers the hash (so `run`
    never reads a multi-GB export back): what it remembered must be the file's sha256."""
    import hashlib

    from headprune_cli.files.io import sha256_file

    folder = export_hf(pruned("gpt2"), tmp_path / "dir", max_shard_size=shard)
    weights = sorted(folder.glob("*.safetensors"))
    assert (len(weights) == 1) == (shard == "5GB")
    for path in weights:
        assert sha256_file(path) == hashlib.sha256(path.read_bytes()).hexdigest()


def test_cli_export_and_reimport(tmp_path, cli):
    ckpt = tmp_path / "small.safetensors"
    headprune_cli.save(pruned("gpt2"), ckpt)
    res = cli("export", ckpt, "--hf", tmp_path / "dir")
    assert res.code == 0, res.err
    assert res.out == ""  # data only on stdout; the message goes to stderr
    first = snapshot(tmp_path / "dir")
    # Same checkpoint -> byte-identical folder (--force replaces our own export).
    assert cli("export", ckpt, "--hf", tmp_path / "dir", "--force").code == 0
    assert snapshot(tmp_path / "dir") == first
    meta = json.loads((tmp_path / "dir" / "headprune.json").read_text())
    assert meta["provenance"]["exported_from"] == headprune_cli.model.checkpoint.sha256_file(ckpt)
    res = cli("import", tmp_path / "dir", "-o", tmp_path / "again.safetensors")
    assert res.code == 0, res.err
    inputs = model_inputs("gpt2")
    want = model_output(headprune_cli.load(ckpt), inputs)
    assert torch.equal(model_output(headprune_cli.load(tmp_path / "again.safetensors"), inputs), want)
    res = cli("export", ckpt, "--onnx", tmp_path / "m.onnx", "--seq-len", "8")
    assert res.code == 0, res.err
    assert "onnxruntime matches" in res.err


def test_cli_bad_input(tmp_path, cli):
    ckpt = tmp_path / "m.safetensors"
    headprune_cli.save(pruned("bert"), ckpt)
    (tmp_path / "exists.onnx").write_bytes(b"keep")
    (tmp_path / "notmine").mkdir()
    (tmp_path / "notmine" / "precious.txt").write_text("keep")
    (tmp_path / "junk.safetensors").write_bytes(b"not a checkpoint at all")
    before = snapshot(tmp_path)
    cases = [
        ("export", ckpt, "--onnx", tmp_path / "exists.onnx"),  # existing output, no --force
        ("export", ckpt, "--hf", tmp_path / "notmine", "--force"),  # a folder we did not write
        ("export", ckpt, "--hf", ckpt, "--force"),  # output is the input
        ("export", tmp_path / "junk.safetensors", "--onnx", tmp_path / "new.onnx"),  # not a checkpoint
        ("export", tmp_path / "missing.safetensors", "--hf", tmp_path / "new"),
        ("export", ckpt),  # neither output
        ("export", ckpt, "--onnx", tmp_path / "a.onnx", "--hf", tmp_path / "b"),  # both
        ("export", ckpt, "--onnx", tmp_path / "a.onnx", "--seq-len", "100000"),  # beyond positions
    ]
    for args in cases:
        res = cli(*args)
        assert res.code != 0, args
        lines = res.err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: "), (args, res.err)
        assert "Traceback" not in res.err
        assert res.out == ""
        assert snapshot(tmp_path) == before, args  # no partial or stray file, nothing overwritten
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], args
