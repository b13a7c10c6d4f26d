"""export --gguf: what the GGUF file holds, read back with gguf-py's own reader (no llama.cpp needed).

The engine itself loads these files in tests/engines/test_llama_cpp.py."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
import torch
import transformers as T

import headprune_cli
from headprune_cli.errors import PlanError, UsageError
from headprune_cli.model.formats.gguf import _check_rope, _rope, rope_freqs
from tests.support.gguf_models import (
    NON_UNIFORM,
    NON_UNIFORM_GRID,
    ROPES,
    UNIFORM,
    VOCAB,
    bpe_tokenizer,
    tiny_llama,
    write_checkpoint,
)
from tests.support.models import TINY
from tests.support.refusals import assert_refused


def fields(reader: gguf.GGUFReader) -> dict:
    return {name: field.contents() for name, field in reader.fields.items()}


def tensors(reader: gguf.GGUFReader) -> dict:
    return {t.name: t for t in reader.tensors}


def permute(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's LlamaModel.permute, written out independently of the writer."""
    rows = weight.shape[0]
    out = torch.empty_like(weight)
    half = rows // heads // 2
    for h in range(heads):
        block = weight[h * 2 * half : (h + 1) * 2 * half]
        out[h * 2 * half : (h + 1) * 2 * half][0::2] = block[:half]
        out[h * 2 * half : (h + 1) * 2 * half][1::2] = block[half:]
    return out


