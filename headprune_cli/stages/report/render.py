"""Reports for people and CI: rich terminal summary, Markdown, JUnit XML, PNG plots.

Every function takes the report dict (as report.build_report returns it) and produces
text or a file; nothing here computes a number that is not already in the report.
matplotlib is imported lazily, with the non-interactive Agg canvas (no display, no
global backend switch), and only when a plot is asked for.
"""

from __future__ import annotations

from pathlib import Path
from xml.sax.saxutils import quoteattr

from rich.table import Table

from headprune_cli.errors import UsageError
from headprune_cli.files.io import atomic_write, atomic_write_bytes

VERDICT = {"pass": "PASS", "fail": "FAIL", "no-gates": "NO GATES"}
ICON = {"pass": "✅", "fail": "❌", "no-gates": "ℹ️"}


def _num(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}"


def metric_value(name: str, value: float) -> str:
    return (
        f"{value * 100:.2f}%"
        if name in ("accuracy", "macro_f1")
        else f"{value:.4f}"
        if abs(value) < 1e9
        else f"{value:.4g}"
    )  # an overflowed perplexity is 1.798e+308, not 309 digits


def _heads(values: list[int]) -> str:
    return " ".join(str(v) for v in values) if values else "–"


def headline(report: dict) -> str:
    main = report["main_metric"]
    gates = report["gates"]
    failed = [g for g in gates if not g["passed"]]
    parts = [f"{VERDICT[report['verdict']]}"]
    if gates:
        parts.append(f"{len(gates) - len(failed)}/{len(gates)} gates passed")
    parts.append(
        f"{main['name']} {metric_value(main['name'], main['baseline'])} → "
        f"{metric_value(main['name'], main['pruned'])} (drop {main['drop']:+.3g} {main['unit']})"
    )
    parts.append(f"predicted speedup {report['cost']['predicted_speedup']:.2f}x")
    if report["measured"]:
        parts.append(f"measured {report['measured']['speedup']:.2f}x")
    return ", ".join(parts)


