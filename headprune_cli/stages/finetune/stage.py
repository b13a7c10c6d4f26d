"""The `finetune` stage: a (pruned) checkpoint -> a recovered checkpoint.

The options, what the stage checks before the slow parts, and the display while it
trains: a progress bar (loss, lr, metric) and a summary table on the context's console
(stderr), so that `headprune finetune` and a pipeline's finetune stage show the same.
torch and the checkpoint code load inside `run`: the options are read without them.
"""

from __future__ import annotations

from pathlib import Path

from headprune_cli.device import DEVICE_HELP, check as check_device, dtype_name
from headprune_cli.outputs import check_distinct, check_folder, check_output, remove_folder
from headprune_cli.stages.unit import Context, Options, Result, Stage, option


class FinetuneOptions(Options):
    checkpoint: Path = option(..., "The (pruned) checkpoint to recover.", argument=True)
    data: Path = option(..., "Training data (JSONL/CSV/text/safetensors).")
    output: Path = option(..., "Where to write the recovered checkpoint.", "-o", "--output")
    eval_data: Path | None = option(None, "Dev set: evaluated every epoch; the best epoch is kept.")
    teacher: str | None = option(None, "Distil from this checkpoint, or `auto` = the root model in CKPT's provenance.")
    epochs: int | None = option(None, "Passes over the training data (default 1 unless --steps).")
    steps: int | None = option(None, "Optimizer steps (instead of --epochs).")
    lr: float | None = option(None, "Peak learning rate (default: about a tenth of the usual fine-tuning rate for the model's size).")
    batch_size: int = option(16, "Rows per micro-batch, over all processes.", ge=1)
    grad_accum: int = option(1, "Micro-batches per optimizer step.", ge=1)
    warmup: float = option(0.1, "Warmup: a fraction of the steps (<1) or a step count.", ge=0)
    kd_weight: float | None = option(None, "Weight a of the distillation term (default 0.5 with a teacher).")
    kd_temperature: float = option(2.0, "Softmax temperature T for distillation.", ge=0.01)
    seed: int = option(0, "Seed for data order and dropout.")
    max_length: int = option(128, "Truncate sequences to this many tokens.", ge=1)
    state_dir: Path | None = option(
        None, "Training-state folder (default OUT.state); removed after success; a new, empty or headprune-made folder.", folder=True,
    )
    save_every: int = option(50, "Save the training state every N steps.", ge=1)
    resume: bool = option(False, "Continue from the saved training state.")
    force: bool = option(False, "Overwrite OUT if it exists.")
    device: str = option("auto", DEVICE_HELP)
    dtype: str = option(
        "auto", "Training dtype: auto (stored), float32 (float32 master weights for a bf16 model), bfloat16, float16; the output keeps the stored dtype.",
    )


def run(opts: FinetuneOptions, ctx: Context) -> Result:
    from headprune_cli.data import read_data
    from headprune_cli.distributed import setup
    from headprune_cli.model.checkpoint import load, save
    from headprune_cli.stages.finetune.losses import check_labels
    from headprune_cli.stages.finetune.train import FinetuneConfig

    inputs = [opts.checkpoint, opts.data, opts.eval_data, opts.teacher]  # `auto` reaches the root through the checkpoint's provenance
    check_output(opts.output, opts.force, inputs)
    check_device(opts.device, opts.dtype)
    state_dir = check_folder(opts.state_dir or opts.output.with_name(opts.output.name + ".state"), inputs, "--state-dir")
    check_distinct([opts.output, state_dir])  # the state folder is deleted at the end
    model = load(opts.checkpoint)
    teacher = _teacher(opts.teacher, opts.checkpoint, model)
    train = read_data(opts.data, model, max_length=opts.max_length, seed=opts.seed)
    dev = read_data(opts.eval_data, model, max_length=opts.max_length) if opts.eval_data is not None else None
    if dev is not None:
        check_labels(model, {"labels": dev.labels} if dev.labels is not None else {}, f"{opts.eval_data}")
    cfg = FinetuneConfig(
        epochs=opts.epochs, steps=opts.steps, lr=opts.lr, batch_size=opts.batch_size, grad_accum=opts.grad_accum,
        warmup=opts.warmup, kd_weight=opts.kd_weight, kd_temperature=opts.kd_temperature, seed=opts.seed,
        resume=opts.resume, save_every=opts.save_every, state_dir=state_dir, device=opts.device, dtype=opts.dtype,
    )
    fingerprint = {"checkpoint": model.headprune.loaded_from[1], "data": str(opts.data), "teacher": opts.teacher,
                   "epochs": opts.epochs, "steps": opts.steps,
                   "dtype": dtype_name(opts.dtype)}  # a saved state resumes only in the dtype it was trained in
    result = run_finetune(model, train, cfg, dev, teacher, fingerprint, ctx)
    if setup().main:
        save(result.model.to("cpu"), opts.output, overwrite=opts.force)
        remove_folder(cfg.state_dir)
        ctx.print(f"wrote {opts.output}")
    setup().barrier()
    return Result([str(opts.output)], value=result)


