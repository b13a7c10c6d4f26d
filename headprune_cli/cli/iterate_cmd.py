"""`headprune iterate`: gradual pruning with recovery between rounds."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from headprune_cli.model.checkpoint import load, save
from headprune_cli.data import read_data
from headprune_cli.stages.finetune.distill import load_teacher, resolve_teacher
from headprune_cli.errors import UsageError
from headprune_cli.outputs import check_output
from headprune_cli.stages.finetune.train import FinetuneConfig
from headprune_cli.stages.iterative import DEFAULT_SCHEDULE, Round, iterative_prune
from headprune_cli.stages.objectives import check_objective, needs_labels
from headprune_cli.cli.common import console


def iterate(
    checkpoint: Annotated[Path, typer.Argument(help="The model to prune (usually unpruned).")],
    data: Annotated[Path, typer.Option("--data", help="Training data for recovery (and scoring unless --score-data).")],
    eval_data: Annotated[Path, typer.Option("--eval-data", help="Dev set that decides the quality floor.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Where to write the last model above the floor.")],
    schedule: Annotated[str, typer.Option("--schedule", help="Fractions of the ORIGINAL heads removed after each round.")] = ",".join(map(str, DEFAULT_SCHEDULE)),
    method: Annotated[str, typer.Option("--method", help="Scoring method used every round.")] = "taylor",
    score_data: Annotated[Path | None, typer.Option("--score-data", help="Data for scoring (default: --data).")] = None,
    floor: Annotated[float | None, typer.Option("--floor", help="Stop before the dev metric crosses this value.")] = None,
    max_drop: Annotated[float | None, typer.Option("--max-drop", min=0, help="Stop before the dev metric is this much worse than the input's: points for accuracy/F1/fidelity (1.0 = one percentage point, as in `report`), or perplexity.")] = None,
    epochs: Annotated[int, typer.Option("--epochs", min=1, help="Recovery epochs per round.")] = 1,
    lr: Annotated[float | None, typer.Option("--lr", help="Recovery learning rate (default by model size).")] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1)] = 16,
    teacher: Annotated[str | None, typer.Option("--teacher", help="Distil from a checkpoint, or `self` = the input model.")] = None,
    kd_weight: Annotated[float | None, typer.Option("--kd-weight", help="Distillation weight (default 0.5 with a teacher).")] = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    max_length: Annotated[int, typer.Option("--max-length", min=1)] = 128,
    force: Annotated[bool, typer.Option("--force", help="Overwrite OUT if it exists.")] = False,
) -> None:
    """Prune gradually: each round rescores the current model, removes heads up to the next fraction of the original heads, and recovers; stops before the dev metric crosses the floor and writes the last model above it.

    Examples:

      headprune iterate model.safetensors --data train.jsonl --eval-data dev.jsonl --max-drop 1.0 -o small.safetensors

      headprune iterate model.safetensors --data train.jsonl --eval-data dev.jsonl --schedule 0.2,0.4,0.6 --teacher self -o small.safetensors
    """
    ratios = _schedule(schedule)
    check_output(output, force, [checkpoint, data, eval_data, score_data, teacher])
    model = load(checkpoint)
    objective = check_objective(None, model)
    teacher_model = copy.deepcopy(model) if teacher == "self" else None  # the unpruned start; no second load
    if teacher not in (None, "self"):
        teacher_model = load_teacher(resolve_teacher(teacher, checkpoint), model)
    train = read_data(data, model, max_length=max_length, seed=seed)
    dev = read_data(eval_data, model, max_length=max_length)
    calib = read_data(score_data, model, max_length=max_length, need_labels=needs_labels(objective)) if score_data else None
    cfg = FinetuneConfig(epochs=epochs, lr=lr, batch_size=batch_size, kd_weight=kd_weight, seed=seed)
    result = iterative_prune(
        model, train, dev, schedule=ratios, method=method, score_data=calib, objective=objective, floor=floor,
        max_drop=max_drop, finetune_config=cfg, teacher=teacher_model, seed=seed, on_round=_log,
    )
    console.print(_table(result))
    save(result.model, output, overwrite=force)
    console.print(f"wrote {output} ({sum(len(h) for h in result.model.headprune.layout.heads)} heads)")


def _schedule(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--schedule must be comma-separated fractions like 0.1,0.2,0.3 (got {text!r})") from None


def _log(r: Round) -> None:
    verdict = "kept" if r.accepted else "below the floor: stop"
    console.print(f"round {r.ratio:.0%}: {r.heads_kept} heads, {r.metric_pruned:.4f} pruned -> {r.metric_recovered:.4f} recovered ({verdict})")


def _table(result) -> Table:
    table = Table(title=f"iterative pruning ({result.metric_name}; baseline {result.baseline:.4f})")
    for column in ("removed (of original)", "heads", "pruned", "recovered", "accepted"):
        table.add_column(column, justify="right")
    for r in result.rounds:
        table.add_row(f"{r.ratio:.0%}", str(r.heads_kept), f"{r.metric_pruned:.4f}", f"{r.metric_recovered:.4f}", "yes" if r.accepted else "no")
    return table
