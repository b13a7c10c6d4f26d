"""The one budget value: how much of a model to keep, parsed once from the options.

A budget is a kind and a value: `heads` (the fraction of the kept heads to remove,
`--ratio`), `params` or `flops` (the fraction of that cost to keep, `--target-params`,
`--target-flops`), `block_params` (the fraction of the parameters inside the transformer
blocks to keep, `--target-block-params`: the cost table's params less its `outside_params`,
the embeddings, final norms and task heads no cut changes), `latency` (the fraction of the
profiled latency to keep, `--target-latency`) or `ms` (milliseconds, `--target-ms`). A schedule (`iterate`,
`sweep`) is a list of budgets of one kind. select, search, iterate, sweep and learned
gates all take a Budget; none re-derives one from loose options.

A budget that nothing within the constraints meets raises BudgetUnreachable, its own
type, so a caller that can try something else (a looser latency price, the next sweep
point) catches exactly that and lets real misuse through.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from headprune_cli.errors import UsageError

# kind -> (its option, the cost table's field it limits: None for heads and latency)
KINDS = {
    "heads": ("--ratio", None),
    "params": ("--target-params", "params"),
    "flops": ("--target-flops", "flops_per_token"),
    # Priced on the params field less the table's outside_params (Budget.priced): the papers'
    # "non-embedding parameters", the share a cut of the blocks can actually move.
    "block_params": ("--target-block-params", "params"),
    "latency": ("--target-latency", None),
    "ms": ("--target-ms", None),
}
# The options that each name one kind, as stage options spell them.
OPTION_FIELDS = {
    "ratio": "heads",
    "target_params": "params",
    "target_flops": "flops",
    "target_block_params": "block_params",
    "target_latency": "latency",
    "target_ms": "ms",
}
SLACK = 1 + 1e-12  # a plan priced exactly at the limit fits, whatever the float rounding


class BudgetUnreachable(UsageError):
    """No plan within the constraints meets the budget; `best` says how close one came."""

    def __init__(self, best: str | None = None, detail: str | None = None, message: str | None = None):
        self.best = best
        text = message or "the budget cannot be met within the constraints"
        if detail:
            text += f" ({detail})"
        elif best:
            text += f" (best: {best})"
        super().__init__(text)


@dataclass(frozen=True)
class Budget:
    kind: str
    value: float
    # block_params: the cost table's outside_params, set by priced(); the other kinds ignore it.
    outside: float | None = None

    @property
    def option(self) -> str:
        return KINDS[self.kind][0]

    @property
    def is_cost(self) -> bool:
        """A fraction of params or FLOPs to keep: priced by the scores' cost table."""
        return KINDS[self.kind][1] is not None

    @property
    def cost_key(self) -> str:
        """The cost table's field this budget limits ('params' or 'flops_per_token')."""
        key = KINDS[self.kind][1]
        if key is None:
            raise ValueError(f"a {self.kind} budget has no cost field")
        return key

    @property
    def removed(self) -> float:
        """The budget as a share removed (of the heads, or of the cost): the scale learned
        gates' expected sparsity is on."""
        return self.value if self.kind == "heads" else 1.0 - self.value

    def priced(self, table) -> Budget:
        """This budget against a cost table (model/cost_table.CostTable): a block_params budget
        learns the params outside the blocks, which it leaves out; the other kinds are as they are."""
        if self.kind != "block_params":
            return self
        return Budget(self.kind, self.value, float(table.outside_params))

    def _outside(self) -> float:
        if self.kind != "block_params":
            return 0.0
        if self.outside is None:
            raise ValueError("a block_params budget is priced by a cost table first (Budget.priced)")
        return self.outside

    def cost(self, predicted: dict) -> float:
        """The cost this budget counts in predict()'s dict: params or FLOPs, or the block params."""
        if self.kind != "block_params":
            return predicted[self.cost_key]
        return predicted[self.cost_key] - self._outside()

    def limit(self, before: dict) -> float:
        """The most the plan may cost, given the cost `before` it (predict()'s dict), on predict()'s
        own scale (all the params, for a block_params budget)."""
        if self.kind != "block_params":
            return self.value * before[self.cost_key]
        return self._outside() + self.value * self.cost(before)

    def fits(self, after: dict, before: dict) -> bool:
        return after[self.cost_key] <= self.limit(before) * SLACK

    def share(self, before: dict, after: dict) -> str:
        """'0.612 of the flops per token': how much of the cost a plan keeps."""
        if self.kind == "block_params":
            return f"{self.cost(after) / self.cost(before):.3f} of the block params"
        return f"{after[self.cost_key] / before[self.cost_key]:.3f} of the {self.cost_key.replace('_', ' ')}"

    def as_options(self) -> dict:
        """The budget as artifacts record it: every option field, the one set to its value."""
        return {name: (self.value if kind == self.kind else None) for name, kind in OPTION_FIELDS.items()}

    def with_value(self, value: float) -> Budget:
        return Budget(self.kind, value, self.outside)


def checked(budget: Budget) -> Budget:
    """`budget`, or a UsageError saying why its value is out of range: the one range check of
    every budget, wherever it is read (options, YAML, schedules, latency targets)."""
    value = budget.value
    if budget.kind not in KINDS:
        raise UsageError(f"unknown budget kind {budget.kind!r}")
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise UsageError(f"{budget.option} {value!r} is not a number")
    # NaN fails every range below, so it is refused with the range's own message.
    if budget.kind == "heads" and not 0 <= value <= 1:
        raise UsageError(f"--ratio {value} is outside [0, 1] (the fraction of kept heads to remove)")
    if budget.kind in ("params", "flops", "block_params") and not 0 < value <= 1:
        raise UsageError(f"{budget.option} {value} is outside (0, 1] (the fraction of the cost to keep)")
    if budget.kind == "latency" and not 0 < value <= 1:
        raise UsageError(f"--target-latency {value} is outside (0, 1] (the fraction of the profiled latency to keep)")
    if budget.kind == "ms" and not (math.isfinite(value) and value > 0):
        raise UsageError(f"--target-ms {value} must be a positive number of milliseconds")
    return budget


def given(**options: float | None) -> list[Budget]:
    """The budgets named by option fields (ratio=, target_flops=, ...) that are set."""
    unknown = set(options) - set(OPTION_FIELDS)
    if unknown:
        raise ValueError(f"not budget options: {sorted(unknown)}")
    return [Budget(OPTION_FIELDS[name], value) for name, value in options.items() if value is not None]


def one_of(**options: float | None) -> Budget | None:
    """The one budget the options name (None if none), range-checked; two is a UsageError."""
    found = given(**options)
    if len(found) > 1:
        raise UsageError(f"give exactly one of {', '.join(KINDS[OPTION_FIELDS[name]][0] for name in options)}")
    return checked(found[0]) if found else None


def block_params(value: float | None) -> dict:
    """`target_block_params` as an artifact's config records it: only when given, so the
    artifacts of the other budgets keep the bytes they had before this budget existed."""
    return {} if value is None else {"target_block_params": value}
