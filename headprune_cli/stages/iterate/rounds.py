"""Iterative pruning: score -> select -> cut -> recover, a little more each round.

Gradual pruning with recovery in between keeps more quality than one cut of the same
size (Michel et al. 2019; Zhu & Gupta 2017). The schedule lists fractions of the
ORIGINAL heads to have removed after each round (default 0.1, 0.2, 0.3, 0.4); every
round rescores the current model, because importance changes once neighbours are gone.
When a round's recovered model falls below the quality floor, the loop stops and the
last model above the floor is returned.

With a cost `budget` ("flops", "params" or "block_params") the schedule lists instead the fractions of
the ORIGINAL model's FLOPs per token (at `seq_len`) or parameters to keep after each
round, falling (e.g. 0.9, 0.8, 0.7): every round selects under the budget that is left
(selection.select, strategy `budget`), and with `ffn` it rescores FFN neurons too, so the
round's cut removes heads and neurons together, priced by the cost table.

Recovery `lstsq` trains nothing: every round rescores the compensated model of the round
before, selects under the budget left, and refits the ORIGINAL model cut by all rounds'
removals together (prune's `--compensate lstsq`, towards the original's own outputs, so
earlier refits' errors do not pile up). It is one-shot `score -> select -> prune
--compensate lstsq` with the scores retaken on the compensated model as the cut deepens:
on the Debian-sections classifiers, 0.4 of the FLOPs in five rounds (0.8 .. 0.4) lost
1.49 / 1.06 dev points against 1.91 / 1.49 for the one-shot cut (BENCHMARKS.md §29).
"""

from __future__ import annotations

import copy
import gc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from headprune_cli.data.readers import Dataset
from headprune_cli.errors import UsageError
from headprune_cli.model import filebacked
from headprune_cli.model.cost import cost_table
from headprune_cli.model.cost_table import predict
from headprune_cli.model.layout import info_of
from headprune_cli.names import did_you_mean
from headprune_cli.stages.budget import Budget
from headprune_cli.stages.constraints import Constraints
from headprune_cli.stages.iterate.reach import check_reachable
from headprune_cli.stages.iterate.schedule import DEFAULT_SCHEDULE, schedule_of
from headprune_cli.stages.objectives import Metric, check_objective, evaluate, worse_by
from headprune_cli.stages.prune.cut import Compensation, choose, cut, prune_once
from headprune_cli.stages.select.chains import Selection
from headprune_cli.stages.training.train import FinetuneConfig, finetune

RECOVERIES = ("finetune", "lstsq")


