"""What a person reads of a sweep: sweep.md's knees and table, and the points curve.png plots,
for a head-ratio sweep (one curve per method) and a FLOPs sweep (one curve per route and method,
against FLOPs kept and against measured speedup). No torch here."""

from __future__ import annotations

from headprune_cli.stages.report.render import metric_value as fmt


def is_flops_sweep(payload: dict) -> bool:
    return bool(payload.get("budget"))


def markdown(payload: dict) -> str:
    return (_flops_markdown if is_flops_sweep(payload) else _ratio_markdown)(payload)


def _ratio_markdown(result: dict) -> str:
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


def _flops_markdown(payload: dict) -> str:
    main = payload["main_metric"]
    name, unit = main["name"], main["unit"]
    lines = [
        f"## headprune sweep: {name} vs FLOPs kept, per route (budget: drop <= {payload['max_drop']:g} {unit})",
        "",
        f"Baseline {name}: {fmt(name, main['baseline'])}. Fewest FLOPs kept within the budget:",
        "",
    ]
    for route, best in payload["best"].items():
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
    for r in payload["rows"]:
        measured = f"{r['measured_speedup']:.2f}x" if r["measured_speedup"] else "–"
        lines.append(
            f"| {r['method']} | {r['route']} | {r['target_flops']:g} | {r['flops_kept']:.3f} | "
            f"{fmt(name, r['main'])} | {r['drop']:+.3g} | "
            f"{r['predicted_speedup']:.2f}x | {measured} | {'yes' if r['within_budget'] else 'no'} |"
        )
    return "\n".join(lines) + "\n"


def ratio_curves(result: dict) -> dict[str, list[tuple[float, float]]]:
    """Per method: (fraction of heads removed, quality) points, the baseline first."""
    start = result["main_metric"]["baseline"]
    out: dict[str, list[tuple[float, float]]] = {}
    for r in result["rows"]:
        out.setdefault(r["method"], [(0.0, start)]).append((r["fraction_removed"], r["main"]))
    return out


def flops_curves(payload: dict) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """Per route and method: (FLOPs kept, quality) and (measured speedup, quality) points, the baseline included."""
    main = payload["main_metric"]
    out: dict[str, dict[str, list]] = {"flops": {}, "speedup": {}}
    for r in payload["rows"]:
        label = f"{r['route']} ({r['method']})"
        out["flops"].setdefault(label, [(1.0, main["baseline"])]).append((r["flops_kept"], r["main"]))
        if r["measured_speedup"]:
            out["speedup"].setdefault(label, [(1.0, main["baseline"])]).append((r["measured_speedup"], r["main"]))
    return out
