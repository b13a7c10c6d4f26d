"""The recovery curves of scripts/benchmarks/recovery_llm.py as a Markdown table and a plot, with
the extrapolation of each curve to a larger token budget (stated as such wherever it is shown)."""

from __future__ import annotations

import math
from pathlib import Path

import torch


def projection(curve: list[dict], tokens: float) -> float | None:
    """x unpruned at `tokens`, extrapolated: the excess over the unpruned model as a power law of
    the tokens trained, (x - 1) = A t^-k, fitted (least squares in log-log) to the trained points."""
    points = [(r["tokens"], r["x_ppl"] - 1) for r in curve if r["tokens"] > 0 and r["x_ppl"] > 1]
    if len(points) < 2:
        return None
    xs = torch.tensor([math.log(t) for t, _ in points], dtype=torch.float64)
    ys = torch.tensor([math.log(e) for _, e in points], dtype=torch.float64)
    slope = float(((xs - xs.mean()) * (ys - ys.mean())).sum() / ((xs - xs.mean()) ** 2).sum())
    return 1 + math.exp(float(ys.mean()) + slope * (math.log(tokens) - float(xs.mean())))


def curves(rows: list[dict]) -> dict[tuple[float, str, str], list[dict]]:
    """(target, cut label, route) -> its points by tokens: the cut itself, then the trained states.
    Rows without a "label" are the default route's cut; a label names another cut of that target."""
    out: dict[tuple[float, str, str], list[dict]] = {}
    for target in sorted({r["target"] for r in rows}, reverse=True):
        for label in dict.fromkeys(r.get("label", "") for r in rows if r["target"] == target):
            ours = [r for r in rows if r["target"] == target and r.get("label", "") == label]
            cut = [r for r in ours if r["route"] == "cut"]
            for route in ("lora", "full"):
                trained = sorted((r for r in ours if r["route"] == route), key=lambda r: r["step"])
                if trained:
                    out[(target, label, route)] = cut + trained
    return out


def _name(target: float, label: str, unit: str = "") -> str:
    """The cut as a table row or a legend names it: `unit` follows the target, the label after."""
    return f"{target:g}{unit} ({label})" if label else f"{target:g}{unit}"


def render(rows: list[dict], project_to: float) -> str:
    """The Markdown table: a row per measured point, and the extrapolation to `project_to` tokens."""
    names = {"lora": "LoRA KD", "full": "full KD"}
    lines = [
        "| cut (FLOPs kept) | recovery | step | tokens | perplexity | x unpruned |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for (target, label, route), points in curves(rows).items():
        cut = _name(target, label)
        for r in points:
            lines.append(
                f"| {cut} | {names[route]} | {r['step']} | {r['tokens']:,} | {r['ppl']:.2f} | {r['x_ppl']:.3f} |"
            )
        guess = projection(points, project_to)
        if guess is not None:
            lines.append(f"| {cut} | {names[route]} | extrapolated | {project_to:,.0f} | | ~{guess:.2f} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path, unpruned: float, project_to: float) -> None:
    import matplotlib  # noqa: PLC0415 (only --plot needs it)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    for (target, label, route), points in curves(rows).items():
        xs = [max(r["tokens"], 1e3) for r in points]  # the cut itself drawn at 1 k on the log axis
        name = f"{_name(target, label, ' of the FLOPs')}, {route} KD"
        line = ax.plot(xs, [r["x_ppl"] for r in points], marker="o", label=name)
        guess = projection(points, project_to)
        if guess is not None:
            ax.plot([xs[-1], project_to], [points[-1]["x_ppl"], guess], ls=":", color=line[0].get_color())
    for goal in (1.1, 1.5):
        ax.axhline(goal, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("tokens trained (the cut itself at 1 k; dotted: extrapolation)")
    ax.set_ylabel(f"perplexity / unpruned ({unpruned:.2f})")
    ax.set_title("SmolLM2-135M: recovery after each cut")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