@dataclass
class Round:
    ratio: float  # the schedule's entry: original heads removed, or (with a budget) the original cost kept
    heads_kept: int
    remove_heads: dict[int, list[int]]  # removed in this round (original indices)
    metric_pruned: float  # before recovery
    metric_recovered: float  # after recovery (best epoch)
    accepted: bool
    remove_ffn: dict[int, list[int]] = field(default_factory=dict)  # FFN neurons removed in this round
    neurons_kept: int = 0  # FFN neurons the model keeps after this round
    cost_kept: float | None = None  # with a budget: the model's cost after this round over the original's


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
    schedule: Sequence[Budget] = tuple(schedule_of(DEFAULT_SCHEDULE)),
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
    ffn: bool = False,
    seq_len: int = 128,
    recover: str = "finetune",
    compensation: Compensation | None = None,
    source: Path | None = None,
    work: Path | None = None,
) -> IterativeResult:
    """Prune `model` (not modified) along `schedule`; see the module docstring.

    Quality is the first metric of `evaluate(model, dev, objective)` (accuracy,
    perplexity or fidelity). The floor is `floor` (an absolute metric value) and/or
    `max_drop` (how much worse than the input model may get: in points for accuracy-like
    metrics, 1.0 = one percentage point, as `report --max-drop`; perplexity in its own
    unit). `score_data` defaults to `train`. `budget`, `ffn` and `seq_len`: see the module
    docstring (`ffn` needs a budget: a head fraction says nothing about neurons).
    `recover` "lstsq" recovers by `compensation` instead of training (module docstring);
    `finetune_config` and `teacher` are then unused. With `source` (the file `model` was
    loaded from) and `work` (a folder for the rounds' files), lstsq recovery holds one model
    at a time (refits.py): `model` is then let go after its first scoring, so the caller
    must hold no reference to it for its memory to be freed.
    """
    if recover not in RECOVERIES:
        raise UsageError(f"unknown recovery {recover!r}{did_you_mean(recover, RECOVERIES)}")
    if recover == "lstsq" and (compensation is None or not compensation.batches):
        raise UsageError("lstsq recovery needs calibration batches (a Compensation with data)")
    kind = schedule[0].kind if schedule else "heads"
    schedule_of([step.value for step in schedule], kind)  # checked again: a library caller may build its own
    budget = None if kind == "heads" else Budget(kind, 1.0)  # the cost the schedule's fractions are of
    if ffn and budget is None:
        raise UsageError(
            "FFN neurons are cut under a cost budget: give the schedule as FLOPs or params fractions to keep"
        )
    objective = check_objective(objective, model)
    check_reachable(model, score_data or train, schedule, constraints, ffn, seq_len)  # before anything is scored
    cfg = finetune_config or FinetuneConfig(epochs=1, seed=seed)
    base = evaluate(model, dev, objective, reference=teacher)[0]
    _check_budget(max_drop)
    original = sum(len(h) for h in info_of(model).layout.heads)
    original_cost = _cost(model, budget, seq_len) if budget else None
    spill = Spill(source, work, info_of(model)) if recover == "lstsq" and source and work else None
    # Nothing modifies the model it scores: with the original left in its file, no copy is made.
    current = model if spill else copy.deepcopy(model)
    result = IterativeResult(current, base.name, base.higher_is_better, base.value)
    union = Selection("iterative", {}, [])  # lstsq: every round's removals so far (original indices)
    if spill:
        del model  # `current` (the model until round one is accepted) is the only reference
    for step in schedule:
        ratio = step.value
        if budget is None:
            kept = sum(len(h) for h in info_of(current).layout.heads)
            to_remove = round(ratio * original) - (original - kept)
            amount = Budget("heads", min(1.0, to_remove / kept)) if to_remove > 0 else None
        else:
            assert original_cost is not None  # priced above whenever there is a budget
            keep = ratio * original_cost / _cost(current, budget, seq_len)  # of what the current model costs
            amount = step.with_value(keep) if keep < 1 else None
        if amount is None:
            continue
        scoring: dict[str, Any] = {
            "batch_size": score_batch_size,
            "seed": seed,
            "ffn": ffn,
            "seq_len": seq_len if budget else None,
        }
        if recover == "lstsq":
            assert compensation is not None  # checked above; tells mypy
            # Per-layer normalisation of gradient scores would put heads and neurons on different scales.
            selection = choose(
                current,
                amount,
                method,
                constraints,
                data=score_data or train,
                objective=objective,
                normalize=not ffn,
                **scoring,
            )
            union = _union(union, selection)
            if spill:
                # Scored: its pages go back to the file (whoever still holds it, as the CLI's
                # datasets do), then it is let go before this round's models are read.
                filebacked.release(current)
                del current, result.model  # both set again below
                recovered, pruned_value, value = spill.round(union, compensation, dev, objective)
            else:
                recovered, pruned_value, value = _compensated_round(model, union, compensation, dev, objective, teacher)
        else:
            candidate, selection = _prune_round(
                current, score_data or train, method, objective, amount, constraints, scoring
            )
            metrics = lambda m: {x.name: x.value for x in evaluate(m, dev, objective, reference=teacher)}  # noqa: E731
            trained = finetune(candidate, train, cfg, metrics, base.higher_is_better, teacher)
            recovered = trained.model
            pruned_value = trained.history[0].metrics[base.name]
            # finetune returns its best epoch's weights and has already evaluated them.
            value = next(r.metrics[base.name] for r in trained.history if r.epoch == trained.best_epoch)
        ok = _acceptable(base, value, floor, max_drop)
        layout = info_of(recovered).layout
        cost_now = _cost(recovered, budget, seq_len) / original_cost if budget and original_cost is not None else None
        record = Round(
            ratio,
            sum(len(h) for h in layout.heads),
            selection.remove_heads,
            pruned_value,
            value,
            ok,
            selection.remove_ffn,
            sum(len(layout.kept_neurons(l)) for l in layout.layers),
            cost_now,
        )
        result.rounds.append(record)
        if on_round:
            on_round(record)
        if not ok:
            if spill:
                del recovered
                result.model = spill.accepted()
            break
        current = result.model = recovered
        if spill:
            spill.accept()
    return result


