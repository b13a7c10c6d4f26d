"""export --gguf --gguf-type q4_0 --calib-data: blocks rounded for the columns the text leans on.

The bytes are read back with gguf-py's own q4_0 decoder, so a packing slip (nibble order, scale
bytes) shows as a wrong weight, not as a number only this code agrees with."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

import headprune_cli
from headprune_cli.data.readers import batches, read_data
from headprune_cli.model.formats import gguf_imatrix
from headprune_cli.model.formats.gguf_imatrix import collect_importance, quantize_q4_0
from tests.support.gguf_models import NON_UNIFORM_GRID, TEXT, tiny_llama, write_checkpoint
from tests.support.refusals import assert_refused

Q4 = gguf.GGMLQuantizationType.Q4_0


def weighted_error(rows: torch.Tensor, blocks: np.ndarray, importance: torch.Tensor) -> torch.Tensor:
    """Per 32-block: sum_j w_j (x_j - x'_j)^2 with llama.cpp's imatrix weights w."""
    back = torch.from_numpy(gguf.quants.dequantize(blocks, Q4)).reshape(rows.shape)
    sigma2 = (rows * rows).mean(1, keepdim=True)
    w = importance * torch.sqrt(sigma2 + rows * rows)
    return (w * (rows - back) ** 2).reshape(rows.shape[0], -1, 32).sum(2)


def test_every_block_fits_its_weights_at_least_as_well_as_the_reference_rounding():
    torch.manual_seed(0)
    rows = torch.randn(48, 256)
    importance = torch.rand(256) ** 4  # a few columns matter far more than the rest
    ours = quantize_q4_0(rows, importance)
    reference = gguf.quants.quantize(rows.numpy(), Q4)
    assert ours.shape == reference.shape and ours.dtype == np.uint8
    mine, theirs = weighted_error(rows, ours, importance), weighted_error(rows, reference, importance)
    assert (mine <= theirs * (1 + 1e-5)).all()
    assert mine.sum() < 0.85 * theirs.sum()  # and clearly better overall: the point of weighing


def test_each_stored_scale_is_the_weighted_least_squares_scale_of_its_stored_levels():
    """The levels written are the ones the chosen scale was fitted to (to the f16 it is stored in)."""
    torch.manual_seed(3)
    rows, importance = torch.randn(512, 192), torch.rand(192) ** 3
    blocks = quantize_q4_0(rows, importance).reshape(512, 6, 18)
    stored = torch.from_numpy(blocks[..., :2].copy().view(np.float16).astype(np.float32))
    nibbles = torch.from_numpy(blocks[..., 2:].astype(np.int64))
    levels = torch.cat([nibbles & 15, nibbles >> 4], dim=2).float() - 8
    x = rows.reshape(512, 6, 32)
    w = importance.reshape(1, 6, 32) * torch.sqrt((rows * rows).mean(1).reshape(512, 1, 1) + x * x)
    fitted = (w * x * levels).sum(2, keepdim=True) / (w * levels * levels).sum(2, keepdim=True)
    assert ((fitted - stored).abs() <= 2**-11 * fitted.abs()).all()


def test_a_column_of_great_importance_is_kept_closer():
    torch.manual_seed(1)
    rows = torch.randn(64, 32)
    importance = torch.ones(32)
    importance[5] = 1e4
    flat = torch.from_numpy(gguf.quants.dequantize(quantize_q4_0(rows, torch.ones(32)), Q4)).reshape(rows.shape)
    leaning = torch.from_numpy(gguf.quants.dequantize(quantize_q4_0(rows, importance), Q4)).reshape(rows.shape)
    assert (rows[:, 5] - leaning[:, 5]).abs().mean() < 0.5 * (rows[:, 5] - flat[:, 5]).abs().mean()


def test_zero_blocks_and_unreached_columns_stay_defined():
    rows = torch.zeros(2, 64)
    rows[1, 32:] = torch.linspace(-1, 1, 32)
    importance = torch.zeros(64)
    importance[:32] = 1.0  # the second block's columns were never reached by the text
    back = gguf.quants.dequantize(quantize_q4_0(rows, importance), Q4).reshape(2, 64)
    assert np.all(back[0] == 0) and np.all(back[1, :32] == 0)
    assert np.abs(back[1, 32:] - rows[1, 32:].numpy()).max() <= 1 / 7  # about one level: not zeroed


def test_the_same_rows_give_the_same_bytes_in_any_pieces(monkeypatch):
    torch.manual_seed(2)
    rows, importance = torch.randn(16, 128), torch.rand(128)
    whole = quantize_q4_0(rows, importance).tobytes()
    assert quantize_q4_0(rows.clone(), importance.clone()).tobytes() == whole
    monkeypatch.setattr(gguf_imatrix, "PIECE_BYTES", 3 * 4 * 128)  # 3 rows a piece, the last one short
    assert quantize_q4_0(rows, importance).tobytes() == whole


@pytest.fixture(scope="module")
def on_grid(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("imatrix") / "on-grid.safetensors", NON_UNIFORM_GRID)


@pytest.fixture(scope="module")
def calib(tmp_path_factory):
    path = tmp_path_factory.mktemp("imatrix-text") / "calib.txt"
    lines = [line for line in TEXT.read_text(encoding="utf-8").splitlines() if line.strip()]
    path.write_text("\n".join(lines[:12]) + "\n", encoding="utf-8")
    return path


def test_importance_counts_real_tokens_only(on_grid, calib):
    """Padding never weighs a column: the rows padded into one batch give the token-weighted mean
    of the same rows run one at a time."""
    model = headprune_cli.load(on_grid)
    data = read_data(calib, model, max_length=64, samples=4, need_labels=False)
    assert len(set(data.attention_mask.sum(1).tolist())) > 1, "rows of different lengths"
    together = collect_importance(model, batches(data, 4))
    alone = [collect_importance(model, batches(data.select(i, i + 1), 1)) for i in range(4)]
    tokens = data.attention_mask.sum(1).double()
    linears = {f"{n}.weight" for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    assert set(together) == linears
    for name, value in together.items():
        mean = sum(t * a[name].double() for t, a in zip(tokens, alone)) / tokens.sum()
        torch.testing.assert_close(value.double(), mean, rtol=1e-4, atol=1e-7)


def test_export_weighs_the_q4_0_matrices_by_the_text(on_grid, calib, tmp_path, cli):
    plain, weighed = tmp_path / "plain.gguf", tmp_path / "weighed.gguf"
    assert cli("export", on_grid, "--gguf", plain, "--gguf-type", "q4_0").code == 0
    result = cli("export", on_grid, "--gguf", weighed, "--gguf-type", "q4_0", "--calib-data", calib)
    assert result.code == 0, result
    assert "q4_0, weighted by 12 calibration rows" in result.err
    model = headprune_cli.load(on_grid)
    importance = collect_importance(model, batches(read_data(calib, model, max_length=512, need_labels=False), 8))
    names = {"blk.0.attn_q.weight": "model.layers.0.self_attn.q_proj.weight"}
    names |= {"blk.1.ffn_down.weight": "model.layers.1.mlp.down_proj.weight"}  # 64 of 128 neurons
    names |= {"blk.2.attn_output.weight": "model.layers.2.self_attn.o_proj.weight", "output.weight": "lm_head.weight"}
    assert_closer(weighed, plain, model.state_dict(), names, lambda r, b, n: weighted_error(r, b, importance[n]).sum())
    # The untied token embedding is a row lookup: nothing weighs it, its bytes are the plain ones.
    before = {t.name: t for t in gguf.GGUFReader(plain).tensors}
    after = {t.name: t for t in gguf.GGUFReader(weighed).tensors}
    assert np.array_equal(after["token_embd.weight"].data, before["token_embd.weight"].data)


def assert_closer(better: Path, worse: Path, state: dict, names: dict[str, str], error) -> None:
    """Each q4_0 matrix `names` maps (GGUF name -> checkpoint name) has less error(rows, blocks,
    checkpoint name) in the file `better` than in `worse`."""
    before = {t.name: t for t in gguf.GGUFReader(worse).tensors}
    after = {t.name: t for t in gguf.GGUFReader(better).tensors}
    for gguf_name, name in names.items():
        assert after[gguf_name].tensor_type == Q4
        rows = state[name].float()
        if "attn_q" in gguf_name:  # llama.cpp's row order: a permutation of rows, each row's error unchanged
            rows = rows[_row_order(before[gguf_name].data, rows)]
        assert error(rows, after[gguf_name].data, name) < error(rows, before[gguf_name].data, name), gguf_name


def _row_order(blocks: np.ndarray, rows: torch.Tensor) -> torch.Tensor:
    """Which checkpoint row each stored row is (nearest after dequantizing)."""
    back = torch.from_numpy(gguf.quants.dequantize(blocks, Q4)).reshape(rows.shape)
    return torch.cdist(back, rows).argmin(1)


def test_calibration_refusals_come_before_any_work(on_grid, calib, tmp_path, cli):
    out = tmp_path / "x.gguf"
    result = cli("export", on_grid, "--gguf", out, "--gguf-type", "q8_0", "--calib-data", calib)
    assert_refused(
        result, 2, "--calib-data with --gguf goes with --gguf-type q4_0 (importance-weighted blocks; got q8_0)"
    )
    result = cli("export", on_grid, "--gguf", out, "--gguf-type", "q4_0", "--calib-data", tmp_path / "missing.txt")
    assert_refused(result, 1, "missing.txt: no such data file")
    result = cli("export", on_grid, "--hf", tmp_path / "folder", "--calib-data", calib)
    assert_refused(result, 2, "--calib-data goes with --onnx FILE --quantize int8-static or --gguf FILE")
    result = cli("export", on_grid, "--gguf", out, "--quantize", "int8-dynamic")
    assert_refused(result, 2, "--quantize goes with --onnx FILE")
    assert not list(tmp_path.iterdir())


def test_a_tied_embedding_is_weighed_as_the_output_head_it_also_is(calib, tmp_path, cli):
    """SmolLM2 ties its head to the embedding: the one matrix llama.cpp multiplies last is weighed
    by the head's input."""

    tied = write_checkpoint(tmp_path / "tied.safetensors", model=tiny_llama(tie_word_embeddings=True))
    plain, weighed = tmp_path / "plain.gguf", tmp_path / "weighed.gguf"
    assert cli("export", tied, "--gguf", plain, "--gguf-type", "q4_0").code == 0
    assert cli("export", tied, "--gguf", weighed, "--gguf-type", "q4_0", "--calib-data", calib).code == 0
    model = headprune_cli.load(tied)
    head = collect_importance(model, batches(read_data(calib, model, max_length=512, need_labels=False), 8))
    rows = model.state_dict()["lm_head.weight"].float()
    before, after = ({t.name: t for t in gguf.GGUFReader(f).tensors}["token_embd.weight"] for f in (plain, weighed))
    assert "output.weight" not in {t.name for t in gguf.GGUFReader(weighed).tensors}
    mine = weighted_error(rows, after.data, head["lm_head.weight"]).sum()
    assert mine < weighted_error(rows, before.data, head["lm_head.weight"]).sum()
