"""`sweep`: the quality curve, one loop over a list of Budget values.

Each method scores the model once per route on the calibration data; every budget is then a
copy cut by prune_once (prune/cut.py, with the sweep's compensation) from those scores, an
evaluation on the eval data (objectives.evaluate) and, for FLOPs budgets with `repeats`, the
measured speedup over the unpruned model (interleaved, as `report` measures it). The result
names, per method (head ratios) or per route (FLOPs budgets), the point that removes the most
while the drop of the main metric stays within the budget: the knee.

Two kinds of sweep share the loop and differ only in their budgets, routes and columns:
- head ratios (`--ratios`, Budget("heads", r)): heads chosen globally from per-layer
  normalised scores, one curve per method;
- FLOPs budgets (`--target-flops`, Budget("flops", f)) per route: what a budget may remove,
  `heads`, `heads+ffn` (heads and FFN neurons under one budget) or `heads+ffn+layers` (whole
  layers too, priced on the loss scale by loo layer scores), one curve per route and method.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from headprune_cli.data.readers import Dataset, batches
from headprune_cli.errors import UsageError
from headprune_cli.model.cost import count_params, flops_per_token
from headprune_cli.model.layout import info_of
from headprune_cli.names import did_you_mean
from headprune_cli.stages.budget import Budget, BudgetUnreachable, checked
from headprune_cli.stages.model_latency import max_sequence
from headprune_cli.stages.objectives import default_objective, evaluate, metric_dicts
from headprune_cli.stages.prune.compensation import METHODS as COMPENSATIONS
from headprune_cli.stages.prune.cut import Compensation, prune_once
from headprune_cli.stages.report.build import main_metric, measure_speed
from headprune_cli.stages.score.importance.api import score_model
from headprune_cli.stages.score.importance.registry import HEAD_METHODS, check_ffn
from headprune_cli.stages.sweep.settings import ROUTE_NAMES, SweepSettings


@dataclass(frozen=True)
class Route:
    """What one scoring of the model may remove, and how a budget chooses from it."""

    name: str
    scoring: dict = field(default_factory=dict)  # score_model's unit switches and normalisation
    strategy: str | None = None  # None: prune_once's default for the budget's kind


# Gradient scores normalised per layer would put heads, neurons and layers on different scales.
ROUTES = {
    "heads": Route("heads", {"normalize": False}),
    "heads+ffn": Route("heads+ffn", {"normalize": False, "ffn": True}),
    "heads+ffn+layers": Route("heads+ffn+layers", {"normalize": False, "ffn": True, "layers": "loo"}, "joint"),
}
assert tuple(ROUTES) == ROUTE_NAMES  # settings.py names them for --help without importing torch
HEAD_RATIOS = Route("heads")  # a head ratio compares heads only: per-layer normalised scores


@dataclass(frozen=True)
class Kind:
    """What a sweep of one budget kind records: its row columns (in artifact order) and its knee."""

    columns: tuple[str, ...]
    knee_of: str  # the row field the knees are per: method or route
    knee_columns: tuple[str, ...]
    least_kept: Callable[[dict], tuple]  # ascending: the row that removes the most first


RATIO_SWEEP = Kind(
    ("method", "ratio", "heads_removed", "fraction_removed", "metrics", "main", "drop", "rel_drop", "params")
    + ("flops_per_token", "predicted_speedup", "within_budget"),
    "method",
    ("ratio", "heads_removed", "fraction_removed", "main", "drop", "predicted_speedup"),
    lambda row: (-row["ratio"],),
)
FLOPS_SWEEP = Kind(
    ("method", "route", "target_flops", "metrics", "main", "drop", "rel_drop", "params", "flops_per_token")
    + ("flops_kept", "predicted_speedup", "measured_speedup", "within_budget"),
    "route",
    ("method", "target_flops", "flops_kept", "main", "drop", "predicted_speedup", "measured_speedup"),
    lambda row: (row["flops_kept"], row["drop"]),
)


def budgets_of(opts: SweepSettings) -> list[Budget]:
    """The sweep's points, the least removed first: head ratios, or FLOPs budgets."""
    if opts.target_flops is not None:
        return [Budget("flops", target) for target in sorted(opts.target_flops, reverse=True)]
    return [Budget("heads", ratio) for ratio in sorted(opts.ratios)]


def check_options(opts: SweepSettings) -> None:
    for method in opts.methods:
        if method not in HEAD_METHODS:
            raise UsageError(f"unknown method {method!r}" + did_you_mean(method, HEAD_METHODS))
    if opts.compensate not in COMPENSATIONS:
        raise UsageError(f"unknown compensation {opts.compensate!r}" + did_you_mean(opts.compensate, COMPENSATIONS))
    bad = [r for r in opts.ratios if not 0 < r < 1]
    if bad:
        raise UsageError(f"--ratios must lie strictly between 0 and 1 (got {bad[0]:g})")
    for target in opts.target_flops or []:
        checked(Budget("flops", target))


def check_routes(routes: list[str], methods: list[str]) -> None:
    for route in routes:
        if route not in ROUTES:
            raise UsageError(f"unknown route {route!r}{did_you_mean(route, ROUTES)}")
        if ROUTES[route].scoring.get("ffn"):
            for method in methods:
                check_ffn(method)


