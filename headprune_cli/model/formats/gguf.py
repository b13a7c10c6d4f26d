"""Deployment to llama.cpp: a LLaMA-family causal LM as one GGUF file (`export --gguf FILE`).

Which llama.cpp architecture (what its src/llama-model.cpp and src/models/*.cpp load):
- `llama` for a uniform layout (every kept layer with the same query heads, KV heads and FFN
  width): LLaMA, Mistral, and Qwen2 (whose q/k/v biases `llama` loads as optional tensors;
  llama.cpp's own `qwen2` architecture insists on n_head * head_dim == hidden, which a pruned
  model breaks). `qwen3` for uniform Qwen3 (q/k norms).
- `deci` otherwise: it reads `head_count`, `head_count_kv` and `feed_forward_length` as one
  value per layer. Qwen3 has no per-layer architecture (deci has no q/k norms) and is refused.
Q and K rows are permuted as llama.cpp's converter does for `llama`/`deci` (LlamaModel.permute):
those architectures rotate adjacent pairs, transformers rotates the two halves of each head.
Removed layers are simply absent (block_count counts the kept ones).

A uniform cut is expressible in both `llama` and `deci`. On the same weights the two decode and
prefill equally fast (within 3%, the noise: scripts/benchmarks/gguf_arch.py, BENCHMARKS.md
"Which engine"), so speed does not decide; `llama` is chosen, the graph every llama.cpp tool
and version reads. `arch=` forces either where both can express the layout.

Weights stream from the checkpoint one tensor at a time into a file written beside the output
and renamed over it (fileio.atomic_write), so memory stays at about one tensor. The k-quants
(gguf_grid.LLAMA_CPP_TYPES) are llama.cpp's own: the file is first written at the checkpoint's
precision beside the output, then quantized by llama.cpp's quantizer in its engine environment.
A cut whose pruned widths are off the type's quantization grid is refused (gguf_grid).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from headprune_cli.errors import ArchitectureError, PlanError, UsageError
from headprune_cli.files.io import atomic_write
from headprune_cli.files.temps import make_temp
from headprune_cli.model import llama_cpp_env
from headprune_cli.model.formats.gguf_grid import (
    LLAMA_CPP_TYPES,
    WEIGHTED_TYPES,
    check_embedding_type,
    check_gguf_type,
    check_on_grid,
)
from headprune_cli.model.formats.gguf_vocab import GgufVocab, gguf_vocab
from headprune_cli.model.layout import ModelInfo, info_of
from headprune_cli.model.tensorfile import Spec

EMBEDDING_TENSORS = ("token_embd.weight", "output.weight")  # --gguf-embedding-type applies to these
FAMILIES = ("llama", "mistral", "qwen2", "qwen3")  # model_type values --gguf writes
ARCHES = ("auto", "llama", "deci")  # `arch=` of gguf_plan / export_gguf: auto picks by the rule above
_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass
class GgufPlan:
    arch: str  # llama | deci | qwen3
    n_head: list[int]  # per kept layer
    n_head_kv: list[int]
    n_ff: list[int]
    head_dim: int

    @property
    def uniform(self) -> bool:
        return len({*zip(self.n_head, self.n_head_kv, self.n_ff)}) <= 1


@dataclass
class GgufExport:
    path: Path
    arch: str
    gguf_type: str
    tensors: int
    embedding_type: str | None = None  # the token embedding's / output head's own type, if one was given
    # matrices kept in f16: rows the unpruned model already had off the quantization block
    fallback: list[str] = field(default_factory=list)


def gguf_plan(info: ModelInfo, arch: str = "auto") -> GgufPlan:
    """The llama.cpp architecture and per-layer shapes of a checkpoint, or a one-line refusal.
    `arch` auto: `llama` for a uniform layout (as fast as `deci`, and read everywhere), `deci` otherwise."""
    model_type = info.config.get("model_type")
    if info.family != "llama" or model_type not in FAMILIES or info.task != "causal-lm":
        what = f"{model_type or info.family} {info.task}"
        raise ArchitectureError(
            f"--gguf writes LLaMA-family causal LMs ({', '.join(FAMILIES)}) for llama.cpp; this checkpoint is a {what}"
        )
    layout = info.layout
    head_dim = info.config.get("head_dim") or info.config["hidden_size"] // info.config["num_attention_heads"]
    plan = GgufPlan(
        arch="llama",
        n_head=[len(h) for h in layout.heads],
        n_head_kv=[len(h) for h in layout.kv_heads],
        n_ff=[
            layout.ffn_width(layer) if layout.num_ffn else info.config["intermediate_size"] for layer in layout.layers
        ],
        head_dim=head_dim,
    )
    for pos, layer in enumerate(layout.layers):
        if plan.n_head[pos] % plan.n_head_kv[pos]:
            raise PlanError(
                f"layer {layer} keeps {plan.n_head[pos]} query heads over {plan.n_head_kv[pos]} KV heads; "
                "llama.cpp needs a whole number of query heads per KV head"
            )
    if model_type == "qwen3":
        if not plan.uniform:
            pos = _first_different(plan)
            raise PlanError(
                f"layer {layout.layers[pos]} keeps {_shape(plan, pos)} where layer {layout.layers[0]} keeps "
                f"{_shape(plan, 0)}: llama.cpp's qwen3 architecture has one shape for every layer and its per-layer "
                "architecture (deci) has no q/k norms; export a --uniform plan"
            )
        plan.arch = "qwen3"
    elif not plan.uniform:
        plan.arch = "deci"
    _check_rope(info.config)
    if arch != "auto":
        _force_arch(plan, arch, model_type, layout.layers)
    return plan


def _force_arch(plan: GgufPlan, arch: str, model_type: str, layers: list[int]) -> None:
    """`arch` instead of the rule's choice, where llama.cpp's `arch` can express the layout."""
    if arch not in ARCHES:
        raise UsageError(f"llama.cpp architecture {arch!r}: choose one of {', '.join(ARCHES)}")
    if model_type == "qwen3":
        raise PlanError(f"a Qwen3 model is written as llama.cpp's qwen3 architecture only, not {arch}")
    if arch == "llama" and not plan.uniform:
        pos = _first_different(plan)
        raise PlanError(
            f"layer {layers[pos]} keeps {_shape(plan, pos)} where layer {layers[0]} keeps {_shape(plan, 0)}: "
            "llama.cpp's llama architecture has one shape for every layer; write it as deci"
        )
    plan.arch = arch


def _first_different(plan: GgufPlan) -> int:
    first = _shape(plan, 0)
    return next(i for i in range(len(plan.n_head)) if _shape(plan, i) != first)


def _shape(plan: GgufPlan, pos: int) -> str:
    return f"{plan.n_head[pos]} query / {plan.n_head_kv[pos]} KV heads and FFN width {plan.n_ff[pos]}"


def _rope(config: dict) -> dict:
    """RoPE settings from a v5 `rope_parameters` or an older `rope_theta` + `rope_scaling`."""
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    params.setdefault("rope_theta", config.get("rope_theta", 10000.0))
    params["rope_type"] = params.get("rope_type") or params.get("type") or "default"
    return params


def _check_rope(config: dict) -> None:
    kind = _rope(config)["rope_type"]
    if kind not in _ROPE_TYPES:
        raise ArchitectureError(f"--gguf writes RoPE types {', '.join(_ROPE_TYPES)}; this model uses {kind!r}")


# --- writing ------------------------------------------------------------------------------
@dataclass
class _Tensor:
    name: str  # GGUF name
    shape: tuple[int, ...]  # as torch has it: (rows, columns)
    produce: Callable[[], torch.Tensor]
    ggml: str  # the ggml type written: f32, f16, bf16 or a quantized type
    importance: torch.Tensor | None = None  # per column: the blocks' scales weigh it (gguf_imatrix)
    quantized: np.ndarray | None = None  # its q4_0 bytes, rounded already (gguf_gptq), rows as torch has them


def export_gguf(
    model,
    specs: list[Spec],
    out: str | os.PathLike,
    gguf_type: str = "auto",
    engine: Path | None = None,
    arch: str = "auto",
    embedding_type: str | None = None,
    importance: dict[str, torch.Tensor] | None = None,
    quantized: dict[str, np.ndarray] | None = None,
) -> GgufExport:
    """Write the (meta) `model` whose tensors `specs` produce as a GGUF file at `out`, atomically.
    The caller has checked `out` (outputs.check_output), and for a k-quant found llama.cpp's
    `engine` python. Tensor infos come from the shapes, so the header is written first and then
    each tensor is read, converted and written in turn. `embedding_type`: the token embedding and
    output head in that type instead of `gguf_type`. `importance` (weight name -> per-column mean
    square input, gguf_imatrix.collect_importance): the q4_0 blocks of those matrices weigh it.
    `quantized` (weight name -> q4_0 bytes, gguf_gptq.gptq_model): written as they are."""
    info = info_of(model)
    plan = gguf_plan(info, arch)
    check_gguf_type(gguf_type)
    check_embedding_type(embedding_type)
    if gguf_type != "auto":
        check_on_grid(info.layout.layers, plan.n_head, plan.n_ff, plan.head_dim, info.config, gguf_type)
    vocab = gguf_vocab(info.tokenizer, info.tokenizer_config, info.config["vocab_size"])
    own = {torch.float16: "f16", torch.bfloat16: "bf16"}.get(specs[0].dtype, "f32")  # the checkpoint's: lossless
    if gguf_type == "auto":
        gguf_type = own
    written = own if gguf_type in LLAMA_CPP_TYPES else gguf_type
    # A k-quant's source file is lossless: llama.cpp's quantizer then gives the embedding its type.
    own_embedding = None if gguf_type in LLAMA_CPP_TYPES else embedding_type
    tensors = _tensors(specs, plan, info, written, own_embedding, importance or {}, quantized or {})
    fallback = [
        t.name
        for t in tensors
        if t.ggml == "f16"
        and written not in ("f16", "f32", "bf16")
        and not (embedding_type and t.name in EMBEDDING_TENSORS)
    ]

    def write(tmp: str) -> None:
        _write_file(tmp, tensors, info, plan, vocab, written)

    def write_and_quantize(tmp: str) -> None:
        source, lock = make_temp(Path(out))  # the checkpoint's precision, beside the output
        try:
            write(source)
            if engine is None:
                raise UsageError(f"--gguf-type {gguf_type} is quantized by llama.cpp: its engine python is needed")
            llama_cpp_env.quantize(engine, source, tmp, gguf_type, embedding_type=embedding_type)
        finally:
            Path(source).unlink(missing_ok=True)
            os.close(lock)

    atomic_write(out, write_and_quantize if gguf_type in LLAMA_CPP_TYPES else write)
    return GgufExport(Path(out), plan.arch, gguf_type, len(tensors), embedding_type, fallback)


def _write_file(tmp: str, tensors: list[_Tensor], info: ModelInfo, plan: GgufPlan, vocab: GgufVocab, kind: str) -> None:
    import gguf  # noqa: PLC0415 (keeps gguf out of this module's import)

    writer = gguf.GGUFWriter(tmp, plan.arch)
    _write_metadata(writer, info, plan, vocab, kind)
    for t in tensors:
        qtype = gguf.GGMLQuantizationType[t.ggml.upper()]
        nbytes = math.prod(gguf.quants.quant_shape_to_byte_shape(t.shape, qtype))
        writer.add_tensor_info(t.name, t.shape, np.dtype(np.float32), nbytes, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in tensors:
        # _Converted duck-types the ndarray API write_tensor_data uses (nbytes, tofile).
        writer.write_tensor_data(_Converted(t, plan))  # type: ignore[arg-type]
    writer.close()


def _tensors(
    specs: list[Spec],
    plan: GgufPlan,
    info: ModelInfo,
    gguf_type: str,
    embedding_type: str | None,
    importance: dict[str, torch.Tensor],
    quantized: dict[str, np.ndarray],
) -> list[_Tensor]:
    """Every tensor in llama.cpp's order (embeddings, blocks, final norm, output), with its type,
    and for a weighted type the importance of its columns or its bytes rounded already where
    `importance` or `quantized` has them (a tied embedding is written from `lm_head.weight`, so
    it is weighed by the head's input; an untied one is a row lookup, with no input to weigh)."""
    import gguf  # noqa: PLC0415 (keeps gguf out of this module's import)

    arch = {"llama": gguf.MODEL_ARCH.LLAMA, "deci": gguf.MODEL_ARCH.DECI, "qwen3": gguf.MODEL_ARCH.QWEN3}[plan.arch]
    mapping = gguf.get_tensor_name_map(arch, len(plan.n_head))
    tied = bool(info.config.get("tie_word_embeddings"))
    named: dict[str, _Tensor] = {}
    for spec in specs:
        name = mapping.get_name(spec.name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ArchitectureError(f"tensor {spec.name} has no place in llama.cpp's {plan.arch} architecture")
        if tied and name == "output.weight":  # one tensor serves both; llama.cpp duplicates token_embd
            name = "token_embd.weight"
        kind = _ggml_type(spec.shape, embedding_type if embedding_type and name in EMBEDDING_TENSORS else gguf_type)
        weighed = kind in WEIGHTED_TYPES
        named[name] = _Tensor(
            name,
            tuple(spec.shape),
            spec.produce,
            kind,
            importance.get(spec.name) if weighed else None,
            quantized.get(spec.name) if weighed else None,
        )
    factors = rope_freqs(info.config, plan.head_dim)
    if factors is not None:  # llama3 RoPE: one tensor of frequency factors, as llama.cpp's converter adds
        named["rope_freqs.weight"] = _Tensor(
            "rope_freqs.weight", factors.shape, lambda: torch.from_numpy(factors), "f32"
        )
    return sorted(named.values(), key=lambda t: _order(t.name))


def _ggml_type(shape, gguf_type: str) -> str:
    """1-D tensors stay f32 (llama.cpp's converter does the same); a quantized matrix whose rows
    are not a whole number of blocks falls back to f16 (only widths the unpruned model already
    had off the grid get here: export_gguf refuses a cut that moved one off it)."""
    import gguf  # noqa: PLC0415 (keeps gguf out of this module's import)

    if len(shape) == 1:
        return "f32"
    if gguf_type in ("f32", "f16", "bf16"):
        return gguf_type
    block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[gguf_type.upper()]][0]
    return gguf_type if shape[-1] % block == 0 else "f16"


def _order(name: str) -> tuple:
    if name.startswith("blk."):
        return (1, int(name.split(".")[1]), name)
    return (
        {"token_embd.weight": 0, "rope_freqs.weight": 0, "output_norm.weight": 2, "output.weight": 3}.get(name, 4),
        0,
        name,
    )


class _Converted:
    """A tensor converted to its ggml type a few rows at a time as it is written: what
    GGUFWriter.write_tensor_data reads of an array (nbytes, tofile). Whole, the float32
    copy of a 32 k x 2048 embedding and its converted copy (393 MB at f16) came on top of
    the source; in pieces of CHUNK_BYTES, only the source (mapped) and one piece are held.
    Every ggml type converts rows independently (quantization blocks run along a row), so
    the bytes are those of the whole tensor converted at once."""

    CHUNK_BYTES = 16 << 20  # of float32 rows

    def __init__(self, t: _Tensor, plan: GgufPlan):
        import gguf  # noqa: PLC0415 (keeps gguf out of this module's import)

        self.t, self.plan = t, plan
        self.qtype = gguf.GGMLQuantizationType[t.ggml.upper()]
        self.nbytes = math.prod(gguf.quants.quant_shape_to_byte_shape(t.shape, self.qtype))

    def pieces(self):
        """The converted rows, in order, CHUNK_BYTES of float32 at a time."""
        if self.t.quantized is not None:  # the rows' bytes are made: only Q/K's row order is llama.cpp's
            yield _permuted(torch.from_numpy(self.t.quantized), self.t.name, self.plan).numpy()
            return
        source = _permuted(self.t.produce().detach(), self.t.name, self.plan)
        rows = source.reshape(-1, source.shape[-1]) if source.dim() > 1 else source.reshape(1, -1)
        step = max(1, self.CHUNK_BYTES // (4 * rows.shape[1]))
        for start in range(0, rows.shape[0], step):
            yield _converted_rows(rows[start : start + step], self.t.ggml, self.qtype, self.t.importance)

    def tofile(self, handle) -> None:
        written = 0
        for piece in self.pieces():
            piece.tofile(handle)
            written += piece.nbytes
        assert written == self.nbytes, f"{self.t.name}: {written} bytes converted, {self.nbytes} announced"


def _converted_rows(rows: torch.Tensor, ggml: str, qtype, importance: torch.Tensor | None = None) -> np.ndarray:
    import gguf  # noqa: PLC0415 (keeps gguf out of this module's import)

    if importance is not None:
        from headprune_cli.model.formats.gguf_imatrix import quantize_q4_0  # noqa: PLC0415 (keeps the quantizer out of this module's import)

        return quantize_q4_0(rows, importance)
    data = rows.to(torch.float32).contiguous().numpy()
    if ggml == "f32":
        return data
    if ggml == "f16":
        return data.astype(np.float16)
    return gguf.quants.quantize(data, qtype)


def _permuted(tensor: torch.Tensor, name: str, plan: GgufPlan) -> torch.Tensor:
    """Q/K rows in the interleaved rotary order `llama`/`deci` expect (llama.cpp's LlamaModel.permute)."""
    if plan.arch == "qwen3" or not name.startswith("blk."):
        return tensor
    kind = name.split(".")[2]
    if kind not in ("attn_q", "attn_k"):
        return tensor
    pos = int(name.split(".")[1])
    heads = plan.n_head[pos] if kind == "attn_q" else plan.n_head_kv[pos]
    rows = tensor.shape[0]
    return tensor.reshape(heads, 2, rows // heads // 2, *tensor.shape[1:]).swapaxes(1, 2).reshape(tensor.shape)


def _write_metadata(writer, info: ModelInfo, plan: GgufPlan, vocab: GgufVocab, gguf_type: str) -> None:
    import gguf  # noqa: PLC0415 (keeps gguf out of this module's import)

    config = info.config
    writer.add_name(config.get("_name_or_path") or f"headprune {config.get('model_type')}")
    writer.add_file_type(_file_type(gguf_type))
    if gguf_type.startswith("q"):
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_context_length(config.get("max_position_embeddings", 2048))
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(len(plan.n_head))
    one = plan.uniform and plan.arch != "deci"
    writer.add_feed_forward_length(plan.n_ff[0] if one else plan.n_ff)
    writer.add_head_count(plan.n_head[0] if one else plan.n_head)
    writer.add_head_count_kv(plan.n_head_kv[0] if one else plan.n_head_kv)
    # Explicit, because llama.cpp otherwise derives head size as hidden / heads of layer 0.
    writer.add_key_length(plan.head_dim)
    writer.add_value_length(plan.head_dim)
    writer.add_rope_dimension_count(plan.head_dim)
    rope = _rope(config)
    writer.add_rope_freq_base(float(rope["rope_theta"]))
    if rope["rope_type"] == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(rope["factor"]))
    writer.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-6)))
    writer.add_vocab_size(config["vocab_size"])
    _write_vocab(writer, vocab)


def _file_type(gguf_type: str) -> int:
    import gguf  # noqa: PLC0415 (keeps gguf out of this module's import)

    names = {"f32": "ALL_F32", "f16": "MOSTLY_F16", "bf16": "MOSTLY_BF16"}
    return int(gguf.LlamaFileType[names.get(gguf_type, "MOSTLY_" + gguf_type.upper())])


def _write_vocab(writer, vocab: GgufVocab) -> None:
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.token_types)
    writer.add_token_merges(vocab.merges)
    for kind, token in vocab.special.items():
        getattr(writer, f"add_{kind}_token_id")(token)
    writer.add_add_bos_token(vocab.add_bos)
    writer.add_add_eos_token(vocab.add_eos)


def rope_freqs(config: dict, head_dim: int) -> np.ndarray | None:
    """llama3 RoPE: the per-frequency factors llama.cpp reads from `rope_freqs.weight`
    (llama.cpp's DeciModel/LlamaModel.generate_extra_tensors)."""
    rope = _rope(config)
    if rope["rope_type"] != "llama3":
        return None
    # All four are required: transformers refuses a llama3 config without any of them.
    base = float(rope["rope_theta"])
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / low, old / high
    factors = []
    for freq in 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim)):
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(factors, dtype=np.float32)
