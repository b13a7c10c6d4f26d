"""The `iterate` stage: gradual pruning with recovery between rounds (stages/iterative.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from headprune_cli.outputs import check_output
from headprune_cli.stages.unit import Context, Options, Result, Stage, comma_list, option

DEFAULT_SCHEDULE = (0.1, 0.2, 0.3, 0.4)


class IterateOptions(Options):
    checkpoint: Path = option(..., "The model to prune (usually unpruned).", argument=True)
    data: Path = option(..., "Training data for recovery (and scoring unless --score-data).")
    eval_data: Path = option(..., "Dev set that decides the quality floor.")
    output: Path = option(..., "Where to write the last model above the floor.", "-o", "--output")
    schedule: str = option(",".join(map(str, DEFAULT_SCHEDULE)), "Fractions of the ORIGINAL heads removed after each round.")
    method: str = option("taylor", "Scoring method used every round.")
    score_data: Optional[Path] = option(None, "Data for scoring (default: --data).")
    floor: Optional[float] = option(None, "Stop before the dev metric crosses this value.")
    max_drop: Optional[float] = option(None, "Stop before the dev metric is this much worse than the input's: points for accuracy/F1/fidelity (1.0 = one percentage point, as in `report`), or perplexity.", ge=0)
    epochs: int = option(1, "Recovery epochs per round.", ge=1)
    lr: Optional[float] = option(None, "Recovery learning rate (default by model size).")
    batch_size: int = option(16, "", ge=1)
    teacher: Optional[str] = option(None, "Distil from a checkpoint, or `self` = the input model.")
    kd_weight: Optional[float] = option(None, "Distillation weight (default 0.5 with a teacher).")
    seed: int = option(0, "")
    max_length: int = option(128, "", ge=1)
    force: bool = option(False, "Overwrite OUT if it exists.")

    def ratios(self) -> list[float]:
        from headprune_cli.stages.iterative import check_schedule

        ratios = comma_list(self.schedule, float, "--schedule")
        check_schedule(ratios)
        return ratios


def run(opts: IterateOptions, ctx: Context) -> Result:
    import copy

    from headprune_cli.data import read_data
    from headprune_cli.model.checkpoint import load, save
    from headprune_cli.stages.finetune.distill import load_teacher, resolve_teacher
    from headprune_cli.stages.finetune.train import FinetuneConfig
    from headprune_cli.stages.iterative import iterative_prune
    from headprune_cli.stages.objectives import check_objective, needs_labels

    ratios = opts.ratios()
    check_output(opts.output, opts.force, [opts.checkpoint, opts.data, opts.eval_data, opts.score_data, opts.teacher])
    model = load(opts.checkpoint)
    objective = check_objective(None, model)
    teacher = copy.deepcopy(model) if opts.teacher == "self" else None  # the unpruned start; no second load
    if opts.teacher not in (None, "self"):
        teacher = load_teacher(resolve_teacher(opts.teacher, opts.checkpoint), model)
    train = read_data(opts.data, model, max_length=opts.max_length, seed=opts.seed)
    dev = read_data(opts.eval_data, model, max_length=opts.max_length)
    calib = read_data(opts.score_data, model, max_length=opts.max_length, need_labels=needs_labels(objective)) if opts.score_data else None
    cfg = FinetuneConfig(epochs=opts.epochs, lr=opts.lr, batch_size=opts.batch_size, kd_weight=opts.kd_weight, seed=opts.seed)
    result = iterative_prune(
        model, train, dev, schedule=ratios, method=opts.method, score_data=calib, objective=objective, floor=opts.floor,
        max_drop=opts.max_drop, finetune_config=cfg, teacher=teacher, seed=opts.seed, on_round=lambda r: ctx.print(_line(r)),
    )
    ctx.print(_table(result))
    save(result.model, opts.output, overwrite=opts.force)
    ctx.print(f"wrote {opts.output} ({sum(len(h) for h in result.model.headprune.layout.heads)} heads)")
    return Result([str(opts.output)], value=result)


def _line(r) -> str:
    verdict = "kept" if r.accepted else "below the floor: stop"
    return f"round {r.ratio:.0%}: {r.heads_kept} heads, {r.metric_pruned:.4f} pruned -> {r.metric_recovered:.4f} recovered ({verdict})"


def _table(result):
    from rich.table import Table

    table = Table(title=f"iterative pruning ({result.metric_name}; baseline {result.baseline:.4f})")
    for column in ("removed (of original)", "heads", "pruned", "recovered", "accepted"):
        table.add_column(column, justify="right")
    for r in result.rounds:
        table.add_row(f"{r.ratio:.0%}", str(r.heads_kept), f"{r.metric_pruned:.4f}", f"{r.metric_recovered:.4f}", "yes" if r.accepted else "no")
    return table


STAGE = Stage(
    "iterate", IterateOptions, run, stem="iterated",
    # rescore -> prune -> recover per step of a schedule of ratios
    inputs={"checkpoint": ("model",), "data": ("train_data",), "eval_data": ("eval_data",), "score_data": ("data",)},
    outputs={"output": "{stem}.safetensors"}, makes={"model": "output"}, needs=("checkpoint", "data", "eval_data"),
)
