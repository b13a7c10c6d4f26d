"""Whether a schedule can be met at all, asked before the first round.

A round can remove only what the constraints leave removable (every layer keeps
--min-heads heads, widths stay on their multiples, protected heads stay). That limit is
a property of the model's structure, not of its scores, so it is found once, on the
ORIGINAL model, by the same selection the rounds use, on random scores: a schedule whose
last step lies past it is refused before anything is scored or trained, instead of after
rounds that were kept (a cost budget) or with the last model written as if the schedule
had been met (a head fraction).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from headprune_cli.data.readers import Dataset
from headprune_cli.errors import UsageError
from headprune_cli.model.layout import info_of
from headprune_cli.stages.budget import Budget, BudgetUnreachable
from headprune_cli.stages.constraints import Constraints
from headprune_cli.stages.score.importance import score_model
from headprune_cli.stages.select.strategies import select

# A head fraction just short of all: `global` removes as many heads as the constraints allow.
_ALL_BUT = 1 - 1e-9


def check_reachable(
    model: nn.Module, data: Dataset, schedule: Sequence[Budget], constraints: Constraints, ffn: bool, seq_len: int
) -> None:
    """Refuse a schedule whose last step no selection within `constraints` can reach."""
    last = schedule[-1]
    cost = last.kind != "heads"
    table = score_model(model, data, "random", normalize=not ffn, ffn=ffn, seq_len=seq_len if cost else None)
    if cost:
        try:
            select(table, "budget", budget=last, constraints=constraints)
        except BudgetUnreachable as exc:
            raise BudgetUnreachable(
                best=exc.best,
                message=f"{last.option} {last.value:g} (the schedule's last round) cannot be met within the "
                "constraints, measured on the original model",
            ) from None
        return
    heads = sum(len(h) for h in info_of(model).layout.heads)
    most = sum(
        len(v)
        for v in select(
            table, "global", budget=Budget("heads", _ALL_BUT), constraints=constraints
        ).remove_heads.values()
    )
    if most < round(last.value * heads):
        raise UsageError(
            f"--schedule {last.value:g}: at most {most} of the {heads} heads ({most / heads:.3f}) can be removed "
            "within the constraints (every layer keeps at least one head); end the schedule there"
        )
