"""`sweep --target-flops`: quality against FLOPs kept and measured speedup, one curve per route.

A route is what a FLOPs budget may remove: `heads` (heads only), `heads+ffn` (heads and
FFN neurons under one budget) or `heads+ffn+layers` (whole layers too, priced on the loss
scale by loo layer scores). Each method scores the model once per route on the calibration
data; every target is a selection from those scores (selection.select), a copy cut by
prune_once (with the sweep's compensation), an evaluation, and, with `repeats`, the
measured speedup over the unpruned model (interleaved, as `report` measures it). This is
what a user trades: how much quality each route keeps at each speed.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from headprune_cli.data.readers import batches
from headprune_cli.errors import UsageError
from headprune_cli.model.cost import count_params, flops_per_token
from headprune_cli.model.layout import info_of
from headprune_cli.names import did_you_mean
from headprune_cli.stages.budget import Budget, BudgetUnreachable
from headprune_cli.stages.model_latency import max_sequence
from headprune_cli.stages.objectives import default_objective, evaluate, metric_dicts
from headprune_cli.stages.prune.cut import Compensation, prune_once
from headprune_cli.stages.report.build import main_metric, measure_speed
from headprune_cli.stages.report.render import metric_value as fmt
from headprune_cli.stages.score.importance.api import score_model
from headprune_cli.stages.score.importance.registry import check_ffn
from headprune_cli.stages.sweep.ratios import payload_head
from headprune_cli.stages.sweep.settings import ROUTE_NAMES

ROUTES = dict(zip(ROUTE_NAMES, ({}, {"ffn": True}, {"ffn": True, "layers": "loo"}), strict=True))


def check_routes(routes: list[str], methods: list[str]) -> None:

    for route in routes:
        if route not in ROUTES:
            raise UsageError(f"unknown route {route!r}{did_you_mean(route, ROUTES)}")
        if ROUTES[route].get("ffn"):
            for method in methods:
                check_ffn(method)


def run_budget_sweep(
    model: nn.Module, calib, eval_data, opts, progress: Callable[[str], None] = lambda _: None
) -> dict:
    """The budget sweep's payload: one row per (method, route, target), and per route the smallest
    FLOPs kept within budget."""

    check_routes(opts.routes, opts.methods)
    objective, task = default_objective(model), info_of(model).task
    base_metrics = metric_dicts(evaluate(model, eval_data, objective, reference=model, batch_size=opts.batch_size))
    base_flops = flops_per_token(model, opts.max_length)
    rows = []
    for method in opts.methods:
        for route in opts.routes:
            progress(f"scoring with {method} ({route})")
            table = score_model(
                model,
                calib,
                method,
                objective,
                batch_size=opts.batch_size,
                seed=opts.seed,
                seq_len=opts.max_length,
                normalize=False,
                **ROUTES[route],
            )
            for target in sorted(opts.target_flops, reverse=True):
                progress(f"{method} ({route}): FLOPs {target:g}")
                try:
                    pruned = prune_once(
                        model,
                        Budget("flops", target),
                        table,
                        compensation=_compensation(calib, opts),
                        strategy="joint" if "layers" in route else "budget",
                    ).model
                except BudgetUnreachable as exc:  # beyond what the route can remove: a gap in its curve
                    progress(f"{method} ({route}): FLOPs {target:g} not reachable ({exc})")
                    continue
                metrics = metric_dicts(
                    evaluate(pruned, eval_data, objective, reference=model, batch_size=opts.batch_size)
                )
                main = main_metric(task, base_metrics, metrics)
                flops = flops_per_token(pruned, opts.max_length)
                rows.append(
                    {
                        "method": method,
                        "route": route,
                        "target_flops": target,
                        "metrics": metrics,
                        "main": main.pruned,
                        "drop": main.drop,
                        "rel_drop": main.rel_drop,
                        "params": count_params(pruned),
                        "flops_per_token": flops,
                        "flops_kept": flops / base_flops,
                        "predicted_speedup": base_flops / flops,
                        "measured_speedup": _speedup(model, pruned, opts),
                        "within_budget": main.drop <= opts.max_drop,
                    }
                )
    total_heads = sum(len(h) for h in info_of(model).layout.heads)
    return {
        **payload_head(task, objective, base_metrics, total_heads, opts.max_drop),
        "rows": [],
        "best": {},  # the head-ratio sweep's fields, empty in a budget sweep
        "budget": {"routes": list(opts.routes), "rows": rows, "best": _best(rows, opts)},
    }


def _compensation(calib, opts) -> Compensation | None:
    return Compensation(opts.compensate, list(batches(calib, opts.batch_size))) if opts.compensate != "none" else None


def _speedup(model, pruned, opts) -> float | None:
    if not opts.repeats:
        return None

    seq_len = min(opts.max_length, max_sequence(model) or opts.max_length)
    return measure_speed(model, pruned, opts.batch_size, seq_len, torch.get_num_threads(), opts.repeats, 2)["speedup"]


def _best(rows: list[dict], opts) -> dict[str, dict | None]:
    """Per route: the row with the fewest FLOPs kept whose drop stays within the budget."""
    best = {}
    for route in opts.routes:
        ok = [r for r in rows if r["route"] == route and r["within_budget"]]
        top = min(ok, key=lambda r: (r["flops_kept"], r["drop"])) if ok else None
        best[route] = (
            None
            if top is None
            else {
                k: top[k]
                for k in (
                    "method",
                    "target_flops",
                    "flops_kept",
                    "main",
                    "drop",
                    "predicted_speedup",
                    "measured_speedup",
                )
            }
        )
    return best


def markdown(payload: dict) -> str:

    main, budget = payload["main_metric"], payload["budget"]
    name, unit = main["name"], main["unit"]
    lines = [
        f"## headprune sweep: {name} vs FLOPs kept, per route (budget: drop <= {payload['max_drop']:g} {unit})",
        "",
        f"Baseline {name}: {fmt(name, main['baseline'])}. Fewest FLOPs kept within the budget:",
        "",
    ]
    for route, best in budget["best"].items():
        lines.append(
            f"- **{route}**: "
            + (
                f"{best['flops_kept']:.0%} of the FLOPs ({best['method']}), {name} {fmt(name, best['main'])}, "
                f"drop {best['drop']:+.3g} {unit}"
                + (f", measured speedup {best['measured_speedup']:.2f}x" if best["measured_speedup"] else "")
                if best
                else "none of the targets"
            )
        )
    lines += [
        "",
        f"| method | route | target FLOPs | FLOPs kept | {name} | drop ({unit}) | predicted speedup | "
        "measured speedup | within budget |",
        "|---|---|---:|---:|---:|---:|---:|---:|:---:|",
    ]
    for r in budget["rows"]:
        measured = f"{r['measured_speedup']:.2f}x" if r["measured_speedup"] else "–"
        lines.append(
            f"| {r['method']} | {r['route']} | {r['target_flops']:g} | {r['flops_kept']:.3f} | "
            f"{fmt(name, r['main'])} | {r['drop']:+.3g} | "
            f"{r['predicted_speedup']:.2f}x | {measured} | {'yes' if r['within_budget'] else 'no'} |"
        )
    return "\n".join(lines) + "\n"


def curves(payload: dict) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """Per route and method: (FLOPs kept, quality) and (measured speedup, quality) points, the baseline included."""
    main = payload["main_metric"]
    out: dict[str, dict[str, list]] = {"flops": {}, "speedup": {}}
    for r in payload["budget"]["rows"]:
        label = f"{r['route']} ({r['method']})"
        out["flops"].setdefault(label, [(1.0, main["baseline"])]).append((r["flops_kept"], r["main"]))
        if r["measured_speedup"]:
            out["speedup"].setdefault(label, [(1.0, main["baseline"])]).append((r["measured_speedup"], r["main"]))
    return out