# --- Markdown (a GitHub step summary) -----------------------------------------------
def markdown(report: dict) -> str:
    models, main, cost, measured = report["models"], report["main_metric"], report["cost"], report["measured"]
    lines = [f"## headprune report: {ICON[report['verdict']]} {headline(report)}", ""]
    for warning in report["warnings"]:
        lines += [f"> **Warning:** {warning}", ""]
    if report["gates"]:
        lines += ["| gate | threshold | value | result |", "|---|---:|---:|:---:|"]
        for g in report["gates"]:
            lines.append(
                f"| {g['description']} | {g['threshold']:g} | {g['value']:.4g} | "
                f"{'✅ pass' if g['passed'] else '❌ fail'} |"
            )
        lines.append("")
    lines += ["| | baseline | pruned | change |", "|---|---:|---:|---:|"]
    by_name = {m["name"]: m for m in report["metrics"]["baseline"]}
    for m in report["metrics"]["pruned"]:
        if m["name"] in by_name:
            b = by_name[m["name"]]["value"]
            lines.append(
                f"| {m['name']} ({'higher' if m['higher_is_better'] else 'lower'} is better) | "
                f"{metric_value(m['name'], b)} | {metric_value(m['name'], m['value'])} | "
                f"{_change(m['name'], b, m['value'])} |"
            )
    b, p = models["baseline"], models["pruned"]
    lines.append(f"| heads | {b['heads']} | {p['heads']} | {p['heads'] - b['heads']:+d} |")
    lines.append(f"| layers | {b['layers']} | {p['layers']} | {p['layers'] - b['layers']:+d} |")
    lines.append(f"| parameters | {b['params']:,} | {p['params']:,} | {cost['params_ratio'] - 1:+.1%} |")
    lines.append(
        f"| FLOPs per token (seq {cost['seq_len']}) | {_num(b['flops_per_token'])} | "
        f"{_num(p['flops_per_token'])} | {cost['flops_ratio'] - 1:+.1%} |"
    )
    kv = report.get("kv_cache")
    if kv:
        lines.append(
            f"| KV cache per token ({kv['dtype']}) | {kv['baseline']['total']:,} B | "
            f"{kv['pruned']['total']:,} B | {kv['ratio'] - 1:+.1%} |"
        )
    elif "kv_cache" in report:  # reports older than the field say nothing
        lines.append("| KV cache per token | n/a | n/a | encoder: no KV cache |")
    if measured:
        lb, lp = measured["latency_ms"]["baseline"], measured["latency_ms"]["pruned"]
        lines.append(
            f"| latency, median ms (IQR) | {lb['median_ms']:.2f} ({lb['q1_ms']:.2f}–{lb['q3_ms']:.2f}) | "
            f"{lp['median_ms']:.2f} ({lp['q1_ms']:.2f}–{lp['q3_ms']:.2f}) | {measured['speedup']:.2f}x faster |"
        )
    lines += _decode_rows(measured and measured.get("decode"))
    lines += [
        "",
        f"Main metric **{main['name']}**: drop {main['drop']:+.4g} {main['unit']} ({main['rel_drop']:+.2%} relative).",
    ]
    lines.append(
        f"Speedup: predicted from FLOPs **{cost['predicted_speedup']:.2f}x**"
        + (
            f", measured **{measured['speedup']:.2f}x** ({measured['speedup_vs_predicted']:.0%} of "
            f"predicted; batch {measured['batch']}, "
            f"sequence {measured['seq_len']}, {measured['threads']} threads, median of {measured['repeats']} "
            f"interleaved runs after {measured['warmup']} warm-up)."
            if measured
            else " (latency not measured)."
        )
    )
    if report.get("shipped"):
        from headprune_cli.stages.report.shipped import shipped_line  # noqa: PLC0415 (keeps torch out of this module's import)

        lines.append(shipped_line(report["shipped"]))
    if cost.get("latency"):
        from headprune_cli.stages.report.latency_cost import markdown_line  # noqa: PLC0415 (keeps torch out of this module's import)

        lines.append(markdown_line(cost["latency"]))
    if cost.get("decode"):
        lines.append(serving_summary(report))
    widths = any(row.get("ffn") for row in report["head_map"])
    lines += [
        "",
        "<details><summary>Head map (original indices)</summary>",
        "",
        "| layer | kept | removed |" + (" FFN width |" if widths else ""),
        "|---:|---|---|" + ("---:|" if widths else ""),
    ]
    for row in report["head_map"]:
        kept = "layer removed" if row["layer_removed"] else _heads(row["kept"])
        lines.append(
            f"| {row['layer']} | {kept} | {_heads(row['removed'])} |" + (f" {_width(row)} |" if widths else "")
        )
    lines += ["", "</details>", ""]
    lines.append(
        f"Baseline `{b['path']}` ({b['sha256'][:12]}), "
        f"pruned `{p['path']}` ({p['sha256'][:12]}); {report['lineage']['how']}."
    )
    return "\n".join(lines) + "\n"


def _decode_rows(decode: dict | None) -> list[str]:
    if not decode:
        return []
    pb, pp = decode["prefill_ms"]["baseline"], decode["prefill_ms"]["pruned"]
    tb, tp = decode["decode_tokens_per_s"]["baseline"], decode["decode_tokens_per_s"]["pruned"]
    return [
        f"| prefill ms, batch {decode['batch']} x {decode['prompt']} tokens (IQR) | "
        f"{pb['median_ms']:.2f} ({pb['q1_ms']:.2f}–{pb['q3_ms']:.2f}) | "
        f"{pp['median_ms']:.2f} ({pp['q1_ms']:.2f}–{pp['q3_ms']:.2f}) | {decode['prefill_speedup']:.2f}x faster |",
        f"| decode tokens/s, batch {decode['batch']}, {decode['tokens']} tokens | {tb:.1f} | {tp:.1f} | "
        f"{decode['decode_speedup']:.2f}x faster |",
    ]


def _kv_text(kv: dict) -> str:
    return (
        f"KV cache per token {kv['baseline']['total']:,} → {kv['pruned']['total']:,} "
        f"bytes ({kv['dtype']}, {-kv['reduction']:+.1%})"
    )


