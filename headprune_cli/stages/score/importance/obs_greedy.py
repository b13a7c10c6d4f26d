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
    alive = list(range(n // group))  # groups still in, in index order
    order: list[int] = []
    errors: list[float] = []
    total = 0.0
    while alive:
        costs, solved = _costs(hinv, w, group)
        pick = int(torch.argmin(costs))  # the first minimum: the lowest group index on ties
        total += max(float(costs[pick]), 0.0)
        order.append(alive.pop(pick))
        errors.append(total)
        hinv, w = _remove(hinv, w, pick, group, solved[pick])
    return Greedy(order, errors)


def _costs(hinv: torch.Tensor, w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per alive group: E = tr(W_S^T (Hinv_SS)^-1 W_S), and (Hinv_SS)^-1 W_S [group, out] for the update."""
    m = w.shape[0] // group
    if group == 1:  # one feature: a scalar block, no batched solve
        d = torch.diagonal(hinv).clamp_min(1e-300)
        solved = (w / d[:, None])[:, None, :]
        return (w * w).sum(1) / d, solved
    blocks = hinv.reshape(m, group, m, group).diagonal(dim1=0, dim2=2).permute(2, 0, 1)  # [m, g, g]
    ws = w.reshape(m, group, -1)
    solved = torch.linalg.solve(blocks, ws)
    return (ws * solved).sum((1, 2)), solved


def _remove(hinv: torch.Tensor, w: torch.Tensor, pick: int, group: int, solved: torch.Tensor):
    """Move group `pick`'s contribution onto the rest, then drop its rows and columns."""
    cols = slice(pick * group, (pick + 1) * group)
    w = w - hinv[:, cols] @ solved
    block = hinv[cols, cols]
    hinv = hinv - hinv[:, cols] @ torch.linalg.solve(block, hinv[cols, :])
    keep = torch.cat([torch.arange(0, pick * group), torch.arange((pick + 1) * group, w.shape[0])])
    return hinv[keep][:, keep], w[keep]