class Spill:
    """lstsq rounds from the original's file (refits.py): which round was last accepted,
    so that a round below the floor can give the accepted model back from its file."""

    def __init__(self, source: Path, work: Path, like):
        self.source, self.work, self.like = source, work, like
        self.number = 0  # rounds run
        self.kept: Path | None = None  # the last accepted round's file

    def round(self, union: Selection, compensation: Compensation, dev, objective):
        from headprune_cli.stages.iterate.refits import streamed_round  # noqa: PLC0415 (one route's module)

        self.number += 1
        metric = lambda m: evaluate(m, dev, objective)[0].value  # noqa: E731
        return streamed_round(self.source, self.work, self.number, union, compensation, metric, self.like)

    def accept(self) -> None:
        from headprune_cli.stages.iterate.refits import refit_file  # noqa: PLC0415 (one route's module)

        self.kept = refit_file(self.work, self.number)

    def accepted(self) -> nn.Module:
        from headprune_cli.model.checkpoint import load  # noqa: PLC0415 (one route's module)
        from headprune_cli.stages.iterate.refits import read_back  # noqa: PLC0415 (one route's module)

        gc.collect()
        return load(self.source, per_tensor=True) if self.kept is None else read_back(self.kept, self.like)


def _prune_round(model, data, method, objective, amount: Budget, constraints, scoring: dict):
    """Rescore the current model and cut, on a copy, a share of its kept heads or down to a
    fraction of its cost; returns (the cut copy, the selection)."""
    # Per-layer normalisation of gradient scores would put heads and neurons on different scales.
    pruned = prune_once(
        model, amount, method, constraints, data=data, objective=objective, normalize=not scoring["ffn"], **scoring
    )
    return pruned.model, pruned.selection


def _union(done: Selection, more: Selection) -> Selection:
    """The removals of `done` and of `more` together (original layer -> original indices)."""

    def merged(a: dict[int, list[int]], b: dict[int, list[int]]) -> dict[int, list[int]]:
        return {k: sorted(set(a.get(k, [])) | set(b.get(k, []))) for k in sorted(set(a) | set(b))}

    layers = sorted(set(done.remove_layers) | set(more.remove_layers))
    return Selection(
        "iterative",
        merged(done.remove_heads, more.remove_heads),
        layers,
        remove_ffn=merged(done.remove_ffn, more.remove_ffn),
    )


def _compensated_round(original, union: Selection, compensation: Compensation, dev, objective, teacher):
    """The original model cut by every removal so far, refit by `compensation` towards the
    original's own outputs (so errors of earlier rounds' refits do not pile up); returns it
    with the dev metric of the plain cut and of the refit one."""
    metric = lambda m: evaluate(m, dev, objective, reference=teacher)[0].value  # noqa: E731
    plain = copy.deepcopy(original)
    cut(plain, union)
    before = metric(plain)
    del plain  # measured; gone before the refit copy is made (one model copy fewer at the peak)
    refit = copy.deepcopy(original)
    cut(refit, union, compensation)
    return refit, before, metric(refit)


def _cost(model: nn.Module, budget: Budget, seq_len: int) -> float:
    """The model's FLOPs per token at `seq_len`, or its parameters (in its blocks, for a block-params
    budget), as the cost table prices them."""
    heads = info_of(model).layout
    table = cost_table(model, seq_len)
    return budget.priced(table).cost(predict(table, dict(zip(heads.layers, map(list, heads.heads)))))


def _check_budget(max_drop: float | None) -> None:
    if max_drop is not None and not max_drop >= 0:
        raise UsageError(f"max_drop must be a number >= 0 (got {max_drop})")


def _acceptable(base: Metric, value: float, floor: float | None, max_drop: float | None) -> bool:
    """Above the floor and within the drop budget (points for accuracy-like metrics, as `report`)."""
    if floor is not None and (value < floor if base.higher_is_better else value > floor):
        return False
    return max_drop is None or worse_by(base.name, base.higher_is_better, base.value, value) <= max_drop
