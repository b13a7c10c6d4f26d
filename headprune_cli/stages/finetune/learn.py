"""Learned pruning around the finetune loop: set up the gates, close them, cut the model.

`finetune --learn-gates --ratio R` (or `--target-params F` / `--target-flops F`) trains
hard-concrete head gates jointly with the model (gates.LearnedGates: a Lagrangian drives
the expected sparsity to the target). Afterwards the gates close deterministically: the
open probabilities become a ScoreTable (method `learned`) and `select` chooses from it
with the same amount and constraints (--min-heads, --multiple-of, --protect, --uniform)
that `headprune select` would apply, so the kept-head count is exactly what `select`
gives. The last steps train with the gates closed (--closed-share); then `cut` removes the
closed heads physically. The same ScoreTable is what
`--gates-out` writes, as a scores artifact that `headprune select` reads back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from headprune_cli.errors import UsageError
from headprune_cli.stages.selection import Constraints, Selection, select


@dataclass(frozen=True)
class Amount:
    """The budget as `select` takes it: exactly one of the three is set."""

    ratio: float | None = None
    target_params: float | None = None
    target_flops: float | None = None

    def given(self) -> list[str]:
        return [name for name in ("ratio", "target_params", "target_flops") if getattr(self, name) is not None]

    def budget(self, seq_len: int):
        from headprune_cli.stages.finetune.gates import Budget

        name = self.given()[0]
        kind = {"ratio": "ratio", "target_params": "params", "target_flops": "flops"}[name]
        return Budget(kind, float(getattr(self, name)), seq_len)


def check_learning(
    learn: bool, amount: Amount, head_dropout: float, resume: bool, constraints_given: list[str]
) -> None:
    """Refuse option combinations that learned pruning or head dropout cannot run with."""
    flags = ["--" + name.replace("_", "-") for name in amount.given()]
    if not (math.isfinite(head_dropout) and 0.0 <= head_dropout < 1.0):
        raise UsageError(f"--head-dropout {head_dropout} is outside [0, 1) (the probability of dropping a head)")
    if not learn:
        extra = flags + ["--" + name.replace("_", "-") for name in constraints_given]
        if extra:
            raise UsageError(f"{', '.join(extra)}: a pruning target and its constraints need --learn-gates")
        return
    if not flags:
        raise UsageError("--learn-gates needs a target: --ratio R, --target-params F or --target-flops F")
    if len(flags) > 1:
        raise UsageError(f"--learn-gates takes one target, not {' and '.join(flags)}")
    if head_dropout:
        raise UsageError("give --learn-gates or --head-dropout, not both (the learned gates already drop heads)")
    if resume:
        raise UsageError(
            "--resume is not supported with --learn-gates (the gates' state is not saved); start over without --resume"
        )
    if amount.ratio is not None and not 0.0 <= amount.ratio <= 1.0:
        raise UsageError(f"--ratio {amount.ratio} is outside [0, 1] (the fraction of kept heads to remove)")
    target = amount.target_params if amount.target_params is not None else amount.target_flops
    if target is not None and not (math.isfinite(target) and 0.0 < target <= 1.0):
        raise UsageError(f"target {target} is outside (0, 1] (the fraction of the cost to keep)")


def closer(amount: Amount, constraints: Constraints):
    """`close(table) -> Selection`: select from the gates' open probabilities as `headprune select` would."""

    def close(table) -> Selection:
        return select(
            table,
            ratio=amount.ratio,
            target_params=amount.target_params,
            target_flops=amount.target_flops,
            constraints=constraints,
        )

    return close


def make_gates(
    model,
    amount: Amount,
    constraints: Constraints,
    *,
    seed: int,
    seq_len: int,
    lr: float,
    warmup: float,
    closed_share: float,
):
    """The LearnedGates for `model`, after checking that the gates can be closed within the
    constraints (select on the untrained gates), so that a bad budget fails before training."""
    from headprune_cli.stages.finetune.gates import LearnedGates

    gates = LearnedGates(
        model,
        amount.budget(seq_len),
        closer(amount, constraints),
        seed,
        lr=lr,
        warmup=warmup,
        closed_share=closed_share,
        protect=constraints.protect,
    )
    gates.close(gates.table())
    return gates


@dataclass
class Closed:
    table: object  # the ScoreTable of the final open probabilities
    selection: Selection
    scores: dict  # the scores artifact (method `learned`)
    plan: dict  # the plan artifact of the cut (its sha256 goes into the checkpoint's provenance)


def close_gates(
    model,
    gates,
    constraints: Constraints,
    amount: Amount,
    *,
    checkpoint,
    data,
    max_length: int,
    objective: str,
    samples: int,
    config: dict,
) -> Closed:
    """Close the trained gates: scores and plan artifacts, computed on the model before the cut."""
    from headprune_cli.stages.importance.api import scores_artifact
    from headprune_cli.stages.plan import plan_artifact
    from headprune_cli.schema import input_ref

    table = gates.table(objective, samples, config)
    selection = gates.close(table)
    scores = scores_artifact(model, table, model_path=checkpoint, data_path=data, max_length=max_length)
    plan_config = {
        "strategy": selection.strategy,
        "ratio": amount.ratio,
        "threshold": None,
        "target_params": amount.target_params,
        "target_flops": amount.target_flops,
        **constraints.to_dict(),
    }
    inputs = [input_ref("model", checkpoint, model.headprune.loaded_from[1]), input_ref("data", data)]
    plan = plan_artifact(selection, constraints, inputs, list(table.num_heads), plan_config)
    return Closed(table, selection, scores, plan)
