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
steps is the optimal refit's error for the groups removed, exactly (the step errors
telescope). Wide layers remove a few groups per step (STEP_SHARE), as SlimGPT batches its
greedy, so that scoring stays O(n^2) steps of work rather than O(n^3).

Everything in float64 on the CPU; one layer at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Groups removed together per step: 1 while 32 or fewer remain (every attention layer), else
# the 1/32 of the remaining groups that cost least alone. One group a step costs O(n^3) per
# layer (SmolLM2's FFN: 1,536 steps over a 1,536^2 inverse; TinyLlama's 5,632 would take
# hours); 1/32 a step takes about 32 ln(n / 32) + 32 steps (156 for SmolLM2's FFN).
STEP_SHARE = 32


@dataclass
class Greedy:
    order: list[int]  # group indices, removed first to last
    errors: list[float]  # the error once each group is gone, same order (see greedy_order)
    steps: list[int]  # groups removed at each step, in order (they sum to the groups)


def damped_inverse(gram: torch.Tensor, damp: float) -> torch.Tensor:
    """(H + damp * mean(diag(H)) I)^-1; the floor keeps an all-zero Gram (dead features) invertible."""
    lam = damp * float(torch.diagonal(gram).mean()) + 1e-12
    h = gram.clone()
    h.diagonal().add_(lam)
    return torch.linalg.inv(h)


def greedy_order(gram: torch.Tensor, weight: torch.Tensor, group: int, damp: float) -> Greedy:
    """OBS order of the n // group groups of consecutive input features of `weight` [n, out]
    under the input Gram `gram` [n, n]; ties go to the lower group index.

    Each step removes the max(1, m // STEP_SHARE) groups that cost least alone (m groups left)
    together. The error after a step is the optimal refit's for everything removed so far,
    exactly; within a step of several groups, each one's error is interpolated in proportion
    to its cost alone, so errors rise along the order."""
    n = weight.shape[0]
    if n % group:
        raise ValueError(f"{n} input features do not split into groups of {group}")
    hinv = damped_inverse(gram.double(), damp)
    w = weight.double().clone()
    ids = torch.arange(n // group)  # the group each current block of `group` features is
    dead = torch.zeros(len(ids), dtype=torch.bool)  # removed, not yet compacted away
    out = Greedy([], [], [])
    total = 0.0
    while len(out.order) < n // group:
        costs = _costs(hinv, w, group).masked_fill_(dead, float("inf"))
        take = max(1, int((~dead).sum()) // STEP_SHARE)
        picks = torch.sort(costs, stable=True).indices[:take]  # stable: the lower index first on ties
        added = max(_remove(hinv, w, picks, group), 0.0)
        alone = costs[picks].clamp_min(0)
        shares = alone.cumsum(0) / alone.sum() if take > 1 and float(alone.sum()) > 0 else torch.ones(take)
        out.order += ids[picks].tolist()
        out.errors += (total + added * shares).tolist()
        out.steps.append(take)
        total += added
        dead[picks] = True
        if 4 * int(dead.sum()) > len(dead):  # shrink once a quarter is gone: the updates cost m^2
            hinv, w, ids, dead = _compact(hinv, w, ids, dead, group)
    out.errors[-1] = total
    return out


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


def _remove(hinv: torch.Tensor, w: torch.Tensor, picks: torch.Tensor, group: int) -> float:
    """In place: take the groups `picks` out together: their error tr(W_S^T (Hinv_SS)^-1 W_S), their
    contribution moved onto the rest (W -= Hinv_:S (Hinv_SS)^-1 W_S) and S taken out of Hinv by
    the Schur complement (its rows and columns become zero). Returns the error."""
    cols = (picks[:, None] * group + torch.arange(group)).reshape(-1)
    block = hinv[cols][:, cols]
    side = hinv[:, cols]  # [m, |S|], a copy (advanced indexing)
    solved = torch.linalg.solve(block, w[cols])
    error = float((w[cols] * solved).sum())
    w.addmm_(side, solved, alpha=-1)
    hinv.addmm_(side, torch.linalg.solve(block, side.T), alpha=-1)
    return error


def _compact(hinv, w, ids, dead, group):
    """Drop the removed groups' (zero) rows and columns."""
    keep = (~dead).repeat_interleave(group)
    return hinv[keep][:, keep], w[keep], ids[~dead], torch.zeros(int((~dead).sum()), dtype=torch.bool)