@pytest.fixture(scope="module")
def non_uniform(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gguf")
    return write_checkpoint(folder / "nu.safetensors", NON_UNIFORM)


def test_non_uniform_cut_is_deci_with_per_layer_shapes(non_uniform, tmp_path, cli):
    out = tmp_path / "m.gguf"
    result = cli("export", non_uniform, "--gguf", out)
    assert result.code == 0, result
    assert "architecture deci" in result.err + result.out
    reader = gguf.GGUFReader(out)
    meta = fields(reader)
    assert meta["general.architecture"] == "deci"
    assert meta["deci.block_count"] == 3  # layer 1 dropped
    assert meta["deci.attention.head_count"] == [4, 8, 6]
    assert meta["deci.attention.head_count_kv"] == [2, 4, 3]
    assert meta["deci.feed_forward_length"] == [128, 64, 83]
    assert meta["deci.attention.key_length"] == meta["deci.rope.dimension_count"] == 16
    model = headprune_cli.load(non_uniform)
    state = model.state_dict()
    found = tensors(reader)
    for pos, (heads, kv) in enumerate([(4, 2), (8, 4), (6, 3)]):
        prefix = f"model.layers.{pos}."
        q = np.asarray(found[f"blk.{pos}.attn_q.weight"].data)
        k = np.asarray(found[f"blk.{pos}.attn_k.weight"].data)
        assert q.shape == (heads * 16, 64) and k.shape == (kv * 16, 64)
        assert np.array_equal(q, permute(state[prefix + "self_attn.q_proj.weight"], heads).numpy())
        assert np.array_equal(k, permute(state[prefix + "self_attn.k_proj.weight"], kv).numpy())
        for ours, theirs in (
            ("attn_v", "self_attn.v_proj"),
            ("attn_output", "self_attn.o_proj"),
            ("ffn_down", "mlp.down_proj"),
            ("ffn_gate", "mlp.gate_proj"),
            ("ffn_up", "mlp.up_proj"),
            ("attn_norm", "input_layernorm"),
            ("ffn_norm", "post_attention_layernorm"),
        ):
            assert np.array_equal(
                np.asarray(found[f"blk.{pos}.{ours}.weight"].data), state[prefix + theirs + ".weight"].numpy()
            )
    assert np.array_equal(np.asarray(found["output.weight"].data), state["lm_head.weight"].numpy())
    assert np.array_equal(np.asarray(found["token_embd.weight"].data), state["model.embed_tokens.weight"].numpy())
    assert np.array_equal(np.asarray(found["output_norm.weight"].data), state["model.norm.weight"].numpy())
    assert all(t.tensor_type == gguf.GGMLQuantizationType.F32 for t in reader.tensors)  # auto: the checkpoint's f32


def test_uniform_cut_is_plain_llama(tmp_path, cli):
    source = write_checkpoint(tmp_path / "u.safetensors", UNIFORM)
    out = tmp_path / "u.gguf"
    assert cli("export", source, "--gguf", out).code == 0
    meta = fields(gguf.GGUFReader(out))
    assert meta["general.architecture"] == "llama"
    assert (meta["llama.attention.head_count"], meta["llama.attention.head_count_kv"]) == (6, 3)
    assert meta["llama.feed_forward_length"] == 96 and meta["llama.block_count"] == 3


def test_a_uniform_cut_written_as_deci_holds_the_same_tensors_with_per_layer_shapes(tmp_path):
    """The rule picks `llama` for a uniform cut; `arch="deci"` writes the same weights as the
    per-layer graph (what scripts/benchmarks/gguf_arch.py times against `llama`)."""
    source = write_checkpoint(tmp_path / "u.safetensors", UNIFORM)
    llama = headprune_cli.export_gguf(source, tmp_path / "l.gguf", "f16")
    deci = headprune_cli.export_gguf(source, tmp_path / "d.gguf", "f16", arch="deci")
    assert (llama.arch, deci.arch) == ("llama", "deci")
    meta = fields(gguf.GGUFReader(deci.path))
    assert meta["general.architecture"] == "deci"
    assert meta["deci.attention.head_count"] == [6, 6, 6] and meta["deci.attention.head_count_kv"] == [3, 3, 3]
    assert meta["deci.feed_forward_length"] == [96, 96, 96]
    ours, theirs = tensors(gguf.GGUFReader(llama.path)), tensors(gguf.GGUFReader(deci.path))
    assert ours.keys() == theirs.keys()
    assert all(np.array_equal(ours[name].data, theirs[name].data) for name in ours)


def test_llama_is_refused_for_a_non_uniform_cut_naming_the_layer(non_uniform, tmp_path):
    out = tmp_path / "x.gguf"
    with pytest.raises(PlanError, match="layer 2 keeps 8 query / 4 KV heads and FFN width 64 where layer 0 keeps 4"):
        headprune_cli.export_gguf(non_uniform, out, arch="llama")
    assert not out.exists()


def test_an_unknown_architecture_is_refused_listing_the_choices(non_uniform, tmp_path):
    with pytest.raises(UsageError, match="choose one of auto, llama, deci"):
        headprune_cli.export_gguf(non_uniform, tmp_path / "x.gguf", arch="mistral")
    assert not (tmp_path / "x.gguf").exists()


def test_decode_bytes_are_every_weight_but_the_gathered_embedding_and_the_kv_cache(non_uniform, tmp_path):
    """Counted from the checkpoint, not the file: f16 matrices, f32 vectors, the untied embedding
    left out (decoding gathers one row), and per kept layer KV heads x (key + value) f16 values."""
    path = headprune_cli.export_gguf(non_uniform, tmp_path / "m.gguf", "f16").path
    model = headprune_cli.load(non_uniform)
    weights = sum(
        p.numel() * (2 if p.dim() == 2 else 4) for name, p in model.named_parameters() if "embed_tokens" not in name
    )
    kv_per_token = (2 + 4 + 3) * (16 + 16) * 2  # layers 0, 2, 3 keep 2, 4 and 3 KV heads of 16
    got = headprune_cli.gguf_decode_bytes(path, context=10)
    assert got["weights"] == weights
    assert got["kv"] == kv_per_token * 10  # read once: llama.cpp writes each step's K/V in place
    assert got["total"] == weights + got["kv"]


def test_tokenizer_metadata_is_the_checkpoints(non_uniform, tmp_path, cli):
    out = tmp_path / "m.gguf"
    cli("export", non_uniform, "--gguf", out)
    meta = fields(gguf.GGUFReader(out))
    tok = json.loads(bpe_tokenizer().to_str())
    vocab = {i: t for t, i in tok["model"]["vocab"].items()}
    assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.pre"] == "gpt-2"
    assert meta["tokenizer.ggml.tokens"] == [vocab[i] for i in range(VOCAB)]
    assert meta["tokenizer.ggml.merges"] == [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    assert meta["tokenizer.ggml.token_type"][:3] == [3, 3, 3] and set(meta["tokenizer.ggml.token_type"][3:]) == {1}
    assert (meta["tokenizer.ggml.bos_token_id"], meta["tokenizer.ggml.eos_token_id"]) == (1, 2)
    assert meta["tokenizer.ggml.add_bos_token"] is True


@pytest.fixture(scope="module")
def on_grid(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("gguf-grid") / "on-grid.safetensors", NON_UNIFORM_GRID)


@pytest.mark.parametrize("kind", ["q8_0", "q4_0"])
def test_quantized_types_write_every_matrix_of_a_cut_on_the_grid_in_the_type(on_grid, tmp_path, cli, kind):
    out = tmp_path / "q.gguf"
    result = cli("export", on_grid, "--gguf", out, "--gguf-type", kind)
    assert result.code == 0, result
    assert "off the block grid" not in result.err + result.out
    reader = gguf.GGUFReader(out)
    assert fields(reader)["general.file_type"] == gguf.LlamaFileType[f"MOSTLY_{kind.upper()}"]
    assert fields(reader)["deci.feed_forward_length"] == [128, 64, 96]
    found = tensors(reader)
    qtype = gguf.GGMLQuantizationType[kind.upper()]
    for name, t in found.items():
        assert t.tensor_type == (gguf.GGMLQuantizationType.F32 if len(t.shape) == 1 else qtype), name
    state = headprune_cli.load(on_grid).state_dict()
    bound = {"q8_0": 0.01, "q4_0": 0.15}[kind]
    for pos, layer in ((0, 0), (2, 3)):  # the full width and the cut one
        weight = state[f"model.layers.{pos}.mlp.down_proj.weight"].numpy()
        back = gguf.quants.dequantize(found[f"blk.{pos}.ffn_down.weight"].data, qtype).reshape(weight.shape)
        assert np.abs(back - weight).max() <= bound * np.abs(weight).max(), layer


@pytest.mark.parametrize("kind", ["q8_0", "q4_0"])
def test_a_cut_off_the_block_grid_is_refused_naming_the_layer_and_the_fix(non_uniform, tmp_path, cli, kind):
    """Layer 3 keeps 83 FFN neurons: its down projection's rows are not whole 32-blocks. Written in
    f16 beside quantized matrices it made the cut slower than the unpruned file at the same type."""
    out = tmp_path / "q.gguf"
    result = cli("export", non_uniform, "--gguf", out, "--gguf-type", kind)
    assert_refused(
        result,
        1,
        f"layer 3's FFN width 83 is not a multiple of 32 ({kind}'s block): select with --runtime llama.cpp "
        f"--gguf-type {kind}",
    )
    assert not out.exists() and not list(tmp_path.iterdir())


def test_embedding_type_gives_the_embedding_and_output_head_their_own_type(on_grid, tmp_path, cli):
    """--gguf-type q4_0 --gguf-embedding-type q8_0: every block matrix q4_0, the token embedding and
    the (untied) output head q8_0, each dequantizing to its checkpoint weights within q8_0's error."""
    out = tmp_path / "q.gguf"
    result = cli("export", on_grid, "--gguf", out, "--gguf-type", "q4_0", "--gguf-embedding-type", "q8_0")
    assert result.code == 0, result
    assert "q4_0, embedding q8_0" in result.err
    found = tensors(gguf.GGUFReader(out))
    q4, q8 = gguf.GGMLQuantizationType.Q4_0, gguf.GGMLQuantizationType.Q8_0
    heads = {"token_embd.weight": "model.embed_tokens.weight", "output.weight": "lm_head.weight"}
    for name, t in found.items():
        want = gguf.GGMLQuantizationType.F32 if len(t.shape) == 1 else q8 if name in heads else q4
        assert t.tensor_type == want, name
    state = headprune_cli.load(on_grid).state_dict()
    for name, key in heads.items():
        weight = state[key].numpy()
        back = gguf.quants.dequantize(found[name].data, q8).reshape(weight.shape)
        assert np.abs(back - weight).max() <= 0.01 * np.abs(weight).max(), name


def test_embedding_type_refusals(on_grid, tmp_path, cli):
    result = cli("export", on_grid, "--gguf", tmp_path / "x.gguf", "--gguf-embedding-type", "q6_K")
    assert_refused(result, 2, "unknown --gguf-embedding-type 'q6_K'; supported: f32, f16, bf16, q8_0")
    result = cli("export", on_grid, "--onnx", tmp_path / "x.onnx", "--gguf-embedding-type", "q8_0")
    assert_refused(result, 2, "--gguf-embedding-type goes with --gguf FILE")
    assert not list(tmp_path.iterdir())


def test_same_input_gives_byte_identical_gguf(on_grid, tmp_path, cli):
    for name in ("a.gguf", "b.gguf"):
        assert cli("export", on_grid, "--gguf", tmp_path / name, "--gguf-type", "q8_0").code == 0
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()


def test_refuses_a_family_llama_cpp_has_no_architecture_for(tmp_path, cli):
    source = tmp_path / "gpt2.safetensors"
    headprune_cli.save(TINY["gpt2"](), source)
    assert_refused(cli("export", source, "--gguf", tmp_path / "x.gguf"), 1, "LLaMA-family causal LMs (llama, mistral")
    assert not (tmp_path / "x.gguf").exists()


def test_refuses_a_non_uniform_qwen3_and_names_the_layer(tmp_path, cli):
    model = tiny_llama(T.Qwen3ForCausalLM, T.Qwen3Config)
    source = write_checkpoint(tmp_path / "q3.safetensors", ({2: [6, 7]}, [], None), model)
    result = cli("export", source, "--gguf", tmp_path / "x.gguf")
    assert_refused(result, 1, "layer 2 keeps 6 query / 3 KV heads and FFN width 128 where layer 0 keeps 8 query")
    assert "no q/k norms" in result.err and not (tmp_path / "x.gguf").exists()


def test_refuses_an_unknown_type_listing_the_supported_ones(non_uniform, tmp_path, cli):
    result = cli("export", non_uniform, "--gguf", tmp_path / "x.gguf", "--gguf-type", "q4_k")
    assert_refused(result, 2, "supported: auto, f32, f16, bf16, q8_0")
    assert not (tmp_path / "x.gguf").exists()


def test_refuses_a_tokenizer_llama_cpp_cannot_reproduce(tmp_path, cli):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    model = tiny_llama()
    words = Tokenizer(WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    words.pre_tokenizer = Whitespace()
    headprune_cli.model.layout.info_of(model).tokenizer = words.to_str()
    source = write_checkpoint(tmp_path / "w.safetensors", model=model)
    assert_refused(cli("export", source, "--gguf", tmp_path / "x.gguf"), 1, "cannot reproduce this WordLevel tokenizer")
    assert not (tmp_path / "x.gguf").exists()


def test_qwen2_goes_out_as_llama_with_its_biases_permuted(tmp_path, cli):
    # llama.cpp's qwen2 architecture wants n_head * head_dim == hidden, which a cut breaks; `llama`
    # loads optional q/k/v biases and computes the same attention once Q/K are permuted.
    source = write_checkpoint(tmp_path / "q2.safetensors", UNIFORM, tiny_llama(T.Qwen2ForCausalLM, T.Qwen2Config))
    out = tmp_path / "q2.gguf"
    assert cli("export", source, "--gguf", out).code == 0
    reader = gguf.GGUFReader(out)
    assert fields(reader)["general.architecture"] == "llama"
    state = headprune_cli.load(source).state_dict()
    found = tensors(reader)
    bias = state["model.layers.0.self_attn.k_proj.bias"]
    assert np.array_equal(np.asarray(found["blk.0.attn_k.bias"].data), permute(bias[:, None], 3)[:, 0].numpy())
    assert np.array_equal(
        np.asarray(found["blk.0.attn_v.bias"].data), state["model.layers.0.self_attn.v_proj.bias"].numpy()
    )


def gguf_inv_freq(meta: dict, found: dict, arch: str) -> np.ndarray:
    """The rotary frequencies llama.cpp derives from the file: freq_base^(-2i/d), divided by
    rope_freqs (llama3) and scaled by 1 / factor (linear)."""
    dim = meta[f"{arch}.rope.dimension_count"]
    freqs = meta[f"{arch}.rope.freq_base"] ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)
    if "rope_freqs.weight" in found:
        freqs = freqs / np.asarray(found["rope_freqs.weight"].data, dtype=np.float64)
    if meta.get(f"{arch}.rope.scaling.type") == "linear":
        freqs = freqs / meta[f"{arch}.rope.scaling.factor"]
    return freqs


@pytest.mark.parametrize("kind", sorted(ROPES))
def test_rope_of_each_type_gives_transformers_frequencies(kind, tmp_path, cli):
    params = ROPES[kind]
    model = tiny_llama(rope_parameters=dict(params), rope_theta=params["rope_theta"])
    reference = model.model.rotary_emb.inv_freq.double().numpy()  # transformers' own RoPE for this type
    source = write_checkpoint(tmp_path / "r.safetensors", UNIFORM, model)
    out = tmp_path / "r.gguf"
    assert cli("export", source, "--gguf", out).code == 0
    reader = gguf.GGUFReader(out)
    meta, found = fields(reader), tensors(reader)
    assert ("rope_freqs.weight" in found) == (kind == "llama3")
    assert ("llama.rope.scaling.type" in meta) == (kind == "linear")
    np.testing.assert_allclose(gguf_inv_freq(meta, found, "llama"), reference, rtol=1e-5)


def test_tied_embeddings_are_one_token_embd_tensor(tmp_path, cli):
    source = write_checkpoint(tmp_path / "t.safetensors", UNIFORM, tiny_llama(tie_word_embeddings=True))
    out = tmp_path / "t.gguf"
    assert cli("export", source, "--gguf", out).code == 0
    found = tensors(gguf.GGUFReader(out))
    state = headprune_cli.load(source).state_dict()
    assert "output.weight" not in found  # llama.cpp reuses token_embd for the output
    assert np.array_equal(np.asarray(found["token_embd.weight"].data), state["model.embed_tokens.weight"].numpy())


def test_llama3_rope_reads_each_of_its_settings(tmp_path, cli):
    """ROPES' llama3 case has the factors llama.cpp's converter assumes when a field is absent
    (8, 1, 4); here every field differs from those, so a setting read under the wrong name, or
    not read, gives other frequencies than transformers' own for this config."""
    params = {
        "rope_type": "llama3",
        "rope_theta": 10000.0,
        "factor": 16.0,
        "low_freq_factor": 2.0,
        "high_freq_factor": 8.0,
        "original_max_position_embeddings": 64,  # wavelengths 6.3 kept, 19.9 smoothed, 62.8 on divided
    }
    model = tiny_llama(rope_parameters=dict(params), rope_theta=params["rope_theta"])
    reference = model.model.rotary_emb.inv_freq.double().numpy()
    source = write_checkpoint(tmp_path / "r.safetensors", UNIFORM, model)
    out = tmp_path / "r.gguf"
    assert cli("export", source, "--gguf", out).code == 0
    reader = gguf.GGUFReader(out)
    meta, found = fields(reader), tensors(reader)
    factors = np.asarray(found["rope_freqs.weight"].data)
    assert factors[0] == 1.0 and factors[-1] == 16.0 and 1.0 < factors[1] < 16.0  # all three branches
    np.testing.assert_allclose(gguf_inv_freq(meta, found, "llama"), reference, rtol=1e-5)


def test_rope_scaling_of_an_older_config_is_read_like_rope_parameters():
    """Checkpoints written by transformers 4 state RoPE as `rope_theta` + `rope_scaling` (with
    `type` in the oldest): the same frequencies as v5's `rope_parameters`."""
    v5 = {
        "rope_parameters": {
            "rope_type": "llama3",
            "rope_theta": 500.0,
            "factor": 16.0,
            "low_freq_factor": 2.0,
            "high_freq_factor": 8.0,
            "original_max_position_embeddings": 64,
        }
    }
    scaling = {k: v for k, v in v5["rope_parameters"].items() if k != "rope_theta"}
    older = {"rope_theta": 500.0, "rope_scaling": scaling}
    oldest = {
        "rope_theta": 500.0,
        "rope_scaling": {"type": "llama3", **{k: v for k, v in scaling.items() if k != "rope_type"}},
    }
    want = rope_freqs(v5, 16)
    for config in (older, oldest):
        np.testing.assert_array_equal(rope_freqs(config, 16), want)
    # no base anywhere: transformers' own default base
    unstated = rope_freqs({"rope_scaling": scaling}, 16)
    np.testing.assert_array_equal(
        unstated, rope_freqs({**older, "rope_theta": T.LlamaConfig().rope_parameters["rope_theta"]}, 16)
    )
    assert not np.array_equal(unstated, want)
    assert rope_freqs({"rope_theta": 500.0}, 16) is None  # no scaling: plain RoPE, no factors
    assert rope_freqs({"rope_scaling": {"type": "linear", "factor": 2.0}}, 16) is None


def test_refuses_a_rope_type_it_cannot_state(tmp_path, cli):
    params = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
    model = tiny_llama(rope_parameters=params, rope_theta=10000.0)
    source = write_checkpoint(tmp_path / "d.safetensors", UNIFORM, model)
    result = cli("export", source, "--gguf", tmp_path / "x.gguf")
    assert_refused(result, 1, "--gguf writes RoPE types default, linear, llama3; this model uses 'dynamic'")
    assert not (tmp_path / "x.gguf").exists()


@pytest.mark.parametrize(
    "config",
    [
        {"rope_theta": 500.0},
        {"rope_theta": 500.0, "rope_scaling": {"type": "linear", "factor": 2.0}},
        {"rope_theta": 500.0, "rope_scaling": {"rope_type": "linear", "factor": 2.0}},
        {"rope_parameters": {"rope_type": "linear", "rope_theta": 500.0, "factor": 2.0}},
    ],
    ids=["theta-only", "scaling-type", "scaling-rope-type", "v5"],
)
def test_rope_settings_of_any_config_vintage_are_transformers_own(config):
    """The RoPE settings read from a config equal those transformers standardises it to."""
    assert _rope(config) == T.LlamaConfig(**config).rope_parameters
    _check_rope(config)  # each of these types is written


@pytest.mark.parametrize("kind", ["f16", "bf16", "q8_0"])
def test_tensors_converted_a_few_rows_at_a_time_give_the_bytes_of_whole_tensors(on_grid, tmp_path, monkeypatch, kind):
    """The writer converts each tensor in pieces (to hold one piece, not the float32 copy of
    the whole): pieces of one row and of several give the bytes of one piece per tensor."""
    from headprune_cli.model.formats.gguf import _Converted

    monkeypatch.setattr(_Converted, "CHUNK_BYTES", 1 << 40)  # every tensor in one piece
    whole = headprune_cli.export_gguf(on_grid, tmp_path / "whole.gguf", kind).path.read_bytes()
    for rows_of in (1, 3):
        monkeypatch.setattr(_Converted, "CHUNK_BYTES", rows_of * 4 * 64)  # the on-grid model is 64 wide
        out = tmp_path / f"pieces-{rows_of}.gguf"
        assert headprune_cli.export_gguf(on_grid, out, kind).path.read_bytes() == whole, rows_of
