"""l0: learned hard-concrete gates with an L0 penalty (Voita et al. 2019).

Every head gets a stochastic gate z = min(1, max(0, sigmoid((logit(u) + log_alpha) / beta)
* (zeta - gamma) + gamma)), u ~ U(0, 1) (Louizos et al. 2018). With the model frozen, only
log_alpha is trained, for `steps` steps with Adam, on

    loss(model with gates z) + penalty * mean_h P(z_h != 0)

so a head stays open only while the loss needs it. The score is the trained
open-probability P(z_h != 0) = sigmoid(log_alpha - beta * log(-gamma / zeta)), in [0, 1].
For the fidelity objective the loss is 1 - cosine to the ungated model's own outputs.

Deterministic: gate noise comes from a generator seeded with `seed`; step k reads batch
k mod (number of batches). Under torchrun each process takes every N-th row of the
step's batch and the gate gradients are summed, which equals one process up to float
summation order.
"""

from __future__ import annotations

import math

import torch

from headprune_cli.data.readers import as_batch, num_batches
from headprune_cli.model.surgery import HeadGates
from headprune_cli.stages.objectives import check_finite, embed, per_example_loss
from headprune_cli.stages.score.importance.context import ScoreContext, trainable_only, world
from headprune_cli.stages.score.importance.protocol import Importance

BETA, GAMMA, ZETA = 2.0 / 3.0, -0.1, 1.1


class L0(Importance):
    name = "l0"

    def __init__(self, steps: int = 100, lr: float = 0.1, penalty: float = 0.5, init: float = 3.0):
        self.steps, self.lr, self.penalty, self.init = steps, lr, penalty, init

    def heads(self, ctx: ScoreContext) -> list[torch.Tensor]:
        counts = ctx.head_counts()
        log_alpha = torch.full((sum(counts),), self.init, dtype=torch.float32, device=ctx.device, requires_grad=True)
        optimizer = torch.optim.Adam([log_alpha], lr=self.lr)
        noise = torch.Generator().manual_seed(ctx.seed * 7919 + 17)
        rank, size = world()
        advance = ctx.progress("scoring (l0 gates)", self.steps) if rank == 0 else (lambda: None)
        total = num_batches(ctx.dataset, ctx.batch_size)
        with trainable_only(ctx.model, []):
            for step in range(self.steps):
                start = (step % total) * ctx.batch_size
                batch = as_batch(ctx.dataset.select(start, start + ctx.batch_size))
                u = torch.rand(len(batch["input_ids"]), len(log_alpha), generator=noise).clamp(1e-6, 1 - 1e-6)
                mine = {k: v[rank::size].to(ctx.device) for k, v in batch.items()}
                if len(mine["input_ids"]) == 0:
                    mine, u = {k: v[:1].to(ctx.device) for k, v in batch.items()}, u[:0]  # only the penalty
                loss = self._loss(ctx, mine, log_alpha, u[rank::size].to(ctx.device), len(batch["input_ids"]), step)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                grad = log_alpha.grad
                assert grad is not None  # the backward above reaches log_alpha through the gates
                (log_alpha.grad,) = [g.to(torch.float32) for g in ctx.reduce([grad])]
                optimizer.step()
                advance()
        return list(open_probability(log_alpha.detach()).double().split(counts))

    def _loss(
        self, ctx: ScoreContext, batch: dict, log_alpha: torch.Tensor, u: torch.Tensor, global_rows: int, step: int
    ) -> torch.Tensor:
        _, size = world()
        penalty = self.penalty * open_probability(log_alpha).mean() / size  # summed over processes
        if len(u) == 0:
            return penalty
        z = hard_concrete(log_alpha, u)
        reference = None
        if ctx.objective == "fidelity":
            with torch.no_grad():
                reference = embed(ctx.model, batch)
        gates = list(z.split(ctx.head_counts(), dim=1))
        with HeadGates(ctx.model, gates):
            losses = per_example_loss(embed(ctx.model, batch), batch, ctx.objective, reference)
        check_finite(losses, f"l0 step {step + 1}")
        return losses.sum() / global_rows + penalty


def hard_concrete(log_alpha: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Samples of the stretched, clipped concrete gate, one row per example."""
    s = torch.sigmoid((torch.log(u) - torch.log1p(-u) + log_alpha) / BETA)
    return (s * (ZETA - GAMMA) + GAMMA).clamp(0.0, 1.0)


def open_probability(log_alpha: torch.Tensor) -> torch.Tensor:
    """P(gate != 0): the expected L0 norm contribution of each gate."""
    return torch.sigmoid(log_alpha - BETA * math.log(-GAMMA / ZETA))
