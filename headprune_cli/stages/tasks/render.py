"""The `tasks` artifact for people: a Markdown page and a PNG (matplotlib, Agg canvas,
loaded only here; fixed metadata so reruns are byte-identical). Nothing is computed here
that the artifact does not hold."""

from __future__ import annotations

from pathlib import Path

from headprune_cli.errors import UsageError
from headprune_cli.files.io import atomic_write


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.1%}"


def _num(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def markdown(art: dict) -> str:
    budget = art["budget"]
    lines = [
        f"# Tasks from one base ({art['base']['sha256'][:12]}, found as {art['base']['how']})",
        "",
        f"Budget: {budget['option']} {budget['value']:g}. Shared plan: {art['shared']['rule']}.",
        "",
        "| task | objective | heads kept | FFN kept | FLOPs kept | importance kept | shared: FLOPs kept "
        "| shared: importance kept | Jaccard heads own/shared | Jaccard FFN own/shared |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for t in art["tasks"]:
        own, sh = t["own"], t["shared"]
        lines.append(
            f"| {t['name']} | {t['objective']} | {own['heads_kept']} | {own['ffn_kept']} | {_pct(own['flops_kept'])} "
            f"| {_pct(own['importance_kept'])} | {_pct(sh['flops_kept'])} | {_pct(sh['importance_kept'])} "
            f"| {_num(sh['jaccard_heads_with_own'])} | {_num(sh['jaccard_ffn_with_own'])} |"
        )
    lines.append(f"| shared | – | {art['shared']['heads_kept']} | {art['shared']['ffn_kept']} | | | | | | |")
    lines += [
        "",
        "| pair | Spearman heads | Spearman FFN | Jaccard kept heads | Jaccard kept FFN |",
        "|---|---|---|---|---|",
    ]
    for p in art["pairs"]:
        lines.append(
            f"| {p['a']} / {p['b']} | {_num(p['spearman_heads'])} | {_num(p['spearman_ffn'])} "
            f"| {_num(p['jaccard_heads'])} | {_num(p['jaccard_ffn'])} |"
        )
    heads, ffn = art["heads"], art["ffn"]
    lines += ["", f"Heads every task keeps ({heads['every_count']}): {', '.join(heads['every']) or 'none'}", ""]
    for name, units in heads["only"].items():
        lines.append(f"- only {name} keeps ({len(units)}): {', '.join(units) or 'none'}")
    lines += ["", f"FFN neurons every task keeps: {ffn['every_count']}; only one task keeps: "]
    lines[-1] += ", ".join(f"{n} {c}" for n, c in ffn["only_count"].items())
    lines += ["", *head_grid(art), ""]
    return "\n".join(lines)


def head_grid(art: dict) -> list[str]:
    """Per layer and head: how many tasks keep it (their own plans), `*` where the shared plan keeps it."""
    tasks = art["tasks"]
    layers = list(tasks[0]["own"]["heads"])
    width = max(max((h for t in tasks for h in t["own"]["heads"][layer]), default=-1) for layer in layers) + 1
    width = max(width, max((max(v, default=-1) for v in art["shared"]["heads"].values()), default=-1) + 1)
    out = [
        f"Tasks keeping each head (of {len(tasks)}; * = the shared plan keeps it):",
        "",
        "| layer | " + " | ".join(str(h) for h in range(width)) + " |",
        "|---" * (width + 1) + "|",
    ]
    for layer in layers:
        cells = []
        for h in range(width):
            count = sum(h in t["own"]["heads"][layer] for t in tasks)
            cells.append(f"{count}{'*' if h in art['shared']['heads'][layer] else ''}")
        out.append(f"| {layer} | " + " | ".join(cells) + " |")
    return out


def png(art: dict, path: str | Path) -> None:
    """One panel per task's own plan and one for the shared plan (kept heads, layers x heads),
    a panel counting the tasks that keep each head, and FFN neurons kept per layer."""
    try:
        import numpy as np  # noqa: PLC0415 (numpy and matplotlib only when a plot is written)
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415 (matplotlib: an optional extra, loaded for plots only)
        from matplotlib.figure import Figure  # noqa: PLC0415 (matplotlib: an optional extra, loaded for plots only)
    except ImportError:
        raise UsageError("plots need matplotlib: pip install 'headprune[plot]'") from None
    tasks = art["tasks"]
    layers = list(tasks[0]["own"]["heads"])
    width = 1 + max(max((max(v, default=-1) for v in t["own"]["heads"].values()), default=-1) for t in tasks)
    width = max(width, 1 + max((max(v, default=-1) for v in art["shared"]["heads"].values()), default=-1))
    views = [(t["name"], t["own"]["heads"]) for t in tasks] + [("shared plan", art["shared"]["heads"])]
    figure = Figure(figsize=(3.0 * (len(views) + 2), 3.2), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, len(views) + 2)
    for ax, (title, kept) in zip(axes, views, strict=False):
        grid = np.array([[1.0 if h in kept[layer] else 0.0 for h in range(width)] for layer in layers])
        ax.imshow(grid, cmap="Greys", vmin=0, vmax=1, aspect="auto", interpolation="nearest")
        ax.set_title(f"{title}: {int(grid.sum())} heads kept (black)", fontsize=9)
        ax.set_xlabel("head")
        ax.set_xticks(range(width))
        ax.tick_params(axis="x", labelsize=6)
        ax.set_ylabel("layer")
        ax.set_yticks(range(len(layers)), layers)
    count = np.array([[sum(h in t["own"]["heads"][layer] for t in tasks) for h in range(width)] for layer in layers])
    image = axes[-2].imshow(count, cmap="viridis", vmin=0, vmax=len(tasks), aspect="auto", interpolation="nearest")
    axes[-2].set_title("tasks keeping the head", fontsize=9)
    axes[-2].set_yticks(range(len(layers)), layers)
    axes[-2].set_xticks(range(width))
    axes[-2].tick_params(axis="x", labelsize=6)
    axes[-2].set_xlabel("head")
    figure.colorbar(image, ax=axes[-2], ticks=range(len(tasks) + 1))
    step = 0.8 / (len(tasks) + 1)
    for i, (title, ffn) in enumerate(
        [(t["name"], t["own"]["ffn_per_layer"]) for t in tasks] + [("shared", art["shared"]["ffn_per_layer"])]
    ):
        axes[-1].bar(np.arange(len(layers)) + i * step, [ffn[layer] for layer in layers], step, label=title)
    axes[-1].set_xticks(np.arange(len(layers)) + 0.4 - step / 2, layers)
    axes[-1].set_title("FFN neurons kept", fontsize=9)
    axes[-1].set_xlabel("layer")
    axes[-1].legend(fontsize=7)
    atomic_write(path, lambda tmp: figure.savefig(tmp, format="png", metadata={"Software": None}))
