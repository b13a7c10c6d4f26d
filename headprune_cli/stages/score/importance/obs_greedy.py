"""Structured OBS on one projection: which units the least-squares refit repairs best.

A projection y = x W (W: [n inputs, out], inputs x from calibration tokens) loses a group S
of its input features (a head's head_dim features of the attention output projection, a
KV group's, or one FFN neuron of the down projection). With H = X^T X + damp * mean(diag) I
and the kept features refit optimally, the squared output error of removing S is

    E(S) = tr(W_S^T (Hinv_SS)^-1 W_S),    Hinv = H^-1

(Kurtic et al. 2023, ZipLM; Ling et al. 2024, SlimGPT). Greedily removing the cheapest
group, moving its contribution onto the kept features (W_K -= Hinv_KS (Hinv_SS)^-1 W_S)
and dropping S from Hinv by the Schur complement (Hinv <- Hinv - Hinv_:S (Hinv_SS)^-1 Hinv_S:)
gives an order of the groups and the error after each step: the cumulative error after k
steps is the optimal refit's error for the k groups removed, exactly (the step errors telescope).

Everything in float64 on the CPU; one layer at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Greedy:
    order: list[int]  # group indices, removed first to last
    errors: list[float]  # the cumulative error after each removal, same order


def damped_inverse(gram: torch.Tensor, damp: float) -> torch.Tensor:
    """(H + damp * mean(diag(H)) I)^-1; the floor keeps an all-zero Gram (dead features) invertible."""
    lam = damp * float(torch.diagonal(gram).mean()) + 1e-12
    h = gram.clone()
    h.diagonal().add_(lam)
    return torch.linalg.inv(h)


def greedy_order(gram: torch.Tensor, weight: torch.Tensor, group: int, damp: float) -> Greedy:
    """OBS order of the n // group groups of consecutive input features of `weight` [n, out]
    under the input Gram `gram` [n, n]; ties go to the lower group index."""
    n = weight.shape[0]
    if n % group:
        raise ValueError(f"{n} input features do not split into groups of {group}")
    hinv = damped_inverse(gram.double(), damp)
    w = weight.double().clone()
    ids = torch.arange(n // group)  # the group each current block of `group` features is
    dead = torch.zeros(len(ids), dtype=torch.bool)  # removed, not yet compacted away
    order: list[int] = []
    errors: list[float] = []
    total = 0.0
    while len(order) < n // group:
        costs = _costs(hinv, w, group).masked_fill_(dead, float("inf"))
        pick = int(torch.argmin(costs))  # the first minimum: the lowest group index on ties
        total += max(float(costs[pick]), 0.0)
        order.append(int(ids[pick]))
        errors.append(total)
        _remove(hinv, w, pick, group)
        dead[pick] = True
        if 4 * int(dead.sum()) > len(dead):  # shrink once a quarter is gone: the updates cost m^2
            hinv, w, ids, dead = _compact(hinv, w, ids, dead, group)
    return Greedy(order, errors)


def _costs(hinv: torch.Tensor, w: torch.Tensor, group: int) -> torch.Tensor:
    """Per current group: E = tr(W_S^T (Hinv_SS)^-1 W_S)."""
    m = w.shape[0] // group
    if group == 1:  # a scalar block: no batched solve
        return (w * w).sum(1) / torch.diagonal(hinv).clamp_min(1e-300)
    blocks = hinv.reshape(m, group, m, group).diagonal(dim1=0, dim2=2).permute(2, 0, 1)  # [m, g, g]
    ws = w.reshape(m, group, -1)
    try:
        solved = torch.linalg.solve(blocks, ws)
    except torch.linalg.LinAlgError:  # a removed group's block is zero until compaction
        solved = torch.linalg.lstsq(blocks, ws).solution
    return (ws * solved).sum((1, 2))


def _remove(hinv: torch.Tensor, w: torch.Tensor, pick: int, group: int) -> None:
    """In place: move group `pick`'s contribution onto the rest (W -= Hinv_:S (Hinv_SS)^-1 W_S) and
    take it out of Hinv by the Schur complement; its rows and columns become zero."""
    cols = slice(pick * group, (pick + 1) * group)
    block = hinv[cols, cols].clone()
    side = hinv[:, cols].clone()  # [m, g]
    w.addmm_(side, torch.linalg.solve(block, w[cols]), alpha=-1)
    hinv.addmm_(side, torch.linalg.solve(block, side.T), alpha=-1)


def _compact(hinv, w, ids, dead, group):
    """Drop the removed groups' (zero) rows and columns."""
    keep = (~dead).repeat_interleave(group)
    return hinv[keep][:, keep], w[keep], ids[~dead], torch.zeros(int((~dead).sum()), dtype=torch.bool)