def serving_summary(report: dict) -> str:
    """One sentence: KV cache change, prefill and decode speedup, each predicted and measured."""
    kv, predicted = report.get("kv_cache"), report["cost"]["decode"]
    measured = (report["measured"] or {}).get("decode")
    parts = [_kv_text(kv)] if kv else []
    for phase, basis in (("prefill", "FLOPs"), ("decode", "bytes read per token")):
        text = f"{phase} predicted {predicted[f'predicted_{phase}_speedup']:.2f}x ({basis})"
        if measured:
            text += f", measured {measured[f'{phase}_speedup']:.2f}x"
        parts.append(text)
    setting = f"batch {predicted['batch']}, {predicted['tokens']} tokens after a {predicted['prompt']}-token prompt"
    return "Serving: " + "; ".join(parts) + f" ({setting}" + ("" if measured else ", not measured") + ")."


def _change(name: str, base: float, new: float) -> str:
    if name in ("accuracy", "macro_f1", "fidelity"):
        return f"{(new - base) * 100:+.2f} pts"
    return f"{new - base:+.4g}"


# --- JUnit XML ----------------------------------------------------------------------
def junit(report: dict) -> str:
    """One <testcase> per gate, so CI test views show which budget failed and by how much."""
    gates = report["gates"]
    failures = sum(not g["passed"] for g in gates)
    out = ['<?xml version="1.0" encoding="UTF-8"?>']
    out.append(f'<testsuites name="headprune" tests="{len(gates)}" failures="{failures}">')
    out.append(
        f'  <testsuite name="headprune.report" tests="{len(gates)}" failures="{failures}" errors="0" skipped="0">'
    )
    for g in gates:
        attrs = f'classname="headprune.report" name={quoteattr(g["name"] + ": " + g["description"])}'
        if g["passed"]:
            out.append(f"    <testcase {attrs}/>")
        else:
            message = f"{g['description']} failed: value {g['value']:.6g}, threshold {g['threshold']:g}"
            out.append(f"    <testcase {attrs}>")
            out.append(f'      <failure message={quoteattr(message)} type="GateFailed"/>')
            out.append("    </testcase>")
    out += ["  </testsuite>", "</testsuites>"]
    return "\n".join(out) + "\n"


# --- terminal -----------------------------------------------------------------------
def terminal(report: dict, console) -> None:

    style = {"pass": "bold green", "fail": "bold red", "no-gates": "bold"}[report["verdict"]]
    console.print(f"[{style}]{headline(report)}[/]", highlight=False, soft_wrap=True)
    for warning in report["warnings"]:
        console.print(f"[yellow]warning:[/] {warning}", highlight=False, soft_wrap=True)
    for g in report["gates"]:
        mark = "[green]pass[/]" if g["passed"] else "[red]FAIL[/]"
        console.print(f"  {mark} {g['description']} (value {g['value']:.4g})", highlight=False, soft_wrap=True)
    if report.get("shipped"):
        from headprune_cli.stages.report.shipped import shipped_line  # noqa: PLC0415 (keeps torch out of this module's import)

        console.print(shipped_line(report["shipped"]), highlight=False, soft_wrap=True, markup=False)
    if report["cost"].get("decode"):
        console.print(serving_summary(report), highlight=False, soft_wrap=True)
    elif report.get("kv_cache"):
        console.print(_kv_text(report["kv_cache"]), highlight=False, soft_wrap=True)
    else:
        console.print("KV cache: n/a (an encoder keeps no KV cache)", highlight=False, soft_wrap=True)
    table = Table(title="head map (original indices)")
    table.add_column("layer", justify="right")
    table.add_column("kept")
    table.add_column("removed", style="red")
    widths = any(row.get("ffn") for row in report["head_map"])
    if widths:
        table.add_column("FFN width", justify="right")
    for row in report["head_map"]:
        cells = [
            str(row["layer"]),
            "layer removed" if row["layer_removed"] else _heads(row["kept"]),
            _heads(row["removed"]),
        ]
        table.add_row(*cells, *([_width(row)] if widths else []))
    console.print(table)


def _width(row: dict) -> str:
    """FFN neurons kept of the original width ('-' for a dropped layer, the full width when uncut)."""
    return f"{row['ffn']['kept']}/{row['ffn']['of']}" if row.get("ffn") else ("–" if row["layer_removed"] else "full")


