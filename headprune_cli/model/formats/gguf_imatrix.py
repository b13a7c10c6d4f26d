"""Importance-weighted GGUF quantization (`export --gguf F --gguf-type q4_0 --calib-data TEXT`).

What llama.cpp's `llama-imatrix` + `llama-quantize --imatrix` do, for the types whose blocks
headprune writes itself: each matrix's importance is the mean square of its input, column by
column, over calibration tokens (`collect_importance`), and each block of 32 weights takes the
scale that minimises the importance-weighted squared error instead of the scale that maps its
largest weight exactly (`quantize_q4_0`: ggml-quants.c's quantize_row_q4_0_impl and
make_qx_quants, written here in torch over many blocks at once). A column the calibration text
leans on is then rounded more faithfully, at no cost in file size or decode speed: the blocks
have the same bytes, only the scales and rounding change.

The token embedding is a row lookup, not a product, so it has no input to weigh: it is weighed
only where it also serves as the tied output head (the head's input is then its importance).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from headprune_cli.model.formats.layer_inputs import input_means

BLOCK = 32  # weights per q4_0 block
PIECE_BYTES = 1 << 20  # float32 rows quantized at once
LEVELS = 8  # q4_0 stores l + 8 for l in [-8, 7]
# Scales tried (make_qx_quants): -LEVELS / max, then -(LEVELS + 0.1 s) / max for s = -9..9, s != 0,
# each factor in float32 arithmetic as ggml computes it (a 0-dim tensor, so that rounding at a
# candidate's factor and again at the factor kept give the same levels).
_TENTH = torch.tensor(0.1, dtype=torch.float32)
_FACTORS = [torch.tensor(-float(LEVELS))] + [-(LEVELS + _TENTH * s) for s in range(-9, 10) if s != 0]


def collect_importance(model: nn.Module, batches) -> dict[str, torch.Tensor]:
    """Weight name -> mean over real calibration tokens of each input column's square, for every
    nn.Linear of `model` (what llama-imatrix accumulates), from one forward per batch."""
    linears = {f"{name}.weight": m for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    return input_means(model, batches, linears, lambda rows: (rows * rows).sum(0))


def quantize_q4_0(rows: torch.Tensor, importance: torch.Tensor) -> np.ndarray:
    """`rows` [n, k] (k a multiple of 32) as q4_0 blocks (18 bytes each: an f16 scale, then 16 bytes
    of 4-bit values, low nibbles the block's first 16), each block's scale chosen to minimise
    sum_j w_j (x_j - d l_j)^2 with w_j = importance_j * sqrt(sigma^2 + x_j^2) (sigma^2: the
    row's mean square), as llama.cpp weighs an imatrix. Rows are independent, so they are done
    PIECE_BYTES at a time: the ~20 temporaries per candidate then stay in cache and in the heap
    (16 MB pieces spent as long in page faults as in arithmetic, and ran 2.5x slower)."""
    step = max(1, PIECE_BYTES // (4 * rows.shape[1]))
    return np.concatenate([_quantize(rows[start : start + step], importance) for start in range(0, len(rows), step)])


def _quantize(rows: torch.Tensor, importance: torch.Tensor) -> np.ndarray:
    x = rows.to(torch.float32).reshape(rows.shape[0], -1, BLOCK)
    largest, scale, factor = _search(x, importance, (x * x).mean(dim=(1, 2), keepdim=True))
    zero = largest == 0  # an all-zero block: scale 0, every value stored as level 0 (the ggml convention)
    safe = torch.where(zero, torch.ones_like(largest), largest)
    codes = torch.where(zero, 0.0, _levels(x, safe, factor) + LEVELS).to(torch.uint8)
    return pack_q4_0(torch.where(zero, 0.0, scale), codes)


def weighted_scales(x: torch.Tensor, importance: torch.Tensor, sigma2: torch.Tensor) -> torch.Tensor:
    """The scale `quantize_q4_0` stores for each block of `x` [n, blocks, 32] (float32, before the
    f16 rounding; 0 for an all-zero block), as [n, blocks, 1], for rows whose mean squares are
    `sigma2` [n, 1, 1] (a caller holding only some of a row's blocks passes the whole row's)."""
    largest, scale, _factor = _search(x.to(torch.float32), importance, sigma2)
    return torch.where(largest == 0, 0.0, scale)


def _search(
    x: torch.Tensor, importance: torch.Tensor, sigma2: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For blocks `x` [n, blocks, 32] of rows whose mean squares are `sigma2`: each block's signed
    largest value, and of the candidate factors the best scale and the factor whose rounding
    gave it."""
    # A column the text never reached (importance 0) would zero a whole block's weights and so
    # its scale; a floor far below any used column keeps the fit defined there.
    imp = importance.to(torch.float32).clamp_min(float(importance.mean()) * 1e-6 + 1e-30)
    weight = imp.reshape(1, -1, BLOCK) * torch.sqrt(sigma2 + x * x)
    largest = x.gather(2, x.abs().argmax(dim=2, keepdim=True))  # the signed value of largest |x|
    safe = torch.where(largest == 0, torch.ones_like(largest), largest)
    # Only each block's best candidate is kept while they are tried; its levels are rounded again
    # at the end (the same rounding of the same numbers), so no full-size copy follows the loop.
    weighted = weight * x
    best_score, best_scale = _candidate(weighted, weight, x, safe, _FACTORS[0], first=True)
    best_factor = _FACTORS[0].expand_as(best_score)
    for factor in _FACTORS[1:]:
        score, scale = _candidate(weighted, weight, x, safe, factor)
        better = score > best_score  # strictly: the first candidate keeps a tie, as make_qx_quants
        best_score = torch.where(better, score, best_score)
        best_scale = torch.where(better, scale, best_scale)
        best_factor = torch.where(better, factor, best_factor)
    return largest, best_scale, best_factor


def _levels(x: torch.Tensor, largest: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """x rounded (half to even, as ggml's nearest_int) at scale factor / largest, clamped."""
    return torch.round(factor / largest * x).clamp_(-LEVELS, LEVELS - 1)


def _candidate(
    weighted: torch.Tensor, weight: torch.Tensor, x: torch.Tensor, largest: torch.Tensor, factor, first=False
) -> tuple:
    """For the levels `_levels` rounds at `factor`: the score (sum w x l)^2 / sum w l^2, which the
    weighted squared error falls with, and the best scale for them (sum w x l / sum w l^2). A
    candidate whose levels are all 0 scores 0 as the first one, below any other (make_qx_quants
    only replaces its first guess with a better-defined one). `weighted` = w x."""
    levels = _levels(x, largest, factor)
    sumlx = (weighted * levels).sum(2, keepdim=True)
    suml2 = (weight * levels.square_()).sum(2, keepdim=True)
    usable = suml2 > 0
    divisor = torch.where(usable, suml2, 1.0)
    score = torch.where(usable, sumlx * sumlx / divisor, 0.0 if first else -1.0)
    return score, torch.where(usable, sumlx / divisor, 0.0)


def pack_q4_0(scale: torch.Tensor, codes: torch.Tensor) -> np.ndarray:
    """The q4_0 bytes of [n, blocks, 1] scales and [n, blocks, 32] 4-bit codes."""
    d = scale.to(torch.float16).numpy().view(np.uint8)  # [n, blocks, 2], little-endian f16
    nibbles = (codes[..., :16] | (codes[..., 16:] << 4)).numpy()
    n = codes.shape[0]
    return np.concatenate([d, nibbles], axis=2).reshape(n, -1)
