"""Learned pruning: hard-concrete gates on heads, FFN neurons and layers, trained with the model.

A gating of the training loop (stages/training/gating.py: `sample` per micro-batch, then
`penalty_backward` and `step` per optimizer step).

`LearnedGates`: a hard-concrete gate per unit (Louizos et al. 2018;
a head, or for grouped-query layers a whole KV group with its query heads; with `ffn`
every FFN neuron, with `layers` every whole block: gate_space.py), trained jointly with
the model weights. The sparsity is driven to the target by a Lagrangian, as in CoFi (Xia
et al. 2022), rather than by a fixed penalty weight or a schedule of weights: a fixed
weight reaches a different sparsity on every model and data set, while

    penalty = lambda1 * (s - t) + lambda2 * (s - t)^2

with lambda1, lambda2 trained by gradient ascent (they grow until the constraint s = t
holds) reaches the target without tuning. s is the expected share of the budget removed,
computed from the gates' open probabilities P(z != 0) (GateSpace.expected_removed): for a
head ratio the expected fraction of heads removed; for a params/FLOPs target the expected
fraction of the cost removed, from the cost table, with heads, neurons and layers priced on
one scale as `select` prices them. For a head ratio t is the share the closing will remove
(61 of 72 heads at --ratio 0.85: 0.847), so that the gates aim at a whole number of heads.

The run has a gate phase (the first 1 - `closed_share` of the steps) and a closed phase.
In the gate phase t rises linearly from 0 over the first `warmup` share of it, then is held
at the target (CoFi's warmup, then hold), so the expected share reaches the target before
the gates close. The gates and the multipliers have their own Adam optimizers at the same
constant rate, the gates' with a short memory (beta1 0.5), the multipliers' with none: with
momentum the multipliers wind up while the gates lag and the share overshoots or stalls.
log alpha is kept in LOG_ALPHA_RANGE, where the Lagrangian can still move a gate. At the
closing step `extend` checks the expected share: further than `tolerance` from t, the gate
phase goes on one step at a time (the run grows by a step) for up to `extra_steps`; still
far, FarFromTarget, so the run ends without cutting units the model still uses. Then the
gates are closed: `table()` gives the open probabilities as scores, the caller's `close`
(select with the run's amount and constraints; layers whose gate is open with probability
below 0.5 are dropped) chooses the units, and the model trains with exactly those, 0 or 1,
no noise, so it recovers from the closing before it is cut; the budget is met exactly as
`select` meets it. Protected heads' units (and their layers) are never gated. `trace`
records expected share, target and multipliers per gate-phase step and `report` sums up
expected against closed share, overall and per kind of unit.

Gate noise comes from generators seeded by (seed, step, micro-batch),
so runs are deterministic and independent of the global RNG.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from headprune_cli.errors import HeadpruneError
from headprune_cli.stages.budget import Budget
from headprune_cli.stages.learn.gate_space import GateSpace
from headprune_cli.stages.score.importance.l0 import hard_concrete, open_probability
from headprune_cli.stages.score.table import ScoreTable
from headprune_cli.stages.select.chains import Selection
from headprune_cli.stages.training.gating import applied, generator

# log alpha stays in this range. Above it a gate is open with probability 1 - 5e-4 and its
# hard-concrete samples are all clamped to 1, so neither the task nor the Lagrangian moves it any
# more: on the Debian classifiers 12 heads went to log alpha > 20 early, the Lagrangian's push
# grew for 40 steps without moving them, and the expected share stalled one head short of the
# target (BENCHMARKS.md section 21). Below it a gate is closed with probability 1 - 2e-3.
LOG_ALPHA_RANGE = (-8.0, 6.0)


class LearnedGates:
    """Hard-concrete gates on heads (KV groups for GQA layers), and with `ffn`/`layers` on FFN
    neurons and whole layers, under one budget; and their Lagrangian."""

    restores_best = False  # the weights and gates of an earlier epoch belong together; keep the last

    def __init__(
        self,
        model: nn.Module,
        budget: Budget,
        close: Callable[[ScoreTable], Selection],
        seed: int,
        *,
        seq_len: int = 128,
        lr: float = 0.3,
        init: float = 3.0,
        warmup: float = 0.5,
        closed_share: float = 0.4,
        tolerance: float = 0.01,
        extra_steps: int = 0,
        protect: tuple[tuple[int, int], ...] = (),
        ffn: bool = False,
        layers: bool = False,
    ):
        """`close(table) -> Selection` closes the gates: `select` with the run's amount and constraints."""

        self.space = GateSpace(model, budget, seq_len, ffn=ffn, layers=layers, protect=protect)
        self.budget, self.close, self.seed, self.warmup, self.closed_share = budget, close, seed, warmup, closed_share
        self.tolerance, self.extra_steps = tolerance, extra_steps
        self.goal = budget.removed  # the share the gates aim at; make_gates sets the closing's own for heads
        self.closes_at: int | None = None  # the step the gates close at; set by the first step, moved by extend()
        self.at_close: float | None = None  # the expected share removed when the gates closed
        self.expected_units: dict[str, float] | None = None  # heads, neurons, layers expected closed at closing
        self.extended = 0  # gate-phase steps added because the expected share was still far from the target
        self.trace: list[dict[str, float]] = []  # per optimizer step of the gate phase: step, expected, target, lambdas
        self.frozen: dict[str, torch.Tensor] | None = None  # the closed 0/1 gates of the final phase
        self.gap, self.holding = 0.0, False  # at the last gate-phase step: expected share - target; target held?
        self.log_alpha = torch.full((self.space.size,), float(init), requires_grad=True)
        self.lambdas = torch.zeros(2, requires_grad=True)
        # Adam with a short memory (beta1 0.5) on the gates and none (beta1 0) on the multipliers, at
        # the same rate: with the usual beta1 0.9 momentum on both, the multipliers wound up while the
        # gates lagged, and the expected share overshot (0.84 at an 0.5 target on a tiny encoder) or
        # fell short (0.73 at 0.85 on the Debian classifiers, BENCHMARKS.md section 15); without it,
        # it reached the target within the warmup and held it to within 0.005 (section 21).
        self.gate_optimizer = torch.optim.Adam([self.log_alpha], lr=lr, betas=(0.5, 0.999))
        self.lambda_optimizer = torch.optim.Adam([self.lambdas], lr=lr, betas=(0.0, 0.999), maximize=True)

    # --- training ------------------------------------------------------------------------
    def open_probability(self) -> torch.Tensor:
        """P(gate != 0) per unit; protected units are always open."""
        return torch.where(self.space.protected, torch.ones(()), open_probability(self.log_alpha))

    def expected_sparsity(self) -> torch.Tensor:
        """The expected share of the budget removed (gate_space.py's module docstring)."""
        return self.space.expected_removed(self.open_probability())

    def target_at(self, step: int, total: int) -> float:
        """The target share: rises linearly over the first `warmup` share of the gate phase, then held."""
        ramp = max(1, round(self.warmup * self.closing_from(total)))
        return self.goal * min(1.0, (step + 1) / ramp)

    def closing_from(self, total: int) -> int:
        """The first step of the final phase, in which the gates are closed and the cut model trains."""
        if self.closes_at is None:
            self.closes_at = total - round(self.closed_share * total)
        return self.closes_at

    def extend(self, step: int, total: int) -> int:
        """Steps to add to the run before `step`: 1 while, at the closing step, the expected share is
        more than `tolerance` from the target and extra steps are left, else 0. Out of extra steps
        and still far: FarFromTarget, so that the closing never cuts units the model still uses."""
        if self.frozen is not None or step != self.closing_from(total):
            return 0
        expected = float(self.expected_sparsity().detach())
        if abs(expected - self.goal) > self.tolerance and self.extended < self.extra_steps:
            self.extended += 1
            self.closes_at = step + 1
            return 1
        self._settle(expected)
        return 0

    def check_reached(self) -> None:
        """Refuse (FarFromTarget) when the gates were never closed during training (no closed
        phase) and their expected share is further from the target than `tolerance`."""
        if self.frozen is None:
            self._settle(float(self.expected_sparsity().detach()))

    def _settle(self, expected: float) -> None:
        """At the closing: refuse an expected share further than `tolerance` from the target, else record it."""
        if abs(expected - self.goal) > self.tolerance:
            self.refuse(expected)
        self.at_close = expected
        closed = self.space.per_kind(1.0 - self.open_probability().detach())
        self.expected_units = {kind: round(count, 3) for kind, count in closed.items()}

    def refuse(self, expected: float):
        raise FarFromTarget(
            f"learned gates: the expected share removed is {expected:.3f} at closing, "
            f"{abs(expected - self.goal):.3f} from the {self.goal:.3f} target "
            f"(--gate-tolerance {self.tolerance:g}) after {self.extended} extra steps; "
            "nothing was written: train longer (--epochs/--steps), raise --gate-extra-steps or --gate-lr, "
            "or loosen --gate-tolerance"
        )

    def removed_share(self, selection: Selection) -> float:
        """The share of the budget `selection` takes away (of the heads by whole units, or of the cost)."""
        return self.space.removed_share(selection)

    def report(self, selection: Selection) -> dict:
        """What the gates did: the target, the expected share removed when they closed, the share the
        closing removed, the units expected closed and closed per kind, the extra steps, and the
        per-step trace."""
        closed = self.space.per_kind(1.0 - self.space.closed(selection))
        total = self.space.per_kind(torch.ones(self.space.size))
        units = {
            kind: {"expected": (self.expected_units or {}).get(kind), "closed": round(count), "of": round(total[kind])}
            for kind, count in closed.items()
        }
        return {
            "budget": self.budget.kind,
            "target": round(self.goal, 6),
            "budget_removed": round(self.budget.removed, 6),
            "expected_at_close": round(self.at_close, 6) if self.at_close is not None else None,
            "closed": self.removed_share(selection),
            "closed_at_step": self.closes_at,
            "extra_steps": self.extended,
            "tolerance": self.tolerance,
            "units": units,
            "trace": list(self.trace),
        }

    def sample(self, step: int, micro: int, rows: int, total: int) -> dict[str, torch.Tensor]:
        """This micro-batch's gates by hook (GateSpace.split): a hard-concrete draw per example, or
        the closed gates once the gates have closed."""
        if step >= self.closing_from(total):
            if self.frozen is None:
                self.frozen = self.space.split(self._closed_gates())
            return {name: g.expand(rows, *g.shape) for name, g in self.frozen.items()}
        u = torch.rand(rows, self.space.size, generator=generator(self.seed, step, micro, 2)).clamp(1e-6, 1 - 1e-6)
        z = torch.where(self.space.protected, torch.ones(()), hard_concrete(self.log_alpha, u))
        return self.space.split(z)

    def zero_grad(self) -> None:
        self.gate_optimizer.zero_grad(set_to_none=True)
        self.lambda_optimizer.zero_grad(set_to_none=True)

    def penalty_backward(self, step: int, total: int) -> float:
        """Backpropagate the Lagrangian term of this step; returns its value."""
        if self.frozen is not None:
            return 0.0
        target = self.target_at(step, total)
        gap = self.expected_sparsity() - target
        penalty = self.lambdas[0] * gap + self.lambdas[1] * gap * gap
        penalty.backward()
        self.gap = float(gap.detach())
        self.holding = target >= self.goal
        self.trace.append(
            {
                "step": step + 1,
                "expected_sparsity": round(float(gap.detach()) + target, 6),
                "target": round(target, 6),
                "lambda1": round(float(self.lambdas[0].detach()), 6),
                "lambda2": round(float(self.lambdas[1].detach()), 6),
                "penalty": round(float(penalty.detach()), 6),
            }
        )
        return float(penalty.detach())

    def step(self) -> None:
        self.gate_optimizer.step()
        self.lambda_optimizer.step()
        with torch.no_grad():  # a saturated gate gets no gradient from the penalty: keep it where it can move
            self.log_alpha.clamp_(*LOG_ALPHA_RANGE)
            # Anti-windup: lambda1 integrates the gap, so while the share lags the rising target it
            # grows a push that outlasts the lag; once the share is past the held target that push
            # is reset, and lambda2's term, proportional to the gap, pulls it back. Without the
            # reset, 9216 FFN neuron gates carried the share to 0.59 at an 0.5 target and it took
            # 23-47 extra steps to come back (BENCHMARKS.md section 28). Only while the target is
            # held: reset during the rise too, the heads-only gates at --ratio 0.85 fell behind the
            # target again and lost 0.6 points on both classifiers.
            if self.holding and self.gap * float(self.lambdas[0]) < 0:
                self.lambdas[0] = 0.0

    def evaluating(self, model: nn.Module):
        """Evaluation sees the model as it would be cut now: the closed gates of `close`."""
        return applied(model, self.space.split(self._closed_gates()))

    def _closed_gates(self) -> torch.Tensor:
        """1 for the units `close` keeps, 0 for the others."""
        return self.space.closed(self.close(self.table()))

    def table(self, objective: str | None = None, samples: int = 0, config: dict | None = None) -> ScoreTable:
        """The final open probabilities as scores (GateSpace.table)."""
        p = self.open_probability().detach().double()
        p = torch.where(torch.isfinite(p), p, torch.zeros(()))
        return self.space.table(p, objective, samples, dict(config or {}))


class FarFromTarget(HeadpruneError):
    """The gates' expected share stayed far from the target: closing them would cut heads in use."""