def _teacher(spec: str | None, checkpoint: Path, student):
    from headprune_cli.stages.finetune.distill import load_teacher, resolve_teacher

    path = resolve_teacher(spec, checkpoint)
    return load_teacher(path, student) if path is not None else None


def run_finetune(model, train, cfg, dev=None, teacher=None, fingerprint=None, ctx: Context | None = None):
    """finetune() on the model's own objective, evaluated on `dev` after every epoch,
    with a progress bar and a summary table on `ctx`'s console (the main process only;
    no bar when ctx.progress is False). Returns the FinetuneResult."""
    from headprune_cli.distributed import setup
    from headprune_cli.stages.finetune.train import finetune, validate
    from headprune_cli.stages.objectives import default_objective, evaluate

    ctx = ctx or Context()
    objective = default_objective(model)
    eval_fn = None
    if dev is not None:
        def eval_fn(m):
            return {x.name: x.value for x in evaluate(m, dev, objective, reference=teacher)}
    validate(model, train, cfg, teacher)  # errors before the progress bar appears
    main = setup().main
    with _progress(ctx.console, show=main and ctx.progress) as bar:
        task = bar.add_task("finetune", total=None, loss="", metric="")

        def on_step(step, total, loss, rate):
            bar.update(task, completed=step, total=total, loss=f"loss {loss:.4f}  lr {rate:.2e}")

        def on_epoch(record):
            if record.metrics:
                name, value = next(iter(record.metrics.items()))
                bar.update(task, metric=f"{name} {value:.4f} (epoch {record.epoch})")

        # The direction of the first metric (which epoch is best) comes from its name.
        result = finetune(model, train, cfg, eval_fn, teacher=teacher, on_step=on_step, on_epoch=on_epoch, fingerprint=fingerprint)
    if main:
        ctx.print(summary_table(result))
    return result


def _progress(console, show: bool):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[loss]}"), TextColumn("{task.fields[metric]}"), TimeRemainingColumn(),
        console=console, disable=not show, transient=False,
    )


def summary_table(result):
    """Epoch, step, train loss, the dev metrics and which epoch was kept, as a rich Table."""
    from rich.table import Table

    names = list(result.history[0].metrics) if result.history and result.history[0].metrics else []
    table = Table(title=f"finetune: {result.steps} steps, lr {result.lr:g}, kd weight {result.kd_weight:g}")
    for column in ["epoch", "step", "train loss", *names, "kept"]:
        table.add_column(column, justify="right")
    for r in result.history:
        loss = "-" if r.train_loss is None else f"{r.train_loss:.4f}"
        kept = "best" if r.epoch == result.best_epoch else ""
        table.add_row(str(r.epoch), str(r.step), loss, *(f"{r.metrics.get(n, float('nan')):.4f}" for n in names), kept)
    return table


STAGE = Stage(
    "finetune", FinetuneOptions, run, stem="finetuned",
    inputs={"checkpoint": ("model",), "data": ("train_data",), "eval_data": ("eval_data",)},
    outputs={"output": "{stem}.safetensors"}, makes={"model": "output"}, needs=("checkpoint", "data"),
)
