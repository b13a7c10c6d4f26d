"""Widths on the quantization grid: `select --runtime llama.cpp --gguf-type T` keeps every FFN
width a multiple of T's block, so `export --gguf --gguf-type T` writes every matrix in T; a cut
that left the grid is refused by the export, naming the layer and the fix (model/formats/gguf_grid.py)."""

from __future__ import annotations

import json

import gguf
import pytest

import headprune_cli
from headprune_cli.model.formats.gguf_grid import block_of, grid_ffn_multiple, off_grid
from tests.support.gguf_models import VOCAB, bpe_tokenizer, tiny_llama
from tests.support.refusals import assert_refused


def test_each_type_has_its_block_and_the_plan_multiple_is_on_both_grids():
    assert [block_of(t) for t in ("f16", "q8_0", "q4_0", "q5_1", "q4_K_M", "q5_K_M", "q6_K")] == [
        1, 32, 32, 32, 256, 256, 256,
    ]  # fmt: skip
    assert grid_ffn_multiple(8, None) == 8
    assert grid_ffn_multiple(8, "q4_0") == 32 and grid_ffn_multiple(24, "q8_0") == 96  # lcm, not max
    assert grid_ffn_multiple(8, "q4_K_M") == 256 and grid_ffn_multiple(1, "f16") == 1


def test_only_widths_the_cut_moved_off_the_grid_are_named():
    config = {"intermediate_size": 1536, "num_attention_heads": 9}  # SmolLM2: 9 heads of 64 = 576
    # 576 is off the k-quant grid in the unpruned model already: llama.cpp's matter, not the cut's.
    assert off_grid([0, 1], [9, 6], [1536, 1280], 64, config, "q4_K_M") == []
    found = off_grid([0, 1], [9, 6], [1536, 1000], 64, config, "q4_K_M")
    assert found == [
        "layer 1's FFN width 1000 is not a multiple of 256 (q4_K_M's block): select with --runtime llama.cpp "
        "--gguf-type q4_K_M"
    ]
    llama = {"intermediate_size": 11008, "num_attention_heads": 32}  # 32 heads of 128 = 4096: on every grid
    heads = off_grid([3], [31], [11008], 128, llama, "q4_K_M")
    assert heads == [
        "layer 3 keeps 31 query heads of 128 (3968 values, not a multiple of 256): select with --multiple-of 2"
    ]
    assert off_grid([3], [31], [11008], 128, llama, "q8_0") == []  # 31 x 128 is a whole number of 32-blocks
    assert off_grid([3], [31], [1000], 128, llama, "f16") == []  # f16 has no blocks


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    folder = tmp_path_factory.mktemp("grid")
    model = tiny_llama()  # FFN 128 in 4 layers, hidden 64, 8 heads of 16
    headprune_cli.save(model, folder / "m.safetensors")
    tokenizer = bpe_tokenizer()
    words = [tokenizer.id_to_token(i) for i in range(3, VOCAB)]
    (folder / "d.txt").write_text(
        "\n".join(" ".join(words[(i * 7 + j) % len(words)] for j in range(20)) for i in range(12))
    )
    return folder


def _cut(cli, folder, name: str, *select: str) -> tuple[dict, object]:
    scores = folder / "scores.json"
    if not scores.exists():
        assert cli("score", folder / "m.safetensors", "--data", folder / "d.txt", "--ffn", "-o", scores).code == 0
    plan, cut = folder / f"{name}.json", folder / f"{name}.safetensors"
    assert cli("select", scores, "--target-flops", "0.55", *select, "-o", plan).code == 0
    assert cli("prune", "--plan", plan, "-o", cut).code == 0
    return json.loads(plan.read_text()), cut


def test_a_plan_for_q8_0_keeps_every_ffn_width_on_the_grid_and_exports_every_matrix_quantized(scored, cli, tmp_path):
    plan, cut = _cut(cli, scored, "grid", "--runtime", "llama.cpp", "--gguf-type", "q8_0")
    assert plan["constraints"]["gguf_type"] == "q8_0" and plan["constraints"]["ffn_multiple_of"] == 32
    widths = [128 - len(plan["remove_ffn"].get(str(layer), [])) for layer in range(4)]
    assert all(w % 32 == 0 for w in widths) and widths != [128] * 4, widths  # neurons were cut, on the grid
    out = tmp_path / "cut.gguf"
    result = cli("export", cut, "--gguf", out, "--gguf-type", "q8_0")
    assert result.code == 0, result
    assert "off the block grid" not in result.err + result.out
    for t in gguf.GGUFReader(out).tensors:
        want = gguf.GGMLQuantizationType.F32 if len(t.shape) == 1 else gguf.GGMLQuantizationType.Q8_0
        assert t.tensor_type == want, t.name


def test_a_plan_without_the_grid_is_refused_by_the_quantized_export(scored, cli, tmp_path):
    plan, cut = _cut(cli, scored, "free", "--ffn-multiple-of", "4")
    widths = [128 - len(plan["remove_ffn"].get(str(layer), [])) for layer in range(4)]
    assert any(w % 32 for w in widths), widths  # the budget alone lands off the grid
    assert "gguf_type" not in plan["constraints"]  # plans without it keep their bytes
    out = tmp_path / "cut.gguf"
    result = cli("export", cut, "--gguf", out, "--gguf-type", "q4_0")
    assert_refused(
        result, 1, "is not a multiple of 32 (q4_0's block): select with --runtime llama.cpp --gguf-type q4_0"
    )
    assert not out.exists() and not list(tmp_path.glob(".*.tmp"))
    assert cli("export", cut, "--gguf", out, "--gguf-type", "f16").code == 0  # f16 has no grid


def test_gguf_type_needs_the_llama_cpp_runtime_and_a_known_type(scored, cli, tmp_path):
    scores = scored / "scores.json"
    if not scores.exists():
        assert cli("score", scored / "m.safetensors", "--data", scored / "d.txt", "--ffn", "-o", scores).code == 0
    out = tmp_path / "p.json"
    result = cli("select", scores, "--target-flops", "0.6", "--gguf-type", "q4_0", "-o", out)
    assert_refused(result, 2, "--gguf-type goes with --runtime llama.cpp")
    result = cli("select", scores, "--target-flops", "0.6", "--runtime", "llama.cpp", "--gguf-type", "q3_K", "-o", out)
    assert_refused(result, 2, "unknown --gguf-type 'q3_K'")
    assert not out.exists()


def test_a_k_quant_export_without_llama_cpp_is_refused_before_anything_is_read(scored, cli, tmp_path, monkeypatch):
    monkeypatch.setenv("HEADPRUNE_LLAMA_CPP_ENV", str(tmp_path / "no-env"))
    out = tmp_path / "m.gguf"
    result = cli("export", scored / "m.safetensors", "--gguf", out, "--gguf-type", "q4_K_M")
    assert_refused(result, 2, "--gguf-type q4_K_M: llama.cpp engine environment absent")
    assert not out.exists()
