"""Causal-LM ONNX files decode in onnxruntime with past key/values (uneven pruned layouts
included), and large models go out with ONNX external data."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from headprune_cli.errors import EXIT_USAGE
from headprune_cli.model.formats import onnx as onnx_export
from headprune_cli.model.formats.onnx import export_onnx
from headprune_cli.model.layout import info_of
from tests.support import assert_refused, pruned, snapshot


def ort_greedy(path, ids: torch.Tensor, mask: torch.Tensor, steps: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """Greedy decoding as a serving loop does it: the prompt with an empty past, then one
    token at a time feeding present back as past."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    past_inputs = [i for i in session.get_inputs() if i.name.startswith("past_key_values.")]
    batch = ids.shape[0]
    feeds = {i.name: np.zeros((batch, i.shape[1], 0, i.shape[3]), dtype=np.float32) for i in past_inputs}
    tokens, mask, scores = ids.numpy(), mask.numpy(), []
    new = tokens
    for _ in range(steps):
        positions = np.clip(mask.cumsum(-1) - 1, 0, None)[:, -new.shape[1] :]
        logits, *present = session.run(
            None, {"input_ids": new, "attention_mask": mask, "position_ids": positions, **feeds}
        )
        scores.append(logits[:, -1])
        new = logits[:, -1].argmax(-1)[:, None].astype(np.int64)
        tokens = np.concatenate([tokens, new], axis=1)
        mask = np.concatenate([mask, np.ones_like(new)], axis=1)
        feeds = {i.name: p for i, p in zip(past_inputs, present)}
    return tokens, scores


@pytest.mark.parametrize("name", ["llama-gqa", "gpt2"])
def test_onnx_decodes_like_generate_on_uneven_layouts(tmp_path, name):
    model = pruned(name)
    layout = info_of(model).layout
    assert len({len(kv) for kv in layout.kv_heads}) > 1  # each layer has its own KV-head count
    result = export_onnx(model, tmp_path / "m.onnx", seq_len=6)
    assert result.inputs[:3] == ["input_ids", "attention_mask", "position_ids"]
    assert result.outputs[1:3] == ["present.0.key", "present.0.value"]
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(2, 60, (2, 7), generator=gen)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding
    with torch.no_grad():
        want = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=5,
            do_sample=False,
            pad_token_id=0,
            output_logits=True,
            return_dict_in_generate=True,
        )
    tokens, scores = ort_greedy(tmp_path / "m.onnx", ids, mask, steps=5)
    assert np.array_equal(tokens, want.sequences.numpy())
    for got, ref in zip(scores, want.logits):
        np.testing.assert_allclose(got, ref.numpy(), atol=1e-4, rtol=0)


def test_large_models_use_external_data(tmp_path, monkeypatch):
    """The >= 2 GB path, on a tiny model with the threshold lowered to 1 byte."""
    monkeypatch.setattr(onnx_export, "MAX_ONNX_BYTES", 1)
    model = pruned("llama-gqa")
    result = export_onnx(model, tmp_path / "m.onnx", seq_len=6)
    assert result.external_data == "m.onnx.data"
    graph = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False)
    assert graph.graph.initializer and all(  # every weight lives in the data file
        t.data_location == onnx.TensorProto.EXTERNAL and t.external_data[0].value == "m.onnx.data"
        for t in graph.graph.initializer
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.onnx.data"]  # no stray tensor files
    tokens, _ = ort_greedy(tmp_path / "m.onnx", torch.tensor([[5, 6, 7]]), torch.ones(1, 3, dtype=torch.long), steps=2)
    assert tokens.shape == (1, 5)
    with pytest.raises(Exception, match="m.onnx.data exists"):  # never overwrite it without --force
        export_onnx(model, tmp_path / "m.onnx", seq_len=6)
    before = (tmp_path / "m.onnx.data").read_bytes()
    export_onnx(model, tmp_path / "m.onnx", seq_len=6, force=True)
    assert (tmp_path / "m.onnx.data").read_bytes() == before  # deterministic bytes


def test_external_data_file_is_an_output_never_an_input_whatever_force_says(tmp_path, monkeypatch, cli):
    """`--onnx m.onnx` also writes m.onnx.data for a large model: that file goes through the
    output rule too, so --force never replaces the input with it, nor a folder that is there."""
    import headprune_cli

    monkeypatch.setattr(onnx_export, "MAX_ONNX_BYTES", 1)
    checkpoint = tmp_path / "m.onnx.data"  # the input happens to bear the data file's name
    headprune_cli.save(pruned("llama-gqa"), checkpoint)
    before = snapshot(tmp_path)
    result = cli("export", checkpoint, "--onnx", tmp_path / "m.onnx", "--seq-len", "6", "--force")
    assert_refused(result, EXIT_USAGE, "is also an input")
    assert snapshot(tmp_path) == before  # no graph written, the input untouched

    folder = tmp_path / "other"
    folder.mkdir()
    headprune_cli.save(pruned("llama-gqa"), folder / "in.safetensors")
    (folder / "out.onnx.data").mkdir()
    result = cli("export", folder / "in.safetensors", "--onnx", folder / "out.onnx", "--seq-len", "6", "--force")
    assert_refused(result, EXIT_USAGE, "is a directory")
    assert sorted(p.name for p in folder.iterdir()) == ["in.safetensors", "out.onnx.data"]
