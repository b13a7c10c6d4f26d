"""An iterative schedule: budgets of one kind, one per round, of the ORIGINAL model.

Head fractions removed (`--schedule`) rise; cost fractions kept (`--target-flops`,
`--target-params`, `--target-block-params`) fall; all lie within (0, 1). No torch here: `headprune run --check`
validates schedules without loading it.
"""

from __future__ import annotations

from collections.abc import Sequence

from headprune_cli.errors import UsageError
from headprune_cli.stages.budget import Budget

DEFAULT_SCHEDULE = (0.1, 0.2, 0.3, 0.4)
KINDS = ("heads", "flops", "params", "block_params")


def schedule_of(values: Sequence[float], kind: str = "heads") -> list[Budget]:
    """The schedule of `values` as budgets of `kind`, checked."""
    check_schedule(values, kind)
    return [Budget(kind, float(value)) for value in values]


def check_schedule(schedule: Sequence[float], kind: str = "heads") -> None:
    """Head fractions removed rise; cost fractions kept fall; all within (0, 1)."""
    values = list(schedule)
    if kind not in KINDS:
        raise UsageError(f"unknown budget {kind!r} (available: {', '.join(KINDS[1:])})")
    if not values:
        raise UsageError("the iterative schedule is empty")
    if len(set(values)) != len(values):
        raise UsageError(f"the iterative schedule repeats a value: {values}")
    if kind == "heads" and (any(not 0 < r < 1 for r in values) or values != sorted(values)):
        raise UsageError(f"the iterative schedule must rise strictly within (0, 1): {values}")
    if kind != "heads" and (any(not 0 < r < 1 for r in values) or values != sorted(values, reverse=True)):
        raise UsageError(f"the {kind.replace('_', ' ')} fractions to keep must fall strictly within (0, 1): {values}")
