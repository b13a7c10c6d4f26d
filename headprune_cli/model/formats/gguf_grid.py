"""GGUF weight types and their quantization grid: which widths a cut must keep so that no
matrix of the exported file falls back to a wider type.

ggml quantizes every row of a weight matrix in blocks laid along the row, i.e. along the
matrix's input dimension (torch's `shape[-1]`): 32 values a block for q8_0, q5_*, q4_0/q4_1,
256 for the k-quants. A row that is not a whole number of blocks cannot take the type, and the
matrix is written in a wider one instead (f16 by headprune's writer, q5_0/q8_0 by llama.cpp's
quantizer): the cut file is then larger, and slower to decode, than the unpruned one at the
same type. Pruning changes two such inputs: the down projection's (the layer's FFN width) and
the output projection's (its query heads x head_dim). `select --runtime llama.cpp --gguf-type
T` keeps FFN widths on T's grid, and `export --gguf` refuses a cut whose pruned widths left it
(a width the unpruned model already had off the grid is the model's, not the cut's, and passes).

No torch here: `select` reads these tables.
"""

from __future__ import annotations

import math

from headprune_cli.errors import PlanError, UsageError

# Written by headprune's own writer (gguf-py's numpy quantizers): type -> values per block.
NUMPY_TYPES = {"f32": 1, "f16": 1, "bf16": 1, "q8_0": 32, "q5_1": 32, "q5_0": 32, "q4_1": 32, "q4_0": 32}
# Quantized by llama.cpp's own quantizer (llama_model_quantize, what llama-quantize runs) from a
# file headprune writes at the checkpoint's precision: the k-quants users ship. gguf-py cannot
# quantize these (NotImplementedError), and llama.cpp's mixes (_M) choose per tensor anyway.
LLAMA_CPP_TYPES = {"q6_K": 256, "q5_K_M": 256, "q4_K_M": 256}
GGUF_TYPES = (*NUMPY_TYPES, *LLAMA_CPP_TYPES)
# The types whose blocks `export --calib-data` weighs by each column's importance (gguf_imatrix).
WEIGHTED_TYPES = ("q4_0",)


def check_gguf_type(name: str) -> str:
    if name not in GGUF_TYPES and name != "auto":
        raise UsageError(f"unknown --gguf-type {name!r}; supported: auto, {', '.join(GGUF_TYPES)}")
    return name


# --gguf-embedding-type: the token embedding (and the output head, which a tied model shares with it)
# in its own type, as llama-quantize's --token-embedding-type/--output-tensor-type do. Its rows are
# the hidden size, which pruning never changes, and a few bits more on the one matrix every token
# reads twice buy much of the perplexity a low-bit type loses.
EMBEDDING_TYPES = tuple(NUMPY_TYPES)


def check_embedding_type(name: str | None) -> str | None:
    if name is not None and name not in EMBEDDING_TYPES:
        raise UsageError(f"unknown --gguf-embedding-type {name!r}; supported: {', '.join(EMBEDDING_TYPES)}")
    return name


def block_of(gguf_type: str) -> int:
    """Values a block of `gguf_type` holds (1: not a block type)."""
    return {**NUMPY_TYPES, **LLAMA_CPP_TYPES}.get(check_gguf_type(gguf_type), 1)


def grid_ffn_multiple(ffn_multiple_of: int, gguf_type: str | None) -> int:
    """The FFN-width multiple a plan for `gguf_type` keeps: the user's, on the type's blocks."""
    return ffn_multiple_of if gguf_type is None else math.lcm(ffn_multiple_of, block_of(gguf_type))


def off_grid(
    layers: list[int], n_head: list[int], n_ff: list[int], head_dim: int, config: dict, gguf_type: str
) -> list[str]:
    """The widths of a cut (per kept layer) that the cut moved off `gguf_type`'s grid: for each,
    what it is and what keeps it on the grid."""
    block = block_of(gguf_type)
    if block == 1:
        return []
    full_ff, full_heads = config.get("intermediate_size", 0), config.get("num_attention_heads", 0)
    heads_step = block // math.gcd(block, head_dim)
    found = []
    for layer, heads, width in zip(layers, n_head, n_ff):
        if full_ff % block == 0 and width % block:
            found.append(
                f"layer {layer}'s FFN width {width} is not a multiple of {block} ({gguf_type}'s block): "
                f"select with --runtime llama.cpp --gguf-type {gguf_type}"
            )
        if (full_heads * head_dim) % block == 0 and (heads * head_dim) % block:
            found.append(
                f"layer {layer} keeps {heads} query heads of {head_dim} ({heads * head_dim} values, not a multiple of "
                f"{block}): select with --multiple-of {heads_step}"
            )
    return found


def check_on_grid(
    layers: list[int], n_head: list[int], n_ff: list[int], head_dim: int, config: dict, gguf_type: str
) -> None:
    found = off_grid(layers, n_head, n_ff, head_dim, config, gguf_type)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise PlanError(
            f"--gguf-type {gguf_type}: {found[0]}{more}; off the grid the matrix stays in a wider type and the cut "
            "runs slower than the unpruned model"
        )
