"""llama.cpp loads headprune's GGUF files and computes headprune's logits (DESIGN invariant 10).

llama.cpp runs through llama-cpp-python in its own environment (scripts/engines/llama_cpp.sh),
in a process where headprune cannot be imported; it tokenizes the text itself, and both its
token ids and its logits at every position are compared with headprune's. The KV cache is kept
in f32 there (llama.cpp's default is f16), so an f32 file must match to float tolerance.

Run: `python -m pytest -m engines tests/engines` (deselected from the default suite; .ci/run runs it).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers as T
from tokenizers import Tokenizer

import headprune_cli
from headprune_cli.model.layout import info_of
from tests.support import run_without_headprune
from tests.support.engines import llama_cpp_python
from tests.support.gguf_models import NON_UNIFORM, NON_UNIFORM_GRID, UNIFORM, tiny_llama, write_checkpoint

pytestmark = pytest.mark.engines

TEXTS = [
    "The package provides a library for parsing configuration files.",
    "numbers 12345 and 3.14, punctuation!? -- (brackets) [x]  two  spaces\nnew line\ttab",
    "Ünïcödé wörds, 日本語 and emoji 🙂 stay byte-level.",
]
# Max |llama.cpp - headprune| over every logit, as a fraction of the largest |logit| headprune
# gives. For f16 and the quantized types headprune runs the very weights the file holds
# (roundtrip below), so what is left is llama.cpp's arithmetic: it rounds activations to f16
# (f16 files) or to q8 blocks (q8_0/q4_0 files) before each product. Measured on these models
# (2026-12-02, llama-cpp-python 0.3.36): f32 7.2e-7, f16 7.3e-4, q8_0 1.75e-2, q4_0 2.26e-2;
# the bounds leave about 2x. (Against headprune's f32 weights instead, the whole quantization
# loss: q8_0 3.9e-2, q4_0 0.46 on these random-weight models.)
BOUNDS = {"f32": 1e-5, "f16": 2e-3, "q8_0": 4e-2, "q4_0": 5e-2}
# k-quants against headprune on the file's own dequantized weights: measured 4.9e-2 (q4_K_M and q6_K,
# 2026-12-04, llama-cpp-python 0.3.36; llama.cpp rounds activations to 8-bit blocks for k-quant products).
K_QUANT_BOUND = 8e-2

ENGINE = """
import json, sys
import numpy as np
from llama_cpp import Llama

path, texts = sys.argv[1], json.loads(sys.argv[2])
GGML_TYPE_F32 = 0
llm = Llama(model_path=path, n_ctx=256, n_batch=256, n_threads=2, logits_all=True,
            type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32, verbose=False)
out = {"arch": llm.metadata["general.architecture"], "runs": []}
for text in texts:
    ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
    llm.reset()
    llm.eval(ids)
    out["runs"].append({"ids": ids, "logits": np.asarray(llm.scores[: len(ids)], dtype=np.float64).tolist()})
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def engine() -> str:
    return llama_cpp_python()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama-cpp")
    return {
        "uniform": write_checkpoint(folder / "uniform.safetensors", UNIFORM),
        "non-uniform": write_checkpoint(folder / "non_uniform.safetensors", NON_UNIFORM),
        "non-uniform-grid": write_checkpoint(folder / "non_uniform_grid.safetensors", NON_UNIFORM_GRID),
        # Qwen2 goes out as `llama` (with its q/k/v biases), Qwen3 as `qwen3` (q/k norms, no permutation).
        "qwen2-uniform": write_checkpoint(
            folder / "qwen2.safetensors", UNIFORM, tiny_llama(T.Qwen2ForCausalLM, T.Qwen2Config)
        ),
        "qwen3-uniform": write_checkpoint(
            folder / "qwen3.safetensors", UNIFORM, tiny_llama(T.Qwen3ForCausalLM, T.Qwen3Config)
        ),
    }


