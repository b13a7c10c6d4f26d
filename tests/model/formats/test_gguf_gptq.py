"""export --gguf --gguf-type q4_0 --calib-data --gguf-rounding gptq: each column's rounding error
moved onto the columns not yet rounded, so the layer's output on the text stays closer.

The bytes are read back with gguf-py's own q4_0 decoder, as in test_gguf_imatrix."""

from __future__ import annotations

import gguf
import numpy as np
import torch

import headprune_cli
from headprune_cli.data.readers import batches, read_data
from headprune_cli.model.formats import gguf_gptq
from headprune_cli.model.formats.gguf_gptq import collect_hessians, gptq_model, gptq_q4_0
from headprune_cli.model.formats.gguf_imatrix import quantize_q4_0
from tests.model.formats.test_gguf_imatrix import Q4, assert_closer, calib, on_grid  # noqa: F401 (fixtures)
from tests.support.refusals import assert_refused


def decoded(blocks: np.ndarray, shape) -> torch.Tensor:
    return torch.from_numpy(gguf.quants.dequantize(np.ascontiguousarray(blocks), Q4)).reshape(shape)


def output_error(weight: torch.Tensor, blocks: np.ndarray, hessian: torch.Tensor) -> float:
    """E ||(W - W') x||^2 over the text whose second moment is `hessian`."""
    delta = weight - decoded(blocks, weight.shape)
    return float(torch.einsum("ij,jk,ik->", delta.double(), hessian.double(), delta.double()))


