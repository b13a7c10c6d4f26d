"""Iterative pruning: score -> select -> cut -> recover, a little more each round.

Gradual pruning with recovery in between keeps more quality than one cut of the same
size (Michel et al. 2019; Zhu & Gupta 2017). The schedule lists fractions of the
ORIGINAL heads to have removed after each round (default 0.1, 0.2, 0.3, 0.4); every
round rescores the current model, because importance changes once neighbours are gone.
When a round's recovered model falls below the quality floor, the loop stops and the
last model above the floor is returned.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from torch import nn

from headprune_cli.data import Dataset
from headprune_cli.errors import UsageError
from headprune_cli.stages.finetune.train import FinetuneConfig, finetune
from headprune_cli.stages.importance import score_model
from headprune_cli.model.layout import info_of
from headprune_cli.stages.iterate import DEFAULT_SCHEDULE
from headprune_cli.stages.objectives import Metric, check_objective, evaluate, worse_by
from headprune_cli.stages.prune import cut
from headprune_cli.stages.selection import Constraints, select


@dataclass
class Round:
    ratio: float  # fraction of the original heads removed after this round
    heads_kept: int
    remove_heads: dict[int, list[int]]  # removed in this round (original indices)
    metric_pruned: float  # before recovery
    metric_recovered: float  # after recovery (best epoch)
    accepted: bool


@dataclass
class IterativeResult:
    model: nn.Module  # the last accepted model (the input model when no round passed)
    metric_name: str
    higher_is_better: bool
    baseline: float
    rounds: list[Round] = field(default_factory=list)

    @property
    def stopped_early(self) -> bool:
        return any(not r.accepted for r in self.rounds)


def iterative_prune(
    model: nn.Module,
    train: Dataset,
    dev: Dataset,
    *,
    schedule: Sequence[float] = DEFAULT_SCHEDULE,
    method: str = "taylor",
    score_data: Dataset | None = None,
    objective: str | None = None,
    floor: float | None = None,
    max_drop: float | None = None,
    finetune_config: FinetuneConfig | None = None,
    teacher: nn.Module | None = None,
    constraints: Constraints = Constraints(),
    score_batch_size: int = 32,
    seed: int = 0,
    on_round: Callable[[Round], None] | None = None,
) -> IterativeResult:
    """Prune `model` (not modified) along `schedule`; see the module docstring.

    Quality is the first metric of `evaluate(model, dev, objective)` (accuracy,
    perplexity or fidelity). The floor is `floor` (an absolute metric value) and/or
    `max_drop` (how much worse than the input model may get: in points for accuracy-like
    metrics, 1.0 = one percentage point, as `report --max-drop`; perplexity in its own
    unit). `score_data` defaults to `train`.
    """
    check_schedule(schedule)
    objective = check_objective(objective, model)
    cfg = finetune_config or FinetuneConfig(epochs=1, seed=seed)
    base = evaluate(model, dev, objective, reference=teacher)[0]
    _check_budget(max_drop)
    original = sum(len(h) for h in info_of(model).layout.heads)
    current = copy.deepcopy(model)
    result = IterativeResult(current, base.name, base.higher_is_better, base.value)
    for ratio in schedule:
        kept = sum(len(h) for h in info_of(current).layout.heads)
        to_remove = round(ratio * original) - (original - kept)
        if to_remove <= 0:
            continue
        candidate, removed = _prune_round(current, score_data or train, method, objective, to_remove / kept, constraints, score_batch_size, seed)
        metrics = lambda m: {x.name: x.value for x in evaluate(m, dev, objective, reference=teacher)}  # noqa: E731
        trained = finetune(candidate, train, cfg, metrics, base.higher_is_better, teacher)
        pruned_value = trained.history[0].metrics[base.name]
        # finetune returns its best epoch's weights and has already evaluated them.
        value = next(r.metrics[base.name] for r in trained.history if r.epoch == trained.best_epoch)
        ok = _acceptable(base, value, floor, max_drop)
        heads_now = sum(len(h) for h in info_of(trained.model).layout.heads)
        record = Round(ratio, heads_now, removed, pruned_value, value, ok)
        result.rounds.append(record)
        if on_round:
            on_round(record)
        if not ok:
            break
        current = result.model = trained.model
    return result


def _prune_round(model, data, method, objective, ratio, constraints, batch_size, seed):
    """Rescore the current model and cut `ratio` of its kept heads, on a copy."""
    scores = score_model(model, data, method, objective, batch_size=batch_size, seed=seed)
    chosen = select(scores, "global", ratio=min(1.0, ratio), constraints=constraints)
    candidate = copy.deepcopy(model)
    cut(candidate, chosen)
    return candidate, chosen.remove_heads


def _check_budget(max_drop: float | None) -> None:
    if max_drop is not None and not max_drop >= 0:
        raise UsageError(f"max_drop must be a number >= 0 (got {max_drop})")


def _acceptable(base: Metric, value: float, floor: float | None, max_drop: float | None) -> bool:
    """Above the floor and within the drop budget (points for accuracy-like metrics, as `report`)."""
    if floor is not None and (value < floor if base.higher_is_better else value > floor):
        return False
    return max_drop is None or worse_by(base.name, base.higher_is_better, base.value, value) <= max_drop


def check_schedule(schedule: Sequence[float]) -> None:
    values = list(schedule)
    if not values:
        raise UsageError("the iterative schedule is empty")
    if any(not 0 < r < 1 for r in values) or values != sorted(values):
        raise UsageError(f"the iterative schedule must rise strictly within (0, 1): {values}")
    if len(set(values)) != len(values):
        raise UsageError(f"the iterative schedule repeats a ratio: {values}")