def headprune_logits(checkpoint, kind: str = "f32") -> tuple[list[list[int]], list[np.ndarray]]:
    """headprune's tokens and logits; for a quantized `kind`, with every weight the file holds
    quantized and dequantized the same way (rows are quantized independently, so llama.cpp's
    Q/K row permutation does not change the values), so only llama.cpp's arithmetic differs."""
    model = headprune_cli.load(checkpoint)
    if kind != "f32":
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(roundtrip(p.detach(), kind))
    tokenizer = Tokenizer.from_str(info_of(model).tokenizer)
    ids = [tokenizer.encode(text).ids for text in TEXTS]
    with torch.no_grad():
        logits = [model(torch.tensor([row])).logits[0].double().numpy() for row in ids]
    return ids, logits


def roundtrip(weight: torch.Tensor, kind: str) -> torch.Tensor:
    """`weight` as the GGUF file stores it: 1-D in f32; matrices in `kind`, or f16 when their rows
    are not whole quantization blocks."""
    import gguf

    if weight.dim() == 1:
        return weight
    data = weight.numpy()
    qtype = gguf.GGMLQuantizationType[kind.upper()]
    if kind == "f16" or data.shape[-1] % gguf.GGML_QUANT_SIZES[qtype][0]:
        return torch.from_numpy(data.astype(np.float16).astype(np.float32))
    return torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(data, qtype), qtype).reshape(data.shape))


def llama_cpp_run(engine: str, gguf) -> dict:
    out = run_without_headprune(ENGINE, gguf.parent, str(gguf), json.dumps(TEXTS), python=engine)
    return json.loads(out.strip().splitlines()[-1])


def export(cli, checkpoint, kind: str):
    out = checkpoint.with_name(f"{checkpoint.stem}-{kind}.gguf")
    result = cli("export", checkpoint, "--gguf", out, "--gguf-type", kind, "--force")
    assert result.code == 0, result
    return out


@pytest.mark.parametrize(
    "cut, kind, arch",
    [
        ("uniform", "f32", "llama"),
        ("non-uniform", "f32", "deci"),
        ("uniform", "q8_0", "llama"),
        ("non-uniform", "f16", "deci"),
        ("non-uniform-grid", "q8_0", "deci"),
        ("non-uniform-grid", "q4_0", "deci"),
        ("qwen2-uniform", "f32", "llama"),
        ("qwen3-uniform", "f32", "qwen3"),
    ],
)
def test_llama_cpp_tokenizes_and_computes_as_headprune(engine, checkpoints, cli, cut, kind, arch):
    ids, ours = headprune_logits(checkpoints[cut], kind)
    theirs = llama_cpp_run(engine, export(cli, checkpoints[cut], kind))
    assert theirs["arch"] == arch
    assert [run["ids"] for run in theirs["runs"]] == ids  # llama.cpp's tokenizer = transformers'
    pairs = [(np.asarray(run["logits"]), mine) for run, mine in zip(theirs["runs"], ours)]
    worst = max(np.abs(got - want).max() / np.abs(want).max() for got, want in pairs)
    rms = max(np.linalg.norm(got - want) / np.linalg.norm(want) for got, want in pairs)
    top1 = np.mean(np.concatenate([got.argmax(-1) == want.argmax(-1) for got, want in pairs]))
    print(
        f"{cut} {kind}: max |llama.cpp - headprune| / max |logit| = {worst:.2e}, "
        f"relative RMS {rms:.2e}, top-1 {top1:.3f}"
    )
    assert top1 >= (1.0 if kind == "f32" else 0.9), top1
    assert worst < BOUNDS[kind], worst


@pytest.mark.parametrize("kind", ["f32", "q8_0"])
def test_a_uniform_cut_computes_the_same_as_llama_and_as_deci(engine, checkpoints, tmp_path, kind):
    """Both graphs express a uniform cut; `export --gguf` writes `llama` (as fast as `deci` by
    scripts/benchmarks/gguf_arch.py), and the `deci` file of the same weights loads and computes
    the same logits."""
    runs = {}
    for arch in ("llama", "deci"):
        path = headprune_cli.export_gguf(checkpoints["uniform"], tmp_path / f"{arch}.gguf", kind, arch=arch).path
        runs[arch] = llama_cpp_run(engine, path)
        assert runs[arch]["arch"] == arch
    for ours, theirs in zip(runs["llama"]["runs"], runs["deci"]["runs"]):
        assert ours["ids"] == theirs["ids"]
        np.testing.assert_allclose(theirs["logits"], ours["logits"], rtol=0, atol=1e-5 * np.abs(ours["logits"]).max())


