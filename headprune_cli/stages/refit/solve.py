"""The closed forms of compensation: statistics, weight access, and the three solvers.

Everything here works on float64 CPU tensors and on one projection at a time, seen as
"the kept input features of a Linear (or GPT-2 Conv1D) towards its unpruned output":
the attention output projection (kept head features) and the FFN down projection (kept
neurons) are the same problem.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from headprune_cli.model.arch.base import HFModule, is_conv1d


@dataclass
class Stats:
    # Sums over tokens t weighted by w_t (streams.token_weights: 1 / |Y_t|^2), Y the fit's
    # target (Streams.statistics: the projection's unpruned output plus the residual drift).
    gram: torch.Tensor  # [d+1, d+1] (or [d, d] without bias): [X 1]^T W [X 1]
    cross: torch.Tensor  # [d(+1), out]: [X 1]^T W Y
    yy: float  # sum_t w_t |Y_t|^2
    n: int  # tokens
    has_bias: bool

    def error(self, w: tuple[torch.Tensor, torch.Tensor | None]) -> float:
        """Relative squared error |[X 1] w - Y|^2_W / |Y|^2_W of weights w = (weight [d, out], bias),
        stacked as [d(+1), out] (with the per-token weights: the mean over tokens of each token's
        relative error)."""
        stacked = _stack(w, self.has_bias)
        err = float((stacked * (self.gram @ stacked)).sum() - 2 * (stacked * self.cross).sum() + self.yy)
        return max(err, 0.0) / max(self.yy, 1e-300)  # float64 throughout, as the statistics


# --- weights: Linear [out, in] or GPT-2 Conv1D [in, out] ----------------------------
def linear_weights(o: HFModule) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight as [out, in], bias) copies."""
    w = o.weight.detach().T if is_conv1d(o) else o.weight.detach()
    return w.clone(), (o.bias.detach().clone() if o.bias is not None else None)


def kept_weights(o: HFModule, cols: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    w, b = linear_weights(o)
    w, b = w.cpu(), (b.cpu() if b is not None else None)  # solved on the CPU, like the statistics
    return w[:, cols].double().T, (b.double() if b is not None else None)  # [d, out], [out]


def _stack(w, has_bias: bool) -> torch.Tensor:
    weight, bias = w
    return torch.cat([weight, bias[None]], 0) if has_bias else weight


def write_solved(o: HFModule, cols: torch.Tensor, solved, has_bias: bool) -> None:
    weight, bias = solved
    with torch.no_grad():
        cols = cols.to(o.weight.device)
        if is_conv1d(o):
            o.weight[cols, :] = weight.to(o.weight.device, o.weight.dtype)
        else:
            o.weight[:, cols] = weight.T.to(o.weight.device, o.weight.dtype)
        if has_bias:
            o.bias.copy_(bias.to(o.bias.device, o.bias.dtype))


# --- closed forms ---------------------------------------------------------------------
def solve_bias(stats: Stats, w0) -> tuple[torch.Tensor, torch.Tensor]:
    """The weighted mean of what is missing (gram[-1, -1] is the sum of the token weights)."""
    weight, _ = w0
    sum_x, n = stats.gram[-1, :-1], stats.gram[-1, -1]
    return weight, (stats.cross[-1] - sum_x @ weight) / n


def solve_lstsq(stats: Stats, w0, ridge: float, has_bias: bool):
    d = w0[0].shape[0]
    lam = ridge * float(torch.diagonal(stats.gram)[:d].mean())
    penalty = torch.zeros(len(stats.gram), dtype=torch.float64)
    penalty[:d] = lam + 1e-12  # the bias row is not shrunk; the tiny floor keeps A invertible
    # gram + diag(penalty) and cross + penalty * W0, without the dense diagonal matrix or a
    # third temporary (d^2 float64 each: 89 MB at 1.1 B); the same sums, so the same bits.
    a = stats.gram.clone()
    a.diagonal().add_(penalty)
    rhs = penalty[:, None] * _stack(w0, has_bias)
    rhs += stats.cross
    solved = _solve(a, rhs)
    return (solved[:d], solved[d]) if has_bias else (solved, None)


def solve_diag(stats: Stats, w0, ridge: float, has_bias: bool):
    """Kwon et al.'s mask tuning in closed form: one scale s_j per kept input feature,
    W' = diag(s) W0, s = argmin |X diag(s) W0 + 1 b^T - Y|^2 + lam |s - 1|^2, and the bias
    b refit beside it when there is one; lam = ridge * mean(diag(A_ss)).

    With G = X^T X and C = X^T Y: |X diag(s) W0|^2 = s^T (G o W0 W0^T) s and the cross term
    is s . rowsum(C o W0), so the whole problem is a (d + out)-sized linear system."""
    weight, bias = w0
    d = weight.shape[0]
    a_ss = stats.gram[:d, :d] * (weight @ weight.T)
    r_s = (stats.cross[:d] * weight).sum(1)
    lam = ridge * float(torch.diagonal(a_ss).mean()) + 1e-12
    a_ss = a_ss + lam * torch.eye(d, dtype=torch.float64)
    r_s = r_s + lam  # the pull towards s = 1 (the weights as they are)
    if not has_bias:
        return weight * _solve(a_ss, r_s[:, None])[:, 0, None], None
    n, sum_x = stats.gram[d, d], stats.gram[d, :d]
    a_sb = sum_x[:, None] * weight  # [d, out]: d/ds of the bias cross term
    out = weight.shape[1]
    a = torch.cat([torch.cat([a_ss, a_sb], 1), torch.cat([a_sb.T, n * torch.eye(out, dtype=torch.float64)], 1)], 0)
    solved = _solve(a, torch.cat([r_s, stats.cross[d]])[:, None])[:, 0]
    return weight * solved[:d, None], solved[d:]


def _solve(a: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    try:
        return torch.linalg.solve(a, rhs)
    except torch.linalg.LinAlgError:  # singular (e.g. a constant feature): least-norm answer
        return torch.linalg.lstsq(a, rhs, driver="gelsd").solution
