"""What `finetune` and `learn` do around the training loop, written once for both.

The teacher, the learning rate (LoRA's own default), the adapters attached and merged, the
data read, the loop's settings from the options, and the display while it trains: a progress
bar (loss, lr, metric) and a summary table on the context's console (stderr). Each stage's
`run` calls these in the same order, so a seed gives the same draws in either.
torch loads inside the functions: the stages' options are read without it.
"""

from __future__ import annotations

from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from headprune_cli.stages.options import RecoveryOptions, TrainingOptions
from headprune_cli.stages.unit import Context


def teacher_of(spec: str | None, checkpoint: Path, student, root_teaches_itself: bool = False):
    """The teacher model `--teacher` names (None without one); a causal LM's streamed: its blocks
    are read per forward, so distilling holds the student and about one teacher block."""
    from headprune_cli.stages.training.distill import load_teacher, resolve_teacher  # noqa: PLC0415 (keeps numpy, torch, transformers out of this module's import)

    path = resolve_teacher(spec, checkpoint, root_teaches_itself)
    return load_teacher(path, student, streamed=True) if path is not None else None


def chosen_lr(opts, model) -> float | None:
    """--lr; else with --lora, LORA_LR_FACTOR x full training's default (adapters start at zero
    and move a few parameters, so they take larger steps); else None: train.py's default_lr."""
    if opts.lr is not None or not opts.lora:
        return opts.lr
    from headprune_cli.stages.training.lora import LORA_LR_FACTOR  # noqa: PLC0415 (keeps torch, transformers out of this module's import)
    from headprune_cli.stages.training.train import default_lr  # noqa: PLC0415 (keeps torch, transformers out of this module's import)

    return LORA_LR_FACTOR * default_lr(model)


def attach_lora(opts, model):
    """With --lora: the PeftModel around `model` (adapted in place), else None."""
    if not opts.lora:
        return None
    from headprune_cli.stages.training.lora import attach  # noqa: PLC0415 (keeps torch, transformers out of this module's import)

    return attach(model, opts.lora_spec(), opts.seed)


def merge_lora(adapted, keep_adapter: Path | None, output: Path, ctx: Context):
    """`keep_adapter`'s folder first (rank 0), then the adapters merged into the dense weights."""
    from headprune_cli.runtime.distributed import setup  # noqa: PLC0415 (keeps torch out of this module's import)
    from headprune_cli.stages.training.lora import merge, save_adapter  # noqa: PLC0415 (keeps torch, transformers out of this module's import)

    if keep_adapter is not None and setup().main:
        save_adapter(adapted, keep_adapter)
        ctx.print(f"adapter ready: {keep_adapter} appears with {output}")
    return merge(adapted)


def read_sets(opts, model):
    """(train, dev) of a stage's files and token options: the training rows (in the seed's order
    later) and the dev set, if any."""
    from headprune_cli.data.readers import read_data  # noqa: PLC0415 (keeps torch, transformers out of this module's import)
    from headprune_cli.stages.training.losses import check_labels  # noqa: PLC0415 (keeps torch, transformers out of this module's import)

    train = read_data(opts.data, model, max_length=opts.max_length, seed=opts.seed)
    dev = read_data(opts.eval_data, model, max_length=opts.max_length) if opts.eval_data is not None else None
    if dev is not None:
        check_labels(model, {"labels": dev.labels} if dev.labels is not None else {}, f"{opts.eval_data}")
    return train, dev


def loop_config(opts: TrainingOptions, lr: float | None, hidden_weight: float) -> RecoveryOptions:
    """What the loop reads, from a stage's TrainingOptions field by field (their names are the
    loop's), with the defaults that depend on the model resolved; no resumable state."""
    values = {name: getattr(opts, name) for name in TrainingOptions.model_fields}
    return RecoveryOptions.model_validate({**values, "lr": lr, "hidden_weight": hidden_weight})


def run_training(
    model,
    train,
    cfg,
    dev=None,
    teacher=None,
    fingerprint=None,
    ctx: Context | None = None,
    gating=None,
    name="finetune",
):
    """train.finetune() on the model's own objective, evaluated on `dev` after every epoch,
    with a progress bar and a summary table titled `name` on `ctx`'s console (the main process
    only; no bar when ctx.progress is False). Returns the FinetuneResult."""
    from headprune_cli.runtime.distributed import setup  # noqa: PLC0415 (keeps torch out of this module's import)
    from headprune_cli.stages.objectives import default_objective, evaluate  # noqa: PLC0415 (keeps torch, transformers out of this module's import)
    from headprune_cli.stages.training.train import finetune, validate  # noqa: PLC0415 (keeps numpy, safetensors, torch, transformers out of this module's import)

    ctx = ctx or Context()
    objective = default_objective(model)
    eval_fn = None
    if dev is not None:

        def eval_fn(m):
            return {x.name: x.value for x in evaluate(m, dev, objective, reference=teacher)}

    validate(model, train, cfg, teacher)  # errors before the progress bar appears
    main = setup().main
    with _progress(ctx.console, show=main and ctx.progress) as bar:
        task = bar.add_task(name, total=None, loss="", metric="")

        def on_step(step, total, loss, rate):
            bar.update(task, completed=step, total=total, loss=f"loss {loss:.4f}  lr {rate:.2e}")

        def on_epoch(record):
            if record.metrics:
                name, value = next(iter(record.metrics.items()))
                bar.update(task, metric=f"{name} {value:.4f} (epoch {record.epoch})")

        # The direction of the first metric (which epoch is best) comes from its name.
        result = finetune(
            model,
            train,
            cfg,
            eval_fn,
            teacher=teacher,
            on_step=on_step,
            on_epoch=on_epoch,
            fingerprint=fingerprint,
            gating=gating,
        )
    if main:
        ctx.print(summary_table(result, name))
    return result


class _LazyProgress(Progress):
    """A bar drawn from its first update on: a refusal before training starts (a resume state
    saved under other settings) stays the one `Error:` line on stderr."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        if self.live.is_started:  # stopping prints a newline on a non-terminal stderr
            self.stop()

    def update(self, *args, **kwargs) -> None:
        if not self.live.is_started and not self.disable:
            self.start()
        super().update(*args, **kwargs)

    def refresh(self) -> None:
        if self.live.is_started:  # before, a refresh would print an empty line
            super().refresh()


def _progress(console, show: bool):

    return _LazyProgress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[loss]}"),
        TextColumn("{task.fields[metric]}"),
        TimeRemainingColumn(),
        console=console,
        disable=not show,
        transient=False,
    )


def summary_table(result, name: str = "finetune"):
    """Epoch, step, train loss, the dev metrics and which epoch was kept, as a rich Table."""

    names = list(result.history[0].metrics) if result.history and result.history[0].metrics else []
    table = Table(title=f"{name}: {result.steps} steps, lr {result.lr:g}, kd weight {result.kd_weight:g}")
    for column in ["epoch", "step", "train loss", *names, "kept"]:
        table.add_column(column, justify="right")
    for r in result.history:
        loss = "-" if r.train_loss is None else f"{r.train_loss:.4f}"
        kept = "best" if r.epoch == result.best_epoch else ""
        table.add_row(str(r.epoch), str(r.step), loss, *(f"{r.metrics.get(n, float('nan')):.4f}" for n in names), kept)
    return table
