"""`headprune finetune`: recovery training after pruning, with optional distillation."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from headprune_cli.model.checkpoint import load, save
from headprune_cli.data import read_data
from headprune_cli.stages.finetune.distill import load_teacher, resolve_teacher
from headprune_cli.distributed import setup
from headprune_cli.stages.finetune.train import EpochRecord, FinetuneConfig, FinetuneResult, finetune, validate
from headprune_cli.outputs import check_distinct, check_folder, check_output, remove_folder
from headprune_cli.stages.objectives import default_objective, evaluate
from headprune_cli.stages.finetune.losses import check_labels
from headprune_cli.cli.common import Device, console
from headprune_cli.device import check as check_device, dtype_name


def finetune_command(
    checkpoint: Annotated[Path, typer.Argument(help="The (pruned) checkpoint to recover.")],
    data: Annotated[Path, typer.Option("--data", help="Training data (JSONL/CSV/text/safetensors).")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Where to write the recovered checkpoint.")],
    eval_data: Annotated[Path | None, typer.Option("--eval-data", help="Dev set: evaluated every epoch; the best epoch is kept.")] = None,
    teacher: Annotated[str | None, typer.Option("--teacher", help="Distil from this checkpoint, or `auto` = the root model in CKPT's provenance.")] = None,
    epochs: Annotated[int | None, typer.Option("--epochs", help="Passes over the training data (default 1 unless --steps).")] = None,
    steps: Annotated[int | None, typer.Option("--steps", help="Optimizer steps (instead of --epochs).")] = None,
    lr: Annotated[float | None, typer.Option("--lr", help="Peak learning rate (default: about a tenth of the usual fine-tuning rate for the model's size).")] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Rows per micro-batch, over all processes.")] = 16,
    grad_accum: Annotated[int, typer.Option("--grad-accum", min=1, help="Micro-batches per optimizer step.")] = 1,
    warmup: Annotated[float, typer.Option("--warmup", min=0, help="Warmup: a fraction of the steps (<1) or a step count.")] = 0.1,
    kd_weight: Annotated[float | None, typer.Option("--kd-weight", help="Weight a of the distillation term (default 0.5 with a teacher).")] = None,
    kd_temperature: Annotated[float, typer.Option("--kd-temperature", min=0.01, help="Softmax temperature T for distillation.")] = 2.0,
    seed: Annotated[int, typer.Option("--seed", help="Seed for data order and dropout.")] = 0,
    max_length: Annotated[int, typer.Option("--max-length", min=1, help="Truncate sequences to this many tokens.")] = 128,
    state_dir: Annotated[Path | None, typer.Option("--state-dir", help="Training-state folder (default OUT.state); removed after success; a new, empty or headprune-made folder.")] = None,
    save_every: Annotated[int, typer.Option("--save-every", min=1, help="Save the training state every N steps.")] = 50,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the saved training state.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Overwrite OUT if it exists.")] = False,
    device: Device = "auto",
    dtype: Annotated[str, typer.Option("--dtype", help="Training dtype: auto (stored), float32 (float32 master weights for a bf16 model), bfloat16, float16; the output keeps the stored dtype.")] = "auto",
) -> None:
    """Recover quality after pruning: AdamW with warmup and linear decay, on the checkpoint's own objective, optionally distilling from the unpruned model.

    Loss with a teacher: (1 - a) * task + a * T^2 * KL(softmax(teacher/T) || softmax(student/T)); embedding models match the teacher's embeddings (1 - cosine). The output is written atomically at the end; the training state is saved every --save-every steps, and --resume continues from it with the same final weights as an uninterrupted run. Runs unchanged under torchrun (data parallel; --batch-size stays global).

    Examples:

      headprune finetune small.safetensors --data train.jsonl --eval-data dev.jsonl --epochs 3 -o small-ft.safetensors

      headprune finetune small.safetensors --data train.jsonl --teacher auto --kd-weight 0.5 -o small-kd.safetensors

      torchrun --nproc-per-node 2 -m headprune_cli finetune small.safetensors --data train.jsonl --steps 500 -o out.safetensors
    """
    inputs = [checkpoint, data, eval_data, teacher]  # `auto` reaches the root through the checkpoint's provenance
    check_output(output, force, inputs)
    check_device(device, dtype)
    state_dir = check_folder(state_dir or output.with_name(output.name + ".state"), inputs, "--state-dir")
    check_distinct([output, state_dir])  # the state folder is deleted at the end
    model = load(checkpoint)
    teacher_model = _teacher(teacher, checkpoint, model)
    train = read_data(data, model, max_length=max_length, seed=seed)
    dev = read_data(eval_data, model, max_length=max_length) if eval_data is not None else None
    if dev is not None:
        check_labels(model, {"labels": dev.labels} if dev.labels is not None else {}, f"{eval_data}")
    cfg = FinetuneConfig(
        epochs=epochs, steps=steps, lr=lr, batch_size=batch_size, grad_accum=grad_accum, warmup=warmup,
        kd_weight=kd_weight, kd_temperature=kd_temperature, seed=seed, resume=resume, save_every=save_every,
        state_dir=state_dir, device=device, dtype=dtype,
    )
    fingerprint = {"checkpoint": model.headprune.loaded_from[1], "data": str(data), "teacher": teacher, "epochs": epochs, "steps": steps,
                   "dtype": dtype_name(dtype)}  # a saved state resumes only in the dtype it was trained in
    result = run_finetune(model, train, cfg, dev, teacher_model, fingerprint)
    if setup().main:
        save(result.model.to("cpu"), output, overwrite=force)
        remove_folder(cfg.state_dir)
        console.print(f"wrote {output}")
    setup().barrier()


def _teacher(spec: str | None, checkpoint: Path, student):
    path = resolve_teacher(spec, checkpoint)
    return load_teacher(path, student) if path is not None else None


def run_finetune(model, train, cfg: FinetuneConfig, dev=None, teacher=None, fingerprint=None, show: bool = True) -> FinetuneResult:
    """finetune() with a progress bar (loss, lr, metric) and a summary table on stderr.

    The pipeline's finetune stage calls this too."""
    objective = default_objective(model)
    higher = objective != "causal-lm"
    eval_fn = None
    if dev is not None:
        def eval_fn(m):
            return {x.name: x.value for x in evaluate(m, dev, objective, reference=teacher)}
    validate(model, train, cfg, teacher)  # errors before the progress bar appears
    show = show and setup().main
    with _progress(show) as bar:
        task = bar.add_task("finetune", total=None, loss="", metric="")

        def on_step(step, total, loss, rate):
            bar.update(task, completed=step, total=total, loss=f"loss {loss:.4f}  lr {rate:.2e}")

        def on_epoch(record: EpochRecord):
            if record.metrics:
                name, value = next(iter(record.metrics.items()))
                bar.update(task, metric=f"{name} {value:.4f} (epoch {record.epoch})")

        result = finetune(model, train, cfg, eval_fn, higher, teacher, on_step, on_epoch, fingerprint)
    if show:
        console.print(summary_table(result))
    return result


def _progress(show: bool) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[loss]}"), TextColumn("{task.fields[metric]}"), TimeRemainingColumn(),
        console=console, disable=not show, transient=False,
    )


def summary_table(result: FinetuneResult) -> Table:
    names = list(result.history[0].metrics) if result.history and result.history[0].metrics else []
    table = Table(title=f"finetune: {result.steps} steps, lr {result.lr:g}, kd weight {result.kd_weight:g}")
    for column in ["epoch", "step", "train loss", *names, "kept"]:
        table.add_column(column, justify="right")
    for r in result.history:
        loss = "-" if r.train_loss is None else f"{r.train_loss:.4f}"
        kept = "best" if r.epoch == result.best_epoch else ""
        table.add_row(str(r.epoch), str(r.step), loss, *(f"{r.metrics.get(n, float('nan')):.4f}" for n in names), kept)
    return table
