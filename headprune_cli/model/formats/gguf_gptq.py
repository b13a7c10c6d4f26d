"""GPTQ rounding for q4_0 GGUF blocks (`export --gguf F --gguf-type q4_0 --calib-data TEXT
--gguf-rounding gptq`).

gguf_imatrix chooses each block's scale by a diagonal weighting and rounds every weight to its
nearest level. GPTQ (Frantar et al., 2023) rounds one input column at a time and spreads that
column's rounding error over the columns not yet rounded, along the inverse of the layer's input
second moment H = E[x x^T] over calibration tokens: it minimises the error of the layer's output
on that text, not of each weight alone. The file keeps the q4_0 bytes, so size and decode speed
are unchanged; only which levels are stored differs. Each block's scale is still chosen by
gguf_imatrix's weighted search (over the block's weights as GPTQ has updated them when it
reaches the block), then rounded to the f16 the file stores before any weight is rounded at it.

H is [columns, columns] for every linear layer; so that a large model's matrices are not all held
at once, the layers are taken in groups whose H fit HESSIAN_BYTES, one calibration pass per group
(each pass stops after its group's last layer).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import torch
from torch import nn

from headprune_cli.model.formats.gguf_imatrix import BLOCK, LEVELS, pack_q4_0, weighted_scales
from headprune_cli.model.formats.layer_inputs import input_means

HESSIAN_BYTES = 1 << 29  # the H matrices accumulated in one calibration pass (float32, as if none were shared)
LAZY = 128  # columns whose updates are applied together (GPTQ's lazy batch; a multiple of BLOCK)
DAMP = 0.01  # of H's mean diagonal, added to the diagonal (the paper's default)


def gptq_model(model: nn.Module, batches: Callable[[str], Iterable[dict]]) -> dict[str, np.ndarray]:
    """Weight name -> q4_0 bytes ([rows, bytes per row], rows in the checkpoint's order) for every
    nn.Linear of `model` whose columns are whole blocks; `batches(label)` yields the calibration
    batches afresh for each group of layers (the label says which group, for a progress bar)."""
    linears = [(f"{name}.weight", m) for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    linears = [(name, m) for name, m in linears if m.in_features % BLOCK == 0]
    quantized: dict[str, np.ndarray] = {}
    groups = _groups(linears)
    for group in groups:
        label = f"GPTQ, matrices {len(quantized) + 1}-{len(quantized) + len(group)} of {len(linears)}"
        hessians = collect_hessians(model, batches(label if len(groups) > 1 else "GPTQ"), dict(group))
        for name, module in group:
            quantized[name] = gptq_q4_0(module.weight.detach(), hessians.pop(name))
    return quantized


def _groups(linears: list[tuple[str, nn.Linear]]) -> list[list[tuple[str, nn.Linear]]]:
    """Consecutive linears whose H (float32, columns^2) fit HESSIAN_BYTES together (at least one)."""
    groups: list[list[tuple[str, nn.Linear]]] = [[]]
    used = 0
    for name, module in linears:
        size = 4 * module.in_features**2
        if groups[-1] and used + size > HESSIAN_BYTES:
            groups.append([])
            used = 0
        groups[-1].append((name, module))
        used += size
    return [group for group in groups if group]


def collect_hessians(model: nn.Module, batches: Iterable[dict], linears: dict[str, nn.Linear]) -> dict:
    """Weight name -> E[x x^T] over the real (unpadded) calibration tokens of each of `linears`'
    inputs, from one forward per batch."""
    return input_means(model, batches, linears, lambda rows: rows.T @ rows)


def gptq_q4_0(weight: torch.Tensor, hessian: torch.Tensor) -> np.ndarray:
    """`weight` [rows, columns] as q4_0 bytes [rows, columns / 32 * 18], rounded by GPTQ against
    `hessian` (E[x x^T] of the layer's input)."""
    w = weight.to(torch.float32).clone()
    rows, columns = w.shape
    importance = torch.diagonal(hessian).clone()
    sigma2 = (w * w).mean(1).reshape(-1, 1, 1)  # ggml weighs a block by its whole row's spread
    inverse = _inverse_cholesky(hessian)
    scales = torch.zeros(rows, columns // BLOCK, 1)
    codes = torch.zeros(rows, columns, dtype=torch.uint8)
    for start in range(0, columns, LAZY):
        end = min(start + LAZY, columns)
        errors = _round_columns(w, start, end, inverse, (importance, sigma2), scales, codes)
        w[:, end:] -= errors @ inverse[start:end, end:]
    return pack_q4_0(scales, codes.reshape(rows, -1, BLOCK))


def _inverse_cholesky(hessian: torch.Tensor) -> torch.Tensor:
    """The upper Cholesky factor of H^-1 (damped; a column no token reached gets a unit diagonal),
    whose rows say how a column's rounding error moves the columns after it."""
    # float64 for the factorisations; each step replaces the last, so two [columns^2] float64
    # matrices are held at a time (a 5632-wide FFN's are 254 MB each).
    h = hessian.to(torch.float64).clone()
    dead = torch.diagonal(h) == 0
    h[dead, dead] = 1.0
    h.diagonal().add_(DAMP * torch.diagonal(h).mean())
    h = torch.linalg.cholesky(h)
    h = torch.cholesky_inverse(h)
    return torch.linalg.cholesky(h, upper=True).to(torch.float32)


def _round_columns(
    w: torch.Tensor,
    start: int,
    end: int,
    inverse: torch.Tensor,
    weighing: tuple[torch.Tensor, torch.Tensor],
    scales: torch.Tensor,
    codes: torch.Tensor,
) -> torch.Tensor:
    """Round columns start..end of `w` one at a time (filling `scales` at each block's first
    column, `codes` for each column), moving each one's error onto the columns after it within
    the batch; returns the scaled errors that move the columns after `end`. `weighing`: each
    column's importance and each row's mean square, which choose a block's scale."""
    importance, sigma2 = weighing
    part = w[:, start:end].clone()
    errors = torch.zeros_like(part)
    local = inverse[start:end, start:end]
    scale = torch.zeros(len(w))
    for i in range(end - start):
        column = start + i
        if column % BLOCK == 0:
            block = part[:, i : i + BLOCK].unsqueeze(1)
            stored = weighted_scales(block, importance[column : column + BLOCK], sigma2).to(torch.float16).float()
            scales[:, column // BLOCK] = stored[:, 0]
            scale = stored[:, 0, 0]
        levels = torch.round(part[:, i] / torch.where(scale == 0, 1.0, scale)).clamp_(-LEVELS, LEVELS - 1)
        levels = torch.where(scale == 0, 0.0, levels)
        codes[:, column] = (levels + LEVELS).to(torch.uint8)
        error = (part[:, i] - scale * levels) / local[i, i]
        part[:, i:] -= error.unsqueeze(1) * local[i, i:].unsqueeze(0)
        errors[:, i] = error
    w[:, start:end] = part
    return errors