def run_sweep(
    model: nn.Module, calib, eval_data, opts: SweepSettings, progress: Callable[[str], None] = lambda _: None
) -> dict:
    """The sweep payload: the baseline, one row per (method, route, budget) point, the knees."""
    check_options(opts)
    flops = opts.target_flops is not None
    if flops:
        check_routes(opts.routes, opts.methods)
    kind, routes = (FLOPS_SWEEP, [ROUTES[r] for r in opts.routes]) if flops else (RATIO_SWEEP, [HEAD_RATIOS])
    objective, task = default_objective(model), info_of(model).task
    base = metric_dicts(evaluate(model, eval_data, objective, reference=model, batch_size=opts.batch_size))
    total_heads = sum(len(h) for h in info_of(model).layout.heads)
    measure = _Measure(model, eval_data, objective, task, base, total_heads, opts)
    compensation = _compensation(calib, opts)
    rows = []
    for method in opts.methods:
        for route in routes:
            label = f"{method} ({route.name})" if flops else method
            progress(f"scoring with {label}")
            table = score_model(
                model,
                calib,
                method,
                objective,
                batch_size=opts.batch_size,
                seed=opts.seed,
                seq_len=opts.max_length,
                **route.scoring,
            )
            for budget in budgets_of(opts):
                progress(f"{label}: {budget.option} {budget.value:g}")
                try:
                    pruned = prune_once(model, budget, table, compensation=compensation, strategy=route.strategy)
                except BudgetUnreachable as exc:  # beyond what the route can remove: a gap in its curve
                    progress(f"{label}: {budget.option} {budget.value:g} not reachable ({exc})")
                    continue
                point = measure(pruned, method=method, route=route.name, budget=budget, speed=flops)
                rows.append({column: point[column] for column in kind.columns})
    return {
        **payload_head(task, objective, base, total_heads, opts.max_drop),
        "rows": rows,
        "best": knees(rows, kind, opts.routes if flops else opts.methods),
        **({"budget": {"routes": list(opts.routes)}} if flops else {}),
    }


def _compensation(calib, opts: SweepSettings) -> Compensation | None:
    if opts.compensate != "none":
        return Compensation(opts.compensate, list(batches(calib, opts.batch_size)))
    return None


@dataclass
class _Measure:
    """Every column a sweep point may have, measured on its cut copy against the unpruned model."""

    model: nn.Module
    eval_data: Dataset
    objective: str
    task: str
    base: list[dict]
    total_heads: int
    opts: SweepSettings

    def __post_init__(self) -> None:
        self.base_flops = flops_per_token(self.model, self.opts.max_length)

    def __call__(self, pruned, *, method: str, route: str, budget: Budget, speed: bool) -> dict:
        opts, model = self.opts, self.model
        evaluated = evaluate(pruned.model, self.eval_data, self.objective, reference=model, batch_size=opts.batch_size)
        metrics = metric_dicts(evaluated)
        main = main_metric(self.task, self.base, metrics)
        base_flops, flops = self.base_flops, flops_per_token(pruned.model, opts.max_length)
        return {
            "method": method,
            "route": route,
            "ratio": budget.value,
            "target_flops": budget.value,
            "heads_removed": pruned.heads_removed,
            "fraction_removed": pruned.heads_removed / self.total_heads,
            "metrics": metrics,
            "main": main.pruned,
            "drop": main.drop,
            "rel_drop": main.rel_drop,
            "params": count_params(pruned.model),
            "flops_per_token": flops,
            "flops_kept": flops / base_flops,
            "predicted_speedup": base_flops / flops,
            "measured_speedup": self.speedup(pruned.model) if speed else None,
            "within_budget": main.drop <= opts.max_drop,
        }

    def speedup(self, pruned: nn.Module) -> float | None:
        opts = self.opts
        if not opts.repeats:
            return None
        seq_len = min(opts.max_length, max_sequence(self.model) or opts.max_length)
        timed = measure_speed(self.model, pruned, opts.batch_size, seq_len, torch.get_num_threads(), opts.repeats, 2)
        return timed["speedup"]


def payload_head(task: str, objective: str, base_metrics: list[dict], total_heads: int, max_drop: float) -> dict:
    """The fields every sweep artifact opens with."""
    main = main_metric(task, base_metrics, base_metrics)
    return {
        "task": task,
        "objective": objective,
        "main_metric": {
            "name": main.name,
            "higher_is_better": main.higher_is_better,
            "baseline": main.baseline,
            "unit": main.unit,
        },
        "baseline_metrics": base_metrics,
        "total_heads": total_heads,
        "max_drop": max_drop,
    }


def knees(rows: list[dict], kind: Kind, groups: list[str]) -> dict[str, dict | None]:
    """Per method (or route): the row within the budget that removes the most (None if none)."""
    best = {}
    for group in groups:
        ok = [r for r in rows if r[kind.knee_of] == group and r["within_budget"]]
        top = min(ok, key=kind.least_kept) if ok else None
        best[group] = None if top is None else {k: top[k] for k in kind.knee_columns}
    return best