def correlated(rows: int, columns: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A weight and the second moment of inputs whose columns are correlated and unevenly large
    (as a layer's inputs are; GPTQ's gain comes from the correlation)."""
    torch.manual_seed(seed)
    mix = torch.randn(columns, columns) / columns**0.5 + torch.eye(columns)
    x = torch.randn(4 * columns, columns) @ mix * (torch.rand(columns) * 3)
    return torch.randn(rows, columns) * 0.05, x.T @ x / len(x)


def test_the_layer_output_on_the_text_is_closer_than_nearest_rounding_at_weighted_scales():
    weight, hessian = correlated(96, 256)
    gptq = gptq_q4_0(weight, hessian)
    nearest = quantize_q4_0(weight, torch.diagonal(hessian))
    assert gptq.shape == nearest.shape == (96, 256 // 32 * 18) and gptq.dtype == np.uint8
    assert output_error(weight, gptq, hessian) < 0.75 * output_error(weight, nearest, hessian)


def test_with_uncorrelated_inputs_each_weight_is_its_nearest_level_at_the_stored_scale():
    """H diagonal: no error has anywhere to go, so GPTQ is plain rounding at each block's scale."""
    torch.manual_seed(2)
    weight = torch.randn(1024, 128)  # enough weights that some sit where the f16 rounding of a scale moves them
    blocks = gptq_q4_0(weight, torch.diag(torch.rand(128) + 0.5)).reshape(1024, 4, 18)
    scale = torch.from_numpy(blocks[..., :2].copy().view(np.float16).astype(np.float32))
    nibbles = torch.from_numpy(blocks[..., 2:].astype(np.int64))
    levels = torch.cat([nibbles & 15, nibbles >> 4], dim=2).float() - 8
    expected = torch.round(weight.reshape(1024, 4, 32) / scale).clamp(-8, 7)
    assert torch.equal(levels, expected)


def test_rows_are_rounded_independently_so_any_row_order_gives_the_same_rows():
    """The writer puts Q/K rows in llama.cpp's rotary order after rounding: that must not matter."""
    weight, hessian = correlated(48, 64, seed=4)
    order = torch.randperm(48)
    assert np.array_equal(gptq_q4_0(weight, hessian)[order.numpy()], gptq_q4_0(weight[order], hessian))


def test_zero_rows_and_unreached_columns_stay_defined():
    weight, hessian = correlated(8, 64, seed=5)
    weight[3] = 0
    hessian[:, 10] = hessian[10, :] = 0  # no token reached column 10
    back = decoded(gptq_q4_0(weight, hessian), weight.shape)
    assert torch.isfinite(back).all() and (back[3] == 0).all()
    assert (back - weight).abs().max() < 0.1


def test_hessians_count_real_tokens_only(on_grid, calib):  # noqa: F811 (fixtures)
    model = headprune_cli.load(on_grid)
    data = read_data(calib, model, max_length=64, samples=4, need_labels=False)
    assert len(set(data.attention_mask.sum(1).tolist())) > 1, "rows of different lengths"
    linears = {f"{n}.weight": m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    together = collect_hessians(model, batches(data, 4), linears)
    alone = [collect_hessians(model, batches(data.select(i, i + 1), 1), linears) for i in range(4)]
    tokens = data.attention_mask.sum(1).double()
    for name, value in together.items():
        mean = sum(t * a[name].double() for t, a in zip(tokens, alone)) / tokens.sum()
        torch.testing.assert_close(value.double(), mean, rtol=1e-4, atol=1e-6)


def test_layers_taken_in_groups_give_the_same_bytes(on_grid, calib, monkeypatch):  # noqa: F811 (fixtures)
    """A large model's H are accumulated a few layers per calibration pass: same bytes as at once."""
    model = headprune_cli.load(on_grid)
    data = read_data(calib, model, max_length=64, samples=4, need_labels=False)
    at_once = gptq_model(model, lambda _label: batches(data, 4))
    monkeypatch.setattr(gguf_gptq, "HESSIAN_BYTES", 1)
    passes = []
    in_groups = gptq_model(model, lambda label: passes.append(label) or batches(data, 4))
    assert len(passes) == len(at_once) > 1
    assert passes[1] == f"GPTQ, matrices 2-2 of {len(at_once)}"
    assert at_once.keys() == in_groups.keys()
    assert all(np.array_equal(at_once[name], in_groups[name]) for name in at_once)


def test_a_pass_for_early_layers_stops_after_them(on_grid, calib):  # noqa: F811 (fixtures)
    """Each group's pass over the text ends once its layers have seen the batch."""
    model = headprune_cli.load(on_grid)
    data = read_data(calib, model, max_length=64, samples=4, need_labels=False)
    reached = []
    model.model.layers[-1].register_forward_pre_hook(lambda *_: reached.append(1))
    first = {"model.layers.0.self_attn.k_proj.weight": model.model.layers[0].self_attn.k_proj}
    hessians = collect_hessians(model, batches(data, 2), first)
    assert list(hessians) == list(first) and not reached
    collect_hessians(model, batches(data, 2), {"lm_head.weight": model.lm_head})
    assert len(reached) == 2  # a pass for the head runs every layer, once per batch


def test_export_rounds_every_q4_0_matrix_closer_on_the_text(on_grid, calib, tmp_path, cli):  # noqa: F811 (fixtures)
    nearest, gptq = tmp_path / "nearest.gguf", tmp_path / "gptq.gguf"
    common = ("--gguf-type", "q4_0", "--calib-data", calib)
    assert cli("export", on_grid, "--gguf", nearest, *common).code == 0
    result = cli("export", on_grid, "--gguf", gptq, *common, "--gguf-rounding", "gptq")
    assert result.code == 0, result
    assert "q4_0, rounded by GPTQ on 12 calibration rows" in result.err
    model = headprune_cli.load(on_grid)
    data = read_data(calib, model, max_length=512, need_labels=False)
    linears = {f"{n}.weight": m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    hessians = collect_hessians(model, batches(data, 8), linears)
    names = {"blk.0.attn_q.weight": "model.layers.0.self_attn.q_proj.weight"}
    names |= {"blk.1.ffn_down.weight": "model.layers.1.mlp.down_proj.weight"}  # 64 of 128 neurons
    names |= {"blk.2.ffn_gate.weight": "model.layers.2.mlp.gate_proj.weight", "output.weight": "lm_head.weight"}
    assert_closer(gptq, nearest, model.state_dict(), names, lambda r, b, n: output_error(r, b, hessians[n]))


def test_rounding_refusals_come_before_any_work(on_grid, calib, tmp_path, cli):  # noqa: F811 (fixtures)
    out = tmp_path / "x.gguf"
    result = cli("export", on_grid, "--gguf", out, "--gguf-type", "q4_0", "--calib-data", calib, "--gguf-rounding", "x")
    assert_refused(result, 2, "--gguf-rounding: one of nearest, gptq (got x)")
    result = cli("export", on_grid, "--gguf", out, "--gguf-type", "q4_0", "--gguf-rounding", "gptq")
    assert_refused(result, 2, "--gguf-rounding gptq goes with --gguf FILE --calib-data TEXT")
    result = cli("export", on_grid, "--onnx", out, "--calib-data", calib, "--gguf-rounding", "gptq")
    assert_refused(result, 2, "--gguf-rounding gptq goes with --gguf FILE --calib-data TEXT")
    assert not list(tmp_path.iterdir())