@pytest.fixture(scope="module")
def k_quant_checkpoints(tmp_path_factory):
    """A LLaMA wide enough for k-quant blocks (hidden 256, FFN 512: rows of 256), unpruned and cut
    per layer on the 256-grid (256 FFN neurons out of layer 1; a KV group out would leave 128 values
    of attention output, off the grid, and be refused), as `select
    --runtime llama.cpp --gguf-type q4_K_M` keeps a cut."""
    folder = tmp_path_factory.mktemp("k-quants")
    shape = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2, head_dim=64)
    return {
        "unpruned": write_checkpoint(folder / "wide.safetensors", model=tiny_llama(num_hidden_layers=2, **shape)),
        "cut": write_checkpoint(
            folder / "wide-cut.safetensors",
            ({}, [], {1: list(range(0, 512, 2))}),
            tiny_llama(num_hidden_layers=2, **shape),
        ),
    }


def weights_of_file(checkpoint, path):
    """The checkpoint's model with every weight replaced by what the GGUF file at `path` holds
    (gguf-py dequantizes the k-quants it cannot write), Q/K rows back in transformers' order."""
    import gguf

    model = headprune_cli.load(checkpoint)
    reader = gguf.GGUFReader(path)
    arch = {"llama": gguf.MODEL_ARCH.LLAMA, "deci": gguf.MODEL_ARCH.DECI}[
        reader.fields["general.architecture"].contents()
    ]
    layers = info_of(model).layout
    names = gguf.get_tensor_name_map(arch, len(layers.layers))
    found = {t.name: t for t in reader.tensors}
    with torch.no_grad():
        for name, p in model.named_parameters():
            t = found[names.get_name(name, try_suffixes=(".weight", ".bias"))]
            data = gguf.quants.dequantize(t.data, t.tensor_type).reshape(p.shape)
            kind = t.name.split(".")[2] if t.name.startswith("blk.") else ""
            if kind in ("attn_q", "attn_k"):  # undo the writer's rotary interleave
                pos = int(t.name.split(".")[1])
                heads = len((layers.heads if kind == "attn_q" else layers.kv_heads)[pos])
                rows = data.shape[0]
                data = data.reshape(heads, rows // heads // 2, 2, -1).swapaxes(1, 2).reshape(data.shape)
            p.copy_(torch.from_numpy(np.ascontiguousarray(data)))
    return model


@pytest.mark.parametrize("kind", ["q4_K_M", "q6_K"])
@pytest.mark.parametrize("cut", ["unpruned", "cut"])
def test_k_quants_are_llama_cpps_own_and_compute_the_checkpoint(
    engine, k_quant_checkpoints, cli, monkeypatch, cut, kind
):
    """`export --gguf-type q4_K_M|q6_K` quantizes with llama.cpp's quantizer (its file type and its
    per-tensor mix), and llama.cpp computes what headprune computes on the same weights (gguf-py
    cannot write k-quants, only read them, so
    the file's dequantized weights run in headprune: what is left is llama.cpp's arithmetic, which
    rounds activations to 8-bit blocks for k-quant products)."""
    import gguf

    monkeypatch.setenv("HEADPRUNE_LLAMA_CPP_ENV", str(Path(engine).parent.parent))
    path = export(cli, k_quant_checkpoints[cut], kind)
    reader = gguf.GGUFReader(path)
    assert reader.fields["general.file_type"].contents() == int(gguf.LlamaFileType[f"MOSTLY_{kind.upper()}"])
    matrices = {t.tensor_type.name for t in reader.tensors if len(t.shape) > 1}
    assert matrices <= {"Q4_K", "Q5_K", "Q6_K"} and ("Q4_K" in matrices) == (kind == "q4_K_M"), matrices
    theirs = llama_cpp_run(engine, path)
    assert theirs["arch"] == ("llama" if cut == "unpruned" else "deci")
    model = weights_of_file(k_quant_checkpoints[cut], path)  # headprune running the file's own weights
    tokenizer = Tokenizer.from_str(info_of(model).tokenizer)
    with torch.no_grad():
        ours = [model(torch.tensor([tokenizer.encode(text).ids])).logits[0].double().numpy() for text in TEXTS]
    pairs = [(np.asarray(run["logits"]), mine) for run, mine in zip(theirs["runs"], ours)]
    worst = max(np.abs(got - want).max() / np.abs(want).max() for got, want in pairs)
    top1 = np.mean(np.concatenate([got.argmax(-1) == want.argmax(-1) for got, want in pairs]))
    print(
        f"{cut} {kind}: max |llama.cpp - headprune on the file's weights| / max |logit| = {worst:.2e}, top-1 {top1:.3f}"
    )
    assert worst < K_QUANT_BOUND and top1 >= 0.9, (worst, top1)


def test_a_k_quant_takes_the_embedding_type_through_llama_cpps_quantizer(
    engine, k_quant_checkpoints, cli, monkeypatch, tmp_path
):
    """--gguf-embedding-type reaches llama.cpp's quantizer as llama-quantize's --token-embedding-type
    and --output-tensor-type: without it the mix gives the embedding a k-quant; with it, q8_0."""
    import gguf

    monkeypatch.setenv("HEADPRUNE_LLAMA_CPP_ENV", str(Path(engine).parent.parent))
    plain = export(cli, k_quant_checkpoints["cut"], "q4_K_M")
    out = tmp_path / "embedding-q8.gguf"
    result = cli(
        "export", k_quant_checkpoints["cut"], "--gguf", out, "--gguf-type", "q4_K_M", "--gguf-embedding-type", "q8_0"
    )
    assert result.code == 0, result

    def types(path):
        return {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}

    before, after = types(plain), types(out)
    assert before["token_embd.weight"] != "Q8_0" and before["output.weight"] != "Q8_0"
    assert after["token_embd.weight"] == after["output.weight"] == "Q8_0"
    assert {k: v for k, v in after.items() if "blk." in k} == {k: v for k, v in before.items() if "blk." in k}


@pytest.mark.parametrize("rounding", ["nearest", "gptq"])
def test_an_importance_weighted_q4_0_file_computes_its_own_weights(engine, checkpoints, cli, tmp_path, rounding):
    """`--gguf-type q4_0 --calib-data` (either rounding): llama.cpp reads headprune's own weighted
    blocks as the plain q4_0 they are, and computes what headprune computes on the file's weights."""
    calib = tmp_path / "calib.txt"
    calib.write_text("\n".join(TEXTS * 4) + "\n", encoding="utf-8")
    path = tmp_path / "weighed.gguf"
    weighed = ("--gguf-type", "q4_0", "--calib-data", calib, "--gguf-rounding", rounding)
    result = cli("export", checkpoints["non-uniform-grid"], "--gguf", path, *weighed)
    said = "rounded by GPTQ on" if rounding == "gptq" else "weighted by"
    assert result.code == 0 and said in result.err, result
    theirs = llama_cpp_run(engine, path)
    model = weights_of_file(checkpoints["non-uniform-grid"], path)
    tokenizer = Tokenizer.from_str(info_of(model).tokenizer)
    with torch.no_grad():
        ours = [model(torch.tensor([tokenizer.encode(text).ids])).logits[0].double().numpy() for text in TEXTS]
    pairs = [(np.asarray(run["logits"]), mine) for run, mine in zip(theirs["runs"], ours)]
    worst = max(np.abs(got - want).max() / np.abs(want).max() for got, want in pairs)
    assert [run["ids"] for run in theirs["runs"]] == [tokenizer.encode(text).ids for text in TEXTS]
    assert worst < BOUNDS["q4_0"], worst
