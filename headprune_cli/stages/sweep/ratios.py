"""`sweep`: quality versus heads removed, per importance method, without finetuning.

Each method scores the model once on the calibration data; every ratio is then a
selection from those scores (selection.select, global strategy), a copy of the
model cut by prune_once (prune/cut.py) (with optional closed-form compensation), and an evaluation on
the eval data with objectives.evaluate. The result names, per method,
the largest ratio whose drop of the main metric stays within the budget.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from headprune_cli.data.readers import batches
from headprune_cli.errors import UsageError
from headprune_cli.model.cost import count_params, flops_per_token
from headprune_cli.model.layout import info_of
from headprune_cli.names import did_you_mean
from headprune_cli.stages.budget import Budget, checked
from headprune_cli.stages.objectives import default_objective, evaluate, metric_dicts
from headprune_cli.stages.prune.compensation import METHODS as COMPENSATIONS
from headprune_cli.stages.prune.cut import Compensation, prune_once
from headprune_cli.stages.report.build import main_metric
from headprune_cli.stages.report.render import metric_value as fmt
from headprune_cli.stages.score.importance.api import score_model
from headprune_cli.stages.score.importance.registry import HEAD_METHODS
from headprune_cli.stages.sweep.settings import SweepSettings


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


def run_sweep(
    model: nn.Module, calib, eval_data, opts: SweepSettings, progress: Callable[[str], None] = lambda _: None
) -> dict:
    """The sweep payload: baseline metrics, one row per (method, ratio), the knees."""

    check_options(opts)
    objective = default_objective(model)
    task = info_of(model).task
    base_metrics = metric_dicts(evaluate(model, eval_data, objective, reference=model, batch_size=opts.batch_size))
    total_heads = sum(len(h) for h in info_of(model).layout.heads)
    base_flops = flops_per_token(model, opts.max_length)
    rows = []
    for method in opts.methods:
        progress(f"scoring with {method}")
        table = score_model(
            model, calib, method, objective, batch_size=opts.batch_size, seed=opts.seed, seq_len=opts.max_length
        )
        for ratio in sorted(opts.ratios):
            progress(f"{method}: ratio {ratio:g}")
            pruned, removed = _pruned_copy(model, table, ratio, calib, opts)
            metrics = metric_dicts(evaluate(pruned, eval_data, objective, reference=model, batch_size=opts.batch_size))
            main = main_metric(task, base_metrics, metrics)
            flops = flops_per_token(pruned, opts.max_length)
            rows.append(
                {
                    "method": method,
                    "ratio": ratio,
                    "heads_removed": removed,
                    "fraction_removed": removed / total_heads,
                    "metrics": metrics,
                    "main": main.pruned,
                    "drop": main.drop,
                    "rel_drop": main.rel_drop,
                    "params": count_params(pruned),
                    "flops_per_token": flops,
                    "predicted_speedup": base_flops / flops,
                    "within_budget": main.drop <= opts.max_drop,
                }
            )
    return {
        **payload_head(task, objective, base_metrics, total_heads, opts.max_drop),
        "rows": rows,
        "best": knees(rows, opts.methods),
    }


def payload_head(task: str, objective: str, base_metrics: list[dict], total_heads: int, max_drop: float) -> dict:
    """The fields every sweep artifact opens with (a ratio sweep's and a budget sweep's alike)."""
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


def knees(rows: list[dict], methods: list[str]) -> dict[str, dict | None]:
    """Per method: the largest ratio whose drop stays within the budget (None if none)."""
    best = {}
    for method in methods:
        ok = [r for r in rows if r["method"] == method and r["within_budget"]]
        top = max(ok, key=lambda r: r["ratio"]) if ok else None
        best[method] = (
            None
            if top is None
            else {
                k: top[k] for k in ("ratio", "heads_removed", "fraction_removed", "main", "drop", "predicted_speedup")
            }
        )
    return best


def _pruned_copy(model: nn.Module, table, ratio: float, calib, opts: SweepSettings) -> tuple[nn.Module, int]:

    compensation = (
        Compensation(opts.compensate, list(batches(calib, opts.batch_size))) if opts.compensate != "none" else None
    )
    pruned = prune_once(model, Budget("heads", ratio), table, compensation=compensation)
    return pruned.model, pruned.heads_removed


def markdown(result: dict) -> str:

    main = result["main_metric"]
    name = main["name"]
    lines = [
        f"## headprune sweep: {main['name']} vs heads removed (budget: drop <= {result['max_drop']:g} {main['unit']})",
        "",
        f"Baseline {name}: {fmt(name, main['baseline'])}. Largest ratio within the budget:",
        "",
    ]
    for method, best in result["best"].items():
        lines.append(
            f"- **{method}**: "
            + (
                f"ratio {best['ratio']:g} ({best['heads_removed']} of {result['total_heads']} heads, "
                f"{name} {fmt(name, best['main'])}, "
                f"drop {best['drop']:+.3g} {main['unit']}, predicted speedup {best['predicted_speedup']:.2f}x)"
                if best
                else "none of the ratios"
            )
        )
    lines += [
        "",
        f"| method | ratio | heads removed | {main['name']} | drop ({main['unit']}) | "
        "predicted speedup | within budget |",
        "|---|---:|---:|---:|---:|---:|:---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['method']} | {r['ratio']:g} | {r['heads_removed']} | {fmt(name, r['main'])} | "
            f"{r['drop']:+.3g} | {r['predicted_speedup']:.2f}x | {'yes' if r['within_budget'] else 'no'} |"
        )
    return "\n".join(lines) + "\n"


def curves(result: dict) -> dict[str, list[tuple[float, float]]]:
    start = result["main_metric"]["baseline"]
    out: dict[str, list[tuple[float, float]]] = {}
    for r in result["rows"]:
        out.setdefault(r["method"], [(0.0, start)]).append((r["fraction_removed"], r["main"]))
    return out