# --- plots --------------------------------------------------------------------------
def _figure(width: float, height: float):
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415 (matplotlib: an optional extra, loaded for plots only)
        from matplotlib.figure import Figure  # noqa: PLC0415 (matplotlib: an optional extra, loaded for plots only)
    except ImportError:
        raise UsageError("plots need matplotlib: pip install 'headprune[plot]'") from None

    figure = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _save_png(figure, path: str | Path) -> None:
    # Fixed metadata keeps reruns byte-identical (matplotlib would stamp its version).
    atomic_write(path, lambda tmp: figure.savefig(tmp, format="png", metadata={"Software": None}))


def head_map_png(report: dict, path: str | Path) -> None:
    """Importance (when scores were given) per layer x head; removed heads crossed out."""
    import numpy as np  # noqa: PLC0415 (keeps numpy out of this module's import)

    rows = report["head_map"]
    width = max(r["num_heads"] for r in rows)
    has_scores = any(r["scores"] for r in rows)
    grid = np.full((len(rows), width), np.nan)
    for r in rows:
        for h in range(r["num_heads"]):
            if has_scores:
                score = (r["scores"] or {}).get(str(h), (r["scores"] or {}).get(h))
                grid[r["layer"], h] = np.nan if score is None else score
            else:
                grid[r["layer"], h] = 1.0 if h in r["kept"] else 0.0
    figure = _figure(max(5.0, 0.45 * width + 3), max(3.5, 0.35 * len(rows) + 2))
    ax = figure.add_subplot()
    image = ax.imshow(grid, aspect="auto", cmap="viridis" if has_scores else "Greys_r", interpolation="nearest")
    if has_scores:
        figure.colorbar(image, ax=ax, label="importance")
    for r in rows:
        for h in r["removed"]:
            ax.text(h, r["layer"], "×", ha="center", va="center", color="red", fontsize=12, fontweight="bold")
    ax.set_xticks(range(width))
    ax.set_yticks(range(len(rows)))
    ax.set_xlabel("head (original index)")
    ax.set_ylabel("layer (original index)")
    ax.set_title("head importance (× = removed)" if has_scores else "heads kept (white), removed (×)", fontsize=10)
    _save_png(figure, path)


def curve_png(
    curves: dict[str, list[tuple[float, float]]], metric: str, path: str | Path, budget: float | None = None
) -> None:
    """Quality versus fraction of heads removed, one line per method (sweep)."""
    figure = _figure(6.0, 4.0)
    ax = figure.add_subplot()
    for method, points in sorted(curves.items()):
        xs, ys = zip(*sorted(points)) if points else ((), ())
        ax.plot([x * 100 for x in xs], ys, marker="o", label=method)
    if budget is not None:
        ax.axhline(budget, color="grey", linestyle="--", linewidth=1, label="budget")
    ax.set_xlabel("heads removed (%)")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} vs heads removed (no finetuning)", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend()
    _save_png(figure, path)


def budget_curves_png(
    curves: dict[str, dict[str, list[tuple[float, float]]]], metric: str, path: str | Path, budget: float | None = None
) -> None:
    """Quality against FLOPs kept and against measured speedup, one line per route (sweep --target-flops)."""
    panels = [("flops", "FLOPs kept (%)", 100.0)] + (
        [("speedup", "measured speedup (x)", 1.0)] if curves["speedup"] else []
    )
    figure = _figure(6.0 * len(panels), 4.0)
    for i, (key, label, scale) in enumerate(panels, start=1):
        ax = figure.add_subplot(1, len(panels), i)
        for route, points in sorted(curves[key].items()):
            xs, ys = zip(*sorted(points))
            ax.plot([x * scale for x in xs], ys, marker="o", label=route)
        if budget is not None:
            ax.axhline(budget, color="grey", linestyle="--", linewidth=1, label="budget")
        if key == "flops":
            ax.invert_xaxis()  # left to right: smaller models
        ax.set_xlabel(label)
        ax.set_ylabel(metric)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    figure.suptitle(f"{metric} per route (no finetuning)", fontsize=10)
    _save_png(figure, path)


def write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())
